//! `processes` Spaces (docs/state.md): a solo sandbox frozen whole by criu,
//! and resumed as a new sandbox with every process running again.
//!
//! A freeze pauses the sandbox, copies its files, has criu dump it (it
//! stays paused), writes the Space and only then ends the sandbox: a crash
//! at any point leaves the sandbox or a whole Space, never neither. A
//! freeze criu cannot make leaves the sandbox as it was, and the caller
//! makes a `globals` Space instead, saying why.

use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;

use protocol::SpaceKind;
use repl_host::session::ReplSession;

use crate::error::Error;
use crate::keys::Caller;
use crate::sandbox::{new_entry, SandboxEntry, Settings};
use crate::space_store::{commit, new_space_id, Freeze, SpaceMeta, PARTIAL};
use crate::state::Service;

/// Why a pooled sandbox's processes are not kept, criu or not.
pub(crate) const PROCESSES_NOT_KEPT: &str = "criu cannot dump a pooled forkbox sandbox: its REPL is forked from its template's zygote \
     and lives outside its member's pid namespace (docs/state.md#why-processes-are-not-kept-yet); \
     a sandbox created with keep_processes (the default for persistent ones) keeps them";

/// Where a `processes` Space keeps criu's images, beside `upper`.
pub const IMAGES_DIR: &str = "images";

/// Why a freeze did not keep the processes.
pub(crate) enum NotKept {
    /// The sandbox is as it was: a `globals` Space may be made instead.
    Because(String),
    /// The freeze failed for good (the caller answers with this).
    Failed(Error),
}

impl Service {
    /// The criu a freeze of `entry` would keep its processes with, or why
    /// it keeps none.
    pub(crate) fn criu_for(&self, entry: &SandboxEntry) -> Result<criu::Criu, String> {
        let criu = match &self.inner.config.criu {
            criu::Readiness::Ready(criu) => criu,
            criu::Readiness::Unavailable(why) => return Err(why.clone()),
        };
        if !entry.engine.is_solo() {
            return Err(format!("sandbox `{}` was made to fork (keep_processes: false), and {}", entry.id, PROCESSES_NOT_KEPT));
        }
        Ok(criu.clone())
    }

    /// Freeze solo `entry` whole into a new Space (the slot is held, so no
    /// exec runs). On `Ok` it is marked destroyed and its REPL let go.
    pub(crate) async fn freeze_processes(&self, entry: &Arc<SandboxEntry>, criu: &criu::Criu, was_paused: bool, how: Freeze) -> Result<SpaceMeta, NotKept> {
        crate::sandbox::freezer::set_paused(entry, true).await.map_err(|e| NotKept::Because(format!("could not pause it: {e}")))?;
        let space_id = new_space_id();
        let store = &self.inner.spaces;
        let (partial, home) = (store.dir.join(format!("{PARTIAL}{space_id}")), store.dir.join(&space_id));
        let written = self.write_processes(entry, criu, &partial, &home, &space_id, how).await;
        let meta = match written {
            Ok(meta) => meta,
            Err(why) => {
                let doomed = partial.clone();
                let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(doomed)).await;
                if !was_paused {
                    let _ = crate::sandbox::freezer::set_paused(entry, false).await;
                }
                return Err(NotKept::Because(why));
            }
        };
        // Resumable beyond this server (a cluster's store) before the
        // sandbox goes: if that fails, the freeze is undone.
        if let Err(e) = self.inner.directory.publish_space(&meta, &home).await {
            let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(home)).await;
            if !was_paused {
                let _ = crate::sandbox::freezer::set_paused(entry, false).await;
            }
            return Err(NotKept::Failed(e));
        }
        entry.mark_destroyed();
        Ok(meta)
    }

    /// The Space's files, then criu's images of the paused sandbox, then
    /// its meta: `partial` becomes `home` in one rename.
    async fn write_processes(
        &self,
        entry: &Arc<SandboxEntry>,
        criu: &criu::Criu,
        partial: &Path,
        home: &Path,
        space_id: &str,
        how: Freeze,
    ) -> Result<SpaceMeta, String> {
        let started = std::time::Instant::now();
        let behind = crate::write_behind::WriteBehind::start(partial.join(IMAGES_DIR));
        let dumped = self.dump_whole(entry, criu, partial).await?;
        drop(behind);
        let dumped_at = started.elapsed();
        let mut meta = self.space_meta(entry, space_id, how, SpaceKind::Processes);
        meta.info.bytes = dumped.bytes;
        meta.edges = Some(dumped.edges);
        let (partial, home) = (partial.to_path_buf(), home.to_path_buf());
        let meta = tokio::task::spawn_blocking(move || commit(&partial, &home, &meta).map(|()| meta))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("could not write the space: {e}"))?;
        // Where a freeze's time goes: the dump, or the disk after it.
        tracing::debug!(sandbox = %entry.id, bytes = meta.info.bytes, dump_ms = dumped_at.as_millis() as u64,
            sync_ms = (started.elapsed() - dumped_at).as_millis() as u64, "freeze timings");
        Ok(meta)
    }

    /// Paused solo `entry` whole into new directory `dir`: its files in
    /// `upper`, criu's images of its processes in `images`. It stays paused.
    pub(crate) async fn dump_whole(&self, entry: &Arc<SandboxEntry>, criu: &criu::Criu, dir: &Path) -> Result<Dumped, String> {
        let (engine, files) = (Arc::clone(&entry.engine), dir.to_path_buf());
        let copied = tokio::task::spawn_blocking(move || -> std::io::Result<jail::Copied> {
            if let Some(parent) = files.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::create_dir(&files)?;
            engine.export_upper(&files.join("upper")).map_err(std::io::Error::from)
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("could not copy its files: {e}"))?;
        let images = dir.join(IMAGES_DIR);
        std::fs::create_dir(&images).map_err(|e| format!("could not make the images directory: {e}"))?;
        let edges = self
            .inner
            .engine
            .dump(entry.engine.as_ref(), criu, &images, jail::AfterDump::StayPaused)
            .await
            .map_err(|e| format!("criu could not dump it: {e}"))?;
        Ok(Dumped { bytes: copied.bytes + dir_bytes(&images), edges })
    }

    /// A new sandbox from `processes` Space `meta` (claimed at `claimed`):
    /// its files and every process back, in a family of its own.
    pub(crate) async fn resume_processes(
        &self,
        caller: &Caller,
        meta: &SpaceMeta,
        claimed: &Path,
        settings: Settings,
        keep: Option<String>,
    ) -> Result<Arc<SandboxEntry>, Error> {
        let criu = match &self.inner.config.criu {
            criu::Readiness::Ready(criu) => criu.clone(),
            criu::Readiness::Unavailable(why) => {
                return Err(Error::Unsupported(format!("space `{}` keeps processes, which takes criu, and this server has none: {why}", meta.info.space_id)))
            }
        };
        let edges = meta.edges.clone().ok_or_else(|| Error::Internal(format!("space `{}` lists no edges", meta.info.space_id)))?;
        let settings = Settings { keep_processes: true, ..settings };
        let quota = self.reserve_quota(caller, settings.owner.as_deref(), 1, settings.ram_mib, false)?;
        let _slot = self.reserve_slots(1)?;
        let beyond = self.reserve_beyond(caller, settings.owner.as_deref(), 1, settings.ram_mib, false).await?;
        let started = std::time::Instant::now();
        let id = keep.unwrap_or_else(crate::ids::new_id);
        let pages = if self.inner.config.lazy_resume { Pages::Lazily } else { Pages::First };
        let entry = self.restore_whole(id, settings, meta.rootfs.as_deref(), claimed, &edges, &criu, Vec::new(), pages).await?;
        tracing::info!(sandbox = %entry.id, space = %meta.info.space_id, total_ms = started.elapsed().as_millis() as u64, "restored a space's processes");
        self.register_created(&entry, quota, beyond, "space", started).await?;
        Ok(entry)
    }

    /// New solo sandbox `id` (not registered yet) from what `dump_whole`
    /// wrote into `dir` (and the `edges` it found): its files, and every
    /// process running again with its REPL answering. `dir` is only read,
    /// so it may serve many.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn restore_whole(
        &self,
        id: String,
        settings: Settings,
        pinned: Option<&Path>,
        dir: &Path,
        edges: &jail::Edges,
        criu: &criu::Criu,
        lineage: Vec<String>,
        pages: Pages,
    ) -> Result<Arc<SandboxEntry>, Error> {
        let rootfs = self.inner.templates.rootfs_pinned(&settings.template, pinned)?;
        let trust = self.trust_layer(&rootfs)?;
        let spec = jail::SandboxSpec { solo: true, ..rootfs.spec(id.clone(), self.limits_for(&settings), Some(dir.join("upper")), trust) };
        let (member, repl) = self
            .inner
            .engine
            .restore(spec, &dir.join(IMAGES_DIR), edges, criu, pages == Pages::Lazily)
            .await
            .map_err(|e| Error::internal("could not restore the dumped processes", e))?;
        let Some(process) = repl else {
            let _ = self.inner.engine.destroy(member.as_ref()).await;
            return Err(Error::Internal(format!("the dump of `{id}`'s processes has no REPL")));
        };
        let ends = [process.control.as_fd(), process.stdout.as_fd(), process.stderr.as_fd()].map(|fd| fd.try_clone_to_owned());
        let host_pid = process.host_pid;
        let session = match ReplSession::resume(process).await {
            Ok(resumed) => resumed.session,
            Err(e) => {
                let _ = self.inner.engine.destroy(member.as_ref()).await;
                return Err(Error::internal("the restored REPL does not answer", e));
            }
        };
        // The family's shim keeps the server's ends, so the restored REPL
        // survives a server restart as a created one does.
        if let [Ok(control), Ok(stdout), Ok(stderr)] = ends {
            crate::sandbox::keep_repl_ends(member.as_ref(), host_pid, [control, stdout, stderr]).await;
        }
        Ok(new_entry(id, settings, member, session, lineage))
    }
}

/// How a restore brings memory back (docs/state.md#lazy-resume).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pages {
    /// The tree runs at once; its pages follow (a resume: one restore of
    /// a dump nobody else reads).
    Lazily,
    /// Every page before the tree runs (a criu fork's children and
    /// checkpoints, restored from one dump, paused or dumped again soon).
    First,
}

/// What `dump_whole` wrote.
pub(crate) struct Dumped {
    /// Bytes of files and images.
    pub bytes: u64,
    /// The descriptors that crossed the tree's edge (a restore's to hand in).
    pub edges: jail::Edges,
}

/// Bytes under `dir` (one level: criu's images are files in one directory).
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).map(|entries| entries.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum()).unwrap_or(0)
}
