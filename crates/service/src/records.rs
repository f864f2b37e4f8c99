//! What the server writes down about each live sandbox, so a server that
//! starts after a crash or an upgrade can adopt it (docs/state.md#restarts):
//! one JSON file per sandbox id under `<state>/sandboxes/`, replaced
//! atomically whenever what it says changes (create, fork, restore, merge,
//! egress), removed when the id goes away.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::sandbox::{KeptSettings, SandboxEntry, Settings};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxRecord {
    pub id: String,
    /// Where the engine finds its member again.
    pub engine: jail::MemberRecord,
    pub template: String,
    pub ram_mib: u64,
    pub rootfs_gb: u64,
    pub timeout_ms: u64,
    pub idle_timeout_ms: u64,
    pub interrupt_grace_ms: u64,
    /// The policy asked for at create, and the one in force now.
    pub egress_asked: protocol::Egress,
    pub egress: protocol::Egress,
    pub persistent: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_processes: bool,
    pub lineage: Vec<String>,
    pub created_at: u64,
    pub execs: u64,
    pub repl_restarts: u64,
    /// The API key that owns it (src/keys.rs). Records written before keys
    /// had owners have none: such a sandbox is reachable only on a server
    /// without keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Environment, metadata, `autoPause`, public ports (E2B's).
    #[serde(flatten)]
    pub kept: KeptSettings,
    /// A freeze paused it and had not ended: an adopting server lets it
    /// run again (a crash must not leave it paused).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub freezing: bool,
    /// When its lifetime ends, unix ms (older records: `created_at + timeout_ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
}

impl SandboxRecord {
    pub fn of(entry: &SandboxEntry) -> SandboxRecord {
        let s = &entry.settings;
        SandboxRecord {
            id: entry.id.clone(),
            engine: entry.engine.record(),
            template: s.template.clone(),
            ram_mib: s.ram_mib,
            rootfs_gb: s.rootfs_gb,
            timeout_ms: s.timeout.as_millis() as u64,
            idle_timeout_ms: s.idle_timeout.as_millis() as u64,
            interrupt_grace_ms: s.interrupt_grace.as_millis() as u64,
            egress_asked: s.egress.clone(),
            egress: entry.egress.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            persistent: s.persistent,
            keep_processes: s.keep_processes,
            lineage: entry.lineage.lock().map(|l| l.clone()).unwrap_or_default(),
            created_at: entry.created_at,
            execs: entry.execs.load(std::sync::atomic::Ordering::Relaxed),
            repl_restarts: entry.repl_restarts.load(std::sync::atomic::Ordering::Relaxed),
            owner: s.owner.clone(),
            kept: KeptSettings::of(s),
            freezing: entry.freezing.load(std::sync::atomic::Ordering::SeqCst),
            expires_at: Some(entry.expires_at()),
        }
    }

    /// Its settings, with this server's `setup`.
    pub fn settings(&self, setup: &std::sync::Arc<crate::setup::SandboxSetup>) -> Settings {
        self.kept.clone().apply(Settings {
            template: self.template.clone(),
            ram_mib: self.ram_mib,
            rootfs_gb: self.rootfs_gb,
            timeout: Duration::from_millis(self.timeout_ms),
            idle_timeout: Duration::from_millis(self.idle_timeout_ms),
            interrupt_grace: Duration::from_millis(self.interrupt_grace_ms),
            egress: self.egress_asked.clone(),
            persistent: self.persistent,
            keep_processes: self.keep_processes,
            owner: self.owner.clone(),
            setup: std::sync::Arc::clone(setup),
            env: Vec::new(),
            metadata: Default::default(),
            pause_at_timeout: false,
            public_ports: false,
        })
    }
}

/// The records of one state directory.
#[derive(Clone)]
pub struct Records {
    dir: PathBuf,
}

impl Records {
    pub fn new(state_dir: &Path) -> Records {
        Records { dir: state_dir.join("sandboxes") }
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Write `entry`'s record (a temp file renamed over the old one: a
    /// crash leaves the old record or the new, never half of one). No
    /// fsync: a machine crash takes the sandboxes with it anyway.
    pub fn save(&self, entry: &SandboxEntry) {
        if entry.is_destroyed() {
            return;
        }
        let record = SandboxRecord::of(entry);
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(&self.dir)?;
            let tmp = self.dir.join(format!(".{}.tmp", record.id));
            std::fs::write(&tmp, serde_json::to_vec(&record)?)?;
            std::fs::rename(&tmp, self.path(&record.id))
        };
        if let Err(e) = write() {
            tracing::warn!(sandbox = %record.id, error = %e, "could not record the sandbox; it will not survive a server restart");
        }
    }

    pub fn remove(&self, id: &str) {
        let _ = std::fs::remove_file(self.path(id));
    }

    /// Every record, oldest sandbox first; unreadable ones are dropped.
    pub fn load(&self) -> Vec<SandboxRecord> {
        let mut out = Vec::new();
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return out };
        for e in entries.flatten() {
            let path = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                let _ = std::fs::remove_file(&path);
                continue;
            }
            match std::fs::read(&path).map_err(|e| e.to_string()).and_then(|b| serde_json::from_slice::<SandboxRecord>(&b).map_err(|e| e.to_string())) {
                Ok(r) if format!("{}.json", r.id) == name => out.push(r),
                Ok(_) | Err(_) => {
                    tracing::warn!(path = %path.display(), "dropping an unreadable sandbox record");
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        out.sort_by_key(|r| r.created_at);
        out
    }
}
