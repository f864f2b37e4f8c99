//! Spaces (docs/state.md): a sandbox frozen to disk and resumed later into
//! a new sandbox, across server restarts.
//!
//! A Space is a directory `<state>/spaces/<space_id>/` holding `upper/`
//! (the sandbox's overlay upper layer: every file it changed, owners
//! relative to its uid range) and `meta.json`. The REPL's state travels as
//! a file inside `upper/` (`/.forkbox-space/state.pkl`, written by
//! repl/space.py before the copy and removed by it after the resume).
//!
//! Crash safety: a freeze writes `.partial-<id>/`, syncs it, and renames it
//! into place, so a Space is either whole or absent; the sandbox is
//! destroyed only after the rename. A resume claims its Space by renaming
//! it to `.resuming-<id>` (so two resumes cannot both get it) and deletes
//! it only once the new sandbox is ready; otherwise it is put back. At
//! start, partials are removed and claimed Spaces put back.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use protocol::{ResumeSpace, SandboxInfo, SpaceInfo, Unsaved};
use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::keys::Caller;
use crate::sandbox::{ReplSlot, SandboxEntry, Settings};
use crate::state::{valid_id, Service};
use repl_host::events::now_ms;

/// The REPL side of a freeze and a thaw.
const SPACE_PY: &str = include_str!("../../../repl/space.py");
/// Where the REPL's state file lives inside the sandbox during a freeze.
const STATE_FILE: &str = "/.forkbox-space/state.pkl";
/// Longest a freeze or thaw of the REPL's globals may take.
pub(crate) const REPL_SAVE_TIMEOUT: Duration = Duration::from_secs(600);

const PARTIAL: &str = ".partial-";
const RESUMING: &str = ".resuming-";
const DELETING: &str = ".deleting-";
/// `.resumed-<space>.json`: which sandbox a consumed Space became, so the
/// frozen sandbox's id answers helpfully (and a late DELETE is harmless).
const RESUMED: &str = ".resumed-";
/// How many consumed Spaces are remembered.
const RESUMED_REMEMBERED: usize = 1000;

/// What became of a frozen sandbox whose Space was resumed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Resumed {
    pub sandbox_id: String,
    pub space_id: String,
    pub resumed_as: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// What a sandbox resumed from a Space starts with.
pub struct SpaceStart {
    /// The Space's files: the upper layer of the sandbox it was.
    pub upper: PathBuf,
    /// The built-in template version that sandbox ran on, if it was one.
    pub rootfs: Option<PathBuf>,
}

/// `meta.json` of a Space.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SpaceMeta {
    #[serde(flatten)]
    pub info: SpaceInfo,
    /// The sandbox as it was when frozen (`state: "frozen"`); its settings
    /// are the resumed sandbox's defaults.
    pub sandbox: SandboxInfo,
    /// The API key that owns it (src/keys.rs); Spaces frozen before keys
    /// had owners have none, and are reachable only without keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The built-in template version (its rootfs) the sandbox ran on: its
    /// files and its pickled REPL are that version's, so it resumes on it
    /// even after the built-in was rebuilt (docs/templates.md#debian).
    /// Spaces frozen before this was kept have none: the current version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<PathBuf>,
}

/// The Spaces directory.
pub struct SpaceStore {
    dir: PathBuf,
}

fn io_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Internal(format!("{what}: {e}"))
}

fn no_space(id: &str) -> Error {
    Error::NotFound(format!("no space `{}`", id.chars().take(80).collect::<String>()))
}

impl SpaceStore {
    pub fn new(state_dir: &Path) -> SpaceStore {
        SpaceStore { dir: state_dir.join("spaces") }
    }

    /// Finish what a crash interrupted: drop half-written Spaces, put back
    /// claimed ones, finish deletions.
    pub fn recover(&self) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        // Root's alone: a Space holds a sandbox's files with their owners
        // and modes (setuid programs included), which no host user may reach.
        std::fs::set_permissions(&self.dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        for entry in std::fs::read_dir(&self.dir)?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if name.starts_with(PARTIAL) || name.starts_with(DELETING) {
                tracing::info!(path = %path.display(), "removing an unfinished space");
                std::fs::remove_dir_all(&path)?;
            } else if let Some(id) = name.strip_prefix(RESUMING) {
                let home = self.dir.join(id);
                if home.exists() {
                    std::fs::remove_dir_all(&path)?;
                } else {
                    tracing::info!(space = %id, "a resume was interrupted: the space is kept");
                    std::fs::rename(&path, &home)?;
                }
            }
        }
        Ok(())
    }

    fn path(&self, id: &str) -> Result<PathBuf, Error> {
        if !valid_id(id) || id.starts_with('.') {
            return Err(Error::Invalid(format!("invalid space id `{}`", id.chars().take(80).collect::<String>())));
        }
        Ok(self.dir.join(id))
    }

    fn read_meta(dir: &Path) -> Option<SpaceMeta> {
        serde_json::from_slice(&std::fs::read(dir.join("meta.json")).ok()?).ok()
    }

    /// Space `id`, if `caller` may use it (another key's is as unknown).
    pub fn get(&self, caller: &Caller, id: &str) -> Result<SpaceMeta, Error> {
        Self::read_meta(&self.path(id)?).filter(|m| caller.may_use(m.owner.as_deref())).ok_or_else(|| no_space(id))
    }

    /// The Spaces `caller` may use, oldest first.
    pub fn list(&self, caller: &Caller) -> Vec<SpaceMeta> {
        let mut all = self.list_all();
        all.retain(|m| caller.may_use(m.owner.as_deref()));
        all
    }

    /// Every whole Space, oldest first.
    pub fn list_all(&self) -> Vec<SpaceMeta> {
        let mut all: Vec<SpaceMeta> = std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .filter_map(|e| Self::read_meta(&e.path()))
            .collect();
        all.sort_by_key(|m| m.info.created_at);
        all
    }

    /// The Space sandbox `id` was frozen into, if it still exists and
    /// `caller` may use it.
    pub fn frozen(&self, caller: &Caller, sandbox_id: &str) -> Option<SpaceMeta> {
        self.list(caller).into_iter().find(|m| m.info.sandbox_id == sandbox_id)
    }

    pub fn delete(&self, caller: &Caller, id: &str) -> Result<(), Error> {
        self.get(caller, id)?;
        let path = self.path(id)?;
        let doomed = self.dir.join(format!("{DELETING}{id}"));
        match std::fs::rename(&path, &doomed) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(no_space(id)),
            Err(e) => return Err(io_err("could not delete the space", e)),
        }
        std::fs::remove_dir_all(&doomed).map_err(|e| io_err("could not delete the space", e))
    }

    /// Take Space `id` for a resume: nobody else can have it until it is
    /// `put_back`.
    fn claim(&self, caller: &Caller, id: &str) -> Result<(SpaceMeta, PathBuf), Error> {
        let path = self.path(id)?;
        let meta = self.get(caller, id)?;
        let claimed = self.dir.join(format!("{RESUMING}{id}"));
        match std::fs::rename(&path, &claimed) {
            Ok(()) => Ok((meta, claimed)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(no_space(id)),
            Err(e) => Err(io_err("could not claim the space", e)),
        }
    }

    /// Remember that Space `meta` became sandbox `new_id`, forgetting the
    /// oldest such notes beyond `RESUMED_REMEMBERED`.
    fn note_resumed(&self, meta: &SpaceMeta, new_id: &str) -> std::io::Result<()> {
        let note = Resumed {
            sandbox_id: meta.info.sandbox_id.clone(),
            space_id: meta.info.space_id.clone(),
            resumed_as: new_id.to_string(),
            owner: meta.owner.clone(),
        };
        std::fs::write(self.dir.join(format!("{RESUMED}{}.json", meta.info.space_id)), serde_json::to_vec(&note).map_err(std::io::Error::other)?)?;
        let mut notes: Vec<(std::time::SystemTime, PathBuf)> = self.notes().filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p))).collect();
        if notes.len() > RESUMED_REMEMBERED {
            notes.sort();
            for (_, p) in &notes[..notes.len() - RESUMED_REMEMBERED] {
                let _ = std::fs::remove_file(p);
            }
        }
        Ok(())
    }

    fn notes(&self) -> impl Iterator<Item = PathBuf> {
        std::fs::read_dir(&self.dir).into_iter().flatten().flatten().filter(|e| e.file_name().to_string_lossy().starts_with(RESUMED)).map(|e| e.path())
    }

    /// What the Space of frozen sandbox `sandbox_id` became, if it was
    /// resumed (and `caller` may know).
    pub fn resumed(&self, caller: &Caller, sandbox_id: &str) -> Option<Resumed> {
        self.notes()
            .filter_map(|p| serde_json::from_slice::<Resumed>(&std::fs::read(p).ok()?).ok())
            .find(|r| r.sandbox_id == sandbox_id && caller.may_use(r.owner.as_deref()))
    }

    fn put_back(&self, id: &str, claimed: &Path) {
        if let Err(e) = std::fs::rename(claimed, self.dir.join(id)) {
            tracing::error!(space = %id, err = %e, "could not put a space back after a failed resume");
        }
    }
}

/// Write `meta` beside the copied layer in `partial`, make everything
/// durable, and move it to `home` in one rename.
fn commit(partial: &Path, home: &Path, meta: &SpaceMeta) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(partial.join("meta.json"))?;
    f.write_all(&serde_json::to_vec_pretty(meta).map_err(std::io::Error::other)?)?;
    // One syncfs for the whole copy (cheaper than fsync per file).
    rustix::fs::syncfs(&f)?;
    drop(f);
    std::fs::rename(partial, home)?;
    let parent = std::fs::File::open(home.parent().unwrap_or(Path::new("/")))?;
    parent.sync_all()
}

fn new_space_id() -> String {
    format!("sp-{}", &crate::state::new_id()[3..])
}

/// The statement that runs repl/space.py in the REPL without touching
/// the user's globals.
pub(crate) fn space_code(mode: &str) -> String {
    let literal = |s: &str| serde_json::to_string(s).unwrap_or_default();
    format!(
        "exec(compile({}, '<forkbox-space>', 'exec'), {{'_user': globals(), '_path': {}, '_mode': {}}})",
        literal(SPACE_PY),
        literal(STATE_FILE),
        literal(mode)
    )
}

/// The last line a freeze/thaw printed, as JSON.
pub(crate) fn parse_answer(stdout: &str) -> Result<serde_json::Value, String> {
    let line = stdout.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default();
    serde_json::from_str(line).map_err(|_| format!("the REPL answered {:?}", stdout.chars().take(300).collect::<String>()))
}

pub(crate) fn unsaved_list(v: &serde_json::Value) -> Vec<Unsaved> {
    serde_json::from_value(v.clone()).unwrap_or_default()
}

impl Service {
    /// Freeze sandbox `id` into a new Space and destroy it.
    pub async fn freeze(&self, caller: &Caller, id: &str) -> Result<SpaceMeta, Error> {
        let entry = self.get(caller, id).await?;
        crate::disk::ensure_room(&self.inner.config.state_dir)?;
        let busy = entry.hold_busy();
        let result = self.freeze_entry(&entry).await;
        drop(busy);
        let meta = result?;
        // The sandbox lives on as the Space: free it.
        let removed = {
            let mut all = self.inner.sandboxes.write().await;
            match all.get(id) {
                Some(e) if Arc::ptr_eq(e, &entry) => all.remove(id),
                _ => None,
            }
        };
        if let Some(e) = removed {
            self.unregistered(&e);
            self.inner.records.remove(id);
            self.drop_checkpoints(&e).await;
            self.teardown(&e).await;
        }
        tracing::info!(sandbox = %id, space = %meta.info.space_id, bytes = meta.info.bytes, "frozen");
        Ok(meta)
    }

    /// A persistent sandbox reached its idle timeout: freeze it. If that
    /// fails it stays (and is tried again after another idle period), since
    /// destroying it would lose what it was meant to keep.
    pub async fn freeze_idle(&self, id: &str) {
        match self.freeze(&Caller::server(), id).await {
            Ok(meta) => tracing::info!(sandbox = %id, space = %meta.info.space_id, "idle: frozen"),
            Err(e) => {
                tracing::error!(sandbox = %id, err = %e, "idle: could not freeze a persistent sandbox; trying again later");
                if let Ok(entry) = self.get(&Caller::server(), id).await {
                    entry.touch();
                }
            }
        }
    }

    async fn freeze_entry(&self, entry: &Arc<SandboxEntry>) -> Result<SpaceMeta, Error> {
        // Execs queued before the freeze run first; later ones find it gone.
        let mut slot = entry.slot.lock().await;
        if !entry.lifecycle().can_run() {
            return Err(Error::NotFound(format!("sandbox `{}` was destroyed", entry.id)));
        }
        let was_paused = entry.engine.is_paused();
        // The REPL writes its state into the sandbox's files ...
        let answer = self.write_repl_state(entry, &mut slot, was_paused).await?;
        // ... and every file stands still while they are copied.
        crate::pause::set_paused(entry, true).await?;
        let space_id = new_space_id();
        let store = &self.inner.spaces;
        let (partial, home) = (store.dir.join(format!("{PARTIAL}{space_id}")), store.dir.join(&space_id));
        let mut info = entry.info();
        info.state = "frozen".into();
        info.space_id = Some(space_id.clone());
        let meta = SpaceMeta {
            info: SpaceInfo {
                space_id: space_id.clone(),
                sandbox_id: entry.id.clone(),
                template: entry.settings.template.clone(),
                created_at: now_ms(),
                bytes: 0,
                unsaved: unsaved_list(&answer["unsaved"]),
            },
            sandbox: info,
            owner: entry.settings.owner.clone(),
            rootfs: self.inner.templates.is_builtin(&entry.settings.template).then(|| entry.engine.layers().1),
        };
        let engine = Arc::clone(&entry.engine);
        let dir = store.dir.clone();
        let written = tokio::task::spawn_blocking(move || -> std::io::Result<SpaceMeta> {
            let mut meta = meta;
            std::fs::create_dir_all(&dir)?;
            std::fs::create_dir(&partial)?;
            let copied = engine.export_upper(&partial.join("upper")).map_err(std::io::Error::from);
            let done = copied.and_then(|c| {
                meta.info.bytes = c.bytes;
                commit(&partial, &home, &meta)
            });
            if let Err(e) = done {
                let _ = std::fs::remove_dir_all(&partial);
                return Err(e);
            }
            Ok(meta)
        })
        .await
        .map_err(|e| io_err("freeze task failed", e))?;
        match written {
            Ok(meta) => {
                entry.mark_destroyed();
                slot.session = None;
                Ok(meta)
            }
            // A destroy does not wait for the slot: it may delete the
            // files under the copy. That is its answer, not a server error.
            Err(_) if entry.is_destroyed() => Err(Error::NotFound(format!("sandbox `{}` was destroyed during the freeze", entry.id))),
            Err(e) => {
                self.undo_freeze(entry, was_paused).await;
                drop(slot);
                Err(if e.raw_os_error() == Some(libc::ENOSPC) {
                    Error::NoSpace("no room on the server's disk for the space".into())
                } else {
                    io_err("could not write the space", e)
                })
            }
        }
    }

    /// Have the sandbox's REPL write its state to `STATE_FILE` in its files
    /// (a freeze, or a save as a template); its answer lists what it could
    /// not keep. On failure the sandbox goes on as it was.
    pub(crate) async fn write_repl_state(&self, entry: &Arc<SandboxEntry>, slot: &mut ReplSlot, was_paused: bool) -> Result<serde_json::Value, Error> {
        crate::pause::ensure_running(entry).await?;
        let answer = match slot.session.is_some() {
            true => entry.run_hidden(slot, &space_code("freeze"), REPL_SAVE_TIMEOUT).await.and_then(|out| parse_answer(&out)),
            false => Ok(serde_json::json!({"unsaved": []})),
        };
        match answer {
            Ok(a) => Ok(a),
            Err(e) => {
                self.undo_freeze(entry, was_paused).await;
                Err(Error::Conflict(format!("could not save the REPL's state: {e}")))
            }
        }
    }

    /// A freeze failed: the sandbox goes on as it was.
    pub(crate) async fn undo_freeze(&self, entry: &Arc<SandboxEntry>, was_paused: bool) {
        let _ = crate::pause::set_paused(entry, false).await;
        if let (Ok(fs), Ok(dir)) = (entry.engine.fs(), jail::fs::SandboxPath::parse("/.forkbox-space", "/root")) {
            let _ = fs.remove(&dir, true);
        }
        if was_paused {
            let _ = crate::pause::set_paused(entry, true).await;
        }
    }

    /// Resume Space `space_id` into a new sandbox; the Space is consumed.
    pub async fn resume_space(&self, caller: &Caller, space_id: &str, req: ResumeSpace) -> Result<Arc<SandboxEntry>, Error> {
        let store = &self.inner.spaces;
        let (meta, claimed) = store.claim(caller, space_id)?;
        let made = self.resume_claimed(caller, &meta, &claimed, req).await;
        match made {
            Ok(entry) => {
                if let Err(e) = store.note_resumed(&meta, &entry.id) {
                    tracing::warn!(space = %space_id, err = %e, "could not note where a space was resumed");
                }
                let doomed = claimed.clone();
                if let Err(e) = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(doomed)).await.unwrap_or_else(|e| Err(std::io::Error::other(e))) {
                    tracing::warn!(space = %space_id, err = %e, "could not remove a resumed space");
                }
                tracing::info!(space = %space_id, sandbox = %entry.id, "resumed a space");
                Ok(entry)
            }
            Err(e) => {
                store.put_back(space_id, &claimed);
                Err(e)
            }
        }
    }

    async fn resume_claimed(&self, caller: &Caller, meta: &SpaceMeta, claimed: &Path, req: ResumeSpace) -> Result<Arc<SandboxEntry>, Error> {
        let was = &meta.sandbox;
        let create = protocol::CreateSandbox {
            template: Some(meta.info.template.clone()),
            timeout_seconds: Some(req.timeout_seconds.unwrap_or(was.timeout_seconds)),
            idle_timeout_seconds: Some(req.idle_timeout_seconds.unwrap_or(was.idle_timeout_seconds)),
            ram_mib: Some(was.ram_mib),
            rootfs_gb: Some(was.rootfs_gb),
            persistent: Some(req.persistent.unwrap_or(was.persistent)),
            egress: Some(req.egress.unwrap_or_else(|| was.egress.clone())),
        };
        // The resumed sandbox is the Space's owner's (the caller's, with keys).
        let settings = Settings { owner: meta.owner.clone(), ..self.settings(&create, caller)? };
        let start = SpaceStart { upper: claimed.join("upper"), rootfs: meta.rootfs.clone() };
        let entry = self.create_with(caller, settings, Some(start)).await?;
        let mut slot = entry.slot.lock().await;
        let thawed = entry.run_hidden(&mut slot, &space_code("thaw"), REPL_SAVE_TIMEOUT).await.and_then(|out| parse_answer(&out));
        let notice = match thawed {
            Ok(answer) => {
                let mut lost = unsaved_list(&answer["unsaved"]);
                lost.extend(unsaved_list(&answer["failed"]));
                resume_notice(&meta.info.space_id, &lost)
            }
            Err(e) => {
                drop(slot);
                let _ = self.destroy(&Caller::server(), &entry.id).await;
                return Err(Error::internal("could not load the space's REPL state", e));
            }
        };
        slot.notice = Some(notice);
        drop(slot);
        Ok(entry)
    }
}

/// The warning the first exec after a resume carries.
fn resume_notice(space_id: &str, lost: &[Unsaved]) -> String {
    let mut msg = format!(
        "[forkbox] resumed from space {space_id}: files, imports, cwd, environment and globals are back; processes other than the REPL did not survive"
    );
    if !lost.is_empty() {
        let names: Vec<String> = lost.iter().map(|u| format!("{} ({}: {})", u.name, u.kind, u.reason)).collect();
        msg.push_str(&format!("; not kept: {}", names.join(", ")));
    }
    msg
}

impl Service {
    /// The Spaces `caller` may use.
    pub async fn spaces(&self, caller: &Caller) -> Vec<SpaceInfo> {
        let (state, caller) = (self.clone(), caller.clone());
        let spaces = tokio::task::spawn_blocking(move || state.inner.spaces.list(&caller)).await.unwrap_or_default();
        spaces.into_iter().map(|m| m.info).collect()
    }

    pub fn space(&self, caller: &Caller, id: &str) -> Result<SpaceInfo, Error> {
        Ok(self.inner.spaces.get(caller, id)?.info)
    }

    /// Discard Space `id` and its files.
    pub async fn delete_space(&self, caller: &Caller, id: &str) -> Result<(), Error> {
        let (state, caller, id) = (self.clone(), caller.clone(), id.to_string());
        tokio::task::spawn_blocking(move || state.inner.spaces.delete(&caller, &id)).await.map_err(|e| io_err("delete task failed", e))?
    }
}
