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
use std::time::Duration;

use protocol::{SandboxInfo, SpaceInfo, Unsaved};
use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::ids::valid_id;
use crate::keys::Caller;

/// The REPL side of a freeze and a thaw.
pub(crate) const SPACE_PY: &str = include_str!("../../../repl/space.py");
/// Where the REPL's state file lives inside the sandbox during a freeze.
pub(crate) const STATE_FILE: &str = "/.forkbox-space/state.pkl";
/// Longest a freeze or thaw of the REPL's globals may take.
pub(crate) const REPL_SAVE_TIMEOUT: Duration = Duration::from_secs(600);

pub(crate) const PARTIAL: &str = ".partial-";
pub(crate) const RESUMING: &str = ".resuming-";
pub(crate) const DELETING: &str = ".deleting-";
/// `.resumed-<space>.json`: which sandbox a consumed Space became, so the
/// frozen sandbox's id answers helpfully (and a late DELETE is harmless).
pub(crate) const RESUMED: &str = ".resumed-";
/// How many consumed Spaces are remembered.
pub(crate) const RESUMED_REMEMBERED: usize = 1000;

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
    /// The id the new sandbox takes (a cluster moving a sandbox between
    /// nodes keeps it); a new one when None.
    pub id: Option<String>,
}

/// What a freeze makes of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freeze {
    /// A Space, resumed by its id into a new sandbox.
    Space,
    /// The sandbox hibernates: it keeps its id, and the next call to it
    /// wakes it (src/hibernate.rs).
    Hibernate,
    /// It hibernates with every process, or not at all (E2B's pause,
    /// which must not lose a process: it pauses in memory instead).
    HibernateWhole,
}

impl Freeze {
    /// The sandbox's `state` while it is on disk.
    pub fn state(self) -> &'static str {
        match self {
            Freeze::Space => "frozen",
            Freeze::Hibernate | Freeze::HibernateWhole => "hibernated",
        }
    }

    /// It keeps the sandbox's id.
    pub fn hibernates(self) -> bool {
        self != Freeze::Space
    }
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
    /// A `processes` Space's edges: the descriptors that led out of the
    /// dumped tree, which a restore replaces (`jail::Edges`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edges: Option<jail::Edges>,
    /// The sandbox hibernates in it: it keeps its id, the next call to it
    /// wakes it (src/hibernate.rs), and `GET /v1/spaces` does not list it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hibernated: bool,
    /// Settings the sandbox's info does not show, which its resume keeps
    /// (Spaces written before this have none).
    #[serde(default)]
    pub kept: crate::sandbox::KeptSettings,
}

/// The Spaces directory.
pub struct SpaceStore {
    pub(crate) dir: PathBuf,
}

pub(crate) fn io_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Internal(format!("{what}: {e}"))
}

pub(crate) fn no_space(id: &str) -> Error {
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

    /// Where Space `id` lives (an invalid id is refused here, before any
    /// path is made of it).
    pub(crate) fn path(&self, id: &str) -> Result<PathBuf, Error> {
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
    /// The Spaces `caller` may use, but the hibernating sandboxes'.
    pub fn list(&self, caller: &Caller) -> Vec<SpaceMeta> {
        let mut all = self.list_with_hibernated(caller);
        all.retain(|m| !m.hibernated);
        all
    }

    /// The hibernating sandboxes' Spaces `caller` may use.
    pub fn hibernating(&self, caller: &Caller) -> Vec<SpaceMeta> {
        let mut all = self.list_with_hibernated(caller);
        all.retain(|m| m.hibernated);
        all
    }

    fn list_with_hibernated(&self, caller: &Caller) -> Vec<SpaceMeta> {
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
        self.list_with_hibernated(caller).into_iter().find(|m| m.info.sandbox_id == sandbox_id)
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
    pub(crate) fn claim(&self, caller: &Caller, id: &str) -> Result<(SpaceMeta, PathBuf), Error> {
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
    pub(crate) fn note_resumed(&self, meta: &SpaceMeta, new_id: &str) -> std::io::Result<()> {
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

    pub(crate) fn put_back(&self, id: &str, claimed: &Path) {
        if let Err(e) = std::fs::rename(claimed, self.dir.join(id)) {
            tracing::error!(space = %id, err = %e, "could not put a space back after a failed resume");
        }
    }
}

/// Write `meta` beside the copied layer in `partial`, make everything
/// durable, and move it to `home` in one rename.
pub(crate) fn commit(partial: &Path, home: &Path, meta: &SpaceMeta) -> std::io::Result<()> {
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

pub(crate) fn new_space_id() -> String {
    format!("sp-{}", &crate::ids::new_id()[3..])
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
