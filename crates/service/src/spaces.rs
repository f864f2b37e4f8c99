//! Freezing a sandbox into a Space and resuming one (docs/state.md); the
//! Spaces on disk and their crash safety are space_store.rs's.

use std::path::Path;
use std::sync::Arc;

use protocol::{ResumeSpace, SpaceInfo, SpaceKind, Unsaved};

use crate::error::Error;
use crate::keys::Caller;
use crate::process_spaces::NotKept;
use crate::sandbox::{KeptSettings, ReplSlot, SandboxEntry, Settings};
use crate::space_store::{commit, io_err, new_space_id, PARTIAL};
pub(crate) use crate::space_store::{parse_answer, space_code, unsaved_list, REPL_SAVE_TIMEOUT};
pub use crate::space_store::{Freeze, Resumed, SpaceMeta, SpaceStart, SpaceStore};
use crate::state::Service;
use repl_host::events::now_ms;

impl Service {
    /// Freeze sandbox `id` into a new Space and destroy it.
    pub async fn freeze(&self, caller: &Caller, id: &str) -> Result<SpaceMeta, Error> {
        self.freeze_as(caller, id, Freeze::Space).await
    }

    /// Freeze sandbox `id` (into a Space, or to hibernate) and destroy it.
    pub(crate) async fn freeze_as(&self, caller: &Caller, id: &str, how: Freeze) -> Result<SpaceMeta, Error> {
        let entry = self.get(caller, id).await?;
        crate::disk::ensure_room(&self.inner.config.state_dir)?;
        let busy = entry.hold_busy();
        let result = self.freeze_entry(&entry, how).await;
        drop(busy);
        let meta = result?;
        // The sandbox lives on as the Space: free it. A hibernating one's id
        // may be woken as soon as it leaves the registry, and the new
        // sandbox takes the same names: the wake waits for the teardown.
        let _waking = match how {
            how if how.hibernates() => Some(self.inner.waking.lock().await),
            _ => None,
        };
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
        tracing::info!(sandbox = %id, space = %meta.info.space_id, bytes = meta.info.bytes, kind = ?meta.info.kind, state = how.state(), "frozen");
        Ok(meta)
    }

    /// A persistent sandbox reached its idle timeout: it hibernates (it
    /// costs disk, not memory, and keeps its id). If that fails it stays
    /// (and is tried again after another idle period), since destroying it
    /// would lose what it was meant to keep.
    pub async fn hibernate_idle(&self, id: &str) {
        match self.hibernate(&Caller::server(), id).await {
            Ok(_) => tracing::info!(sandbox = %id, "idle: hibernated"),
            Err(e) => {
                tracing::error!(sandbox = %id, err = %e, "idle: could not hibernate a persistent sandbox; trying again later");
                if let Ok(entry) = self.get(&Caller::server(), id).await {
                    entry.touch();
                }
            }
        }
    }

    async fn freeze_entry(&self, entry: &Arc<SandboxEntry>, how: Freeze) -> Result<SpaceMeta, Error> {
        // Execs queued before the freeze run first; later ones find it gone.
        let mut slot = entry.slot.lock().await;
        if !entry.lifecycle().can_run() {
            return Err(Error::NotFound(format!("sandbox `{}` was destroyed", entry.id)));
        }
        let was_paused = entry.engine.is_paused();
        // The freeze pauses it: a crash before it ends must not leave it so.
        self.mark_freezing(entry, !was_paused);
        let frozen = self.freeze_locked(entry, &mut slot, was_paused, how).await;
        if frozen.is_err() && !was_paused {
            self.mark_freezing(entry, false);
        }
        frozen
    }

    /// Record whether a freeze (or a criu fork's dump) paused `entry` and
    /// has not ended: a server that adopts it after a crash lets it run.
    pub(crate) fn mark_freezing(&self, entry: &SandboxEntry, on: bool) {
        if entry.freezing.swap(on, std::sync::atomic::Ordering::SeqCst) != on {
            self.inner.records.save(entry);
        }
    }

    async fn freeze_locked(&self, entry: &Arc<SandboxEntry>, slot: &mut ReplSlot, was_paused: bool, how: Freeze) -> Result<SpaceMeta, Error> {
        // Every process when criu can (process_spaces.rs), else the globals.
        let not_kept = match self.criu_for(entry) {
            Ok(criu) => match self.freeze_processes(entry, &criu, was_paused, how).await {
                Ok(meta) => {
                    slot.session = None;
                    return Ok(meta);
                }
                Err(NotKept::Failed(e)) => return Err(e),
                Err(NotKept::Because(why)) if how == Freeze::HibernateWhole => return Err(Error::Conflict(format!("its processes cannot be kept: {why}"))),
                Err(NotKept::Because(why)) => {
                    tracing::warn!(sandbox = %entry.id, reason = %why, "the freeze keeps the REPL's globals, not the processes");
                    format!("{why}; the sandbox's files and the REPL's globals were kept instead")
                }
            },
            Err(why) if how == Freeze::HibernateWhole => return Err(Error::Conflict(format!("its processes cannot be kept: {why}"))),
            Err(why) => why,
        };
        self.freeze_globals(entry, slot, was_paused, not_kept, how).await
    }

    /// The meta of Space `space_id` of `entry`, made `how`, of `kind`;
    /// the caller fills in what the kind adds (bytes, edges, unsaved).
    pub(crate) fn space_meta(&self, entry: &SandboxEntry, space_id: &str, how: Freeze, kind: SpaceKind) -> SpaceMeta {
        let mut sandbox = entry.info();
        sandbox.state = how.state().into();
        sandbox.space_id = Some(space_id.to_string());
        SpaceMeta {
            info: SpaceInfo {
                space_id: space_id.to_string(),
                sandbox_id: entry.id.clone(),
                template: entry.settings.template.clone(),
                created_at: now_ms(),
                bytes: 0,
                unsaved: Vec::new(),
                kind,
                processes_not_kept: None,
            },
            sandbox,
            owner: entry.settings.owner.clone(),
            rootfs: self.pinned_lower(entry),
            edges: None,
            hibernated: how.hibernates(),
            kept: KeptSettings::of(&entry.settings),
        }
    }

    /// The template version `entry` runs on, when a later resume must
    /// find that very version (a built-in template's).
    pub(crate) fn pinned_lower(&self, entry: &SandboxEntry) -> Option<std::path::PathBuf> {
        self.inner.templates.is_builtin(&entry.settings.template).then(|| entry.engine.layers().1)
    }

    async fn freeze_globals(
        &self,
        entry: &Arc<SandboxEntry>,
        slot: &mut ReplSlot,
        was_paused: bool,
        not_kept: String,
        how: Freeze,
    ) -> Result<SpaceMeta, Error> {
        // The REPL writes its state into the sandbox's files ...
        let answer = self.write_repl_state(entry, slot, was_paused).await?;
        // ... and every file stands still while they are copied.
        crate::sandbox::freezer::set_paused(entry, true).await?;
        let space_id = new_space_id();
        let store = &self.inner.spaces;
        let (partial, home) = (store.dir.join(format!("{PARTIAL}{space_id}")), store.dir.join(&space_id));
        let mut meta = self.space_meta(entry, &space_id, how, SpaceKind::Globals);
        meta.info.unsaved = unsaved_list(&answer["unsaved"]);
        meta.info.processes_not_kept = Some(not_kept);
        let engine = Arc::clone(&entry.engine);
        let dir = store.dir.clone();
        let space_dir = home.clone();
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
        // Resumable beyond this server (a cluster's store) before the
        // sandbox goes: if that fails, the freeze is undone.
        let written = match written {
            Ok(meta) => match self.inner.directory.publish_space(&meta, &space_dir).await {
                Ok(()) => Ok(meta),
                Err(e) => {
                    let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(space_dir)).await;
                    self.undo_freeze(entry, was_paused).await;
                    return Err(e);
                }
            },
            Err(e) => Err(e),
        };
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
        crate::sandbox::freezer::ensure_running(entry).await?;
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
        let _ = crate::sandbox::freezer::set_paused(entry, false).await;
        if let (Ok(fs), Ok(dir)) = (entry.engine.fs(), jail::fs::SandboxPath::parse("/.forkbox-space", "/root")) {
            let _ = fs.remove(&dir, true);
        }
        if was_paused {
            let _ = crate::sandbox::freezer::set_paused(entry, true).await;
        }
    }

    /// Resume Space `space_id` into a new sandbox; the Space is consumed.
    pub async fn resume_space(&self, caller: &Caller, space_id: &str, req: ResumeSpace) -> Result<Arc<SandboxEntry>, Error> {
        self.resume_space_as(caller, space_id, req, None).await
    }

    /// `resume_space`, the new sandbox taking id `keep` when given (a
    /// cluster moving a sandbox from a draining node keeps its id;
    /// docs/cluster.md#drain).
    pub async fn resume_space_as(&self, caller: &Caller, space_id: &str, req: ResumeSpace, keep: Option<String>) -> Result<Arc<SandboxEntry>, Error> {
        if let Some(id) = &keep {
            if !crate::ids::valid_id(id) || self.inner.sandboxes.read().await.contains_key(id) {
                return Err(Error::Conflict(format!("sandbox id `{id}` cannot be taken here")));
            }
        }
        let store = &self.inner.spaces;
        let directory = &self.inner.directory;
        // Claimed beyond this server first (no other node may resume it),
        // and fetched here unless it is here already.
        let beyond = directory.claim_space(space_id, &store.path(space_id)?).await?;
        let (meta, claimed) = match store.claim(caller, space_id) {
            Ok(c) => c,
            Err(e) => {
                if beyond {
                    directory.space_unclaimed(space_id).await;
                }
                return Err(e);
            }
        };
        let made = self.resume_claimed(caller, &meta, &claimed, req, keep).await;
        match made {
            Ok(entry) => {
                if beyond {
                    directory.space_resumed(space_id).await;
                }
                // (A hibernating sandbox woke under its own id: no note.)
                if !meta.hibernated {
                    if let Err(e) = store.note_resumed(&meta, &entry.id) {
                        tracing::warn!(space = %space_id, err = %e, "could not note where a space was resumed");
                    }
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
                if beyond {
                    directory.space_unclaimed(space_id).await;
                }
                Err(e)
            }
        }
    }

    async fn resume_claimed(
        &self,
        caller: &Caller,
        meta: &SpaceMeta,
        claimed: &Path,
        req: ResumeSpace,
        keep: Option<String>,
    ) -> Result<Arc<SandboxEntry>, Error> {
        let was = &meta.sandbox;
        let create = protocol::CreateSandbox {
            template: Some(meta.info.template.clone()),
            timeout_seconds: Some(req.timeout_seconds.unwrap_or(was.timeout_seconds)),
            idle_timeout_seconds: Some(req.idle_timeout_seconds.unwrap_or(was.idle_timeout_seconds)),
            ram_mib: Some(was.ram_mib),
            rootfs_gb: Some(was.rootfs_gb),
            persistent: Some(req.persistent.unwrap_or(was.persistent)),
            // A `globals` Space resumes where criu is missing, as a
            // sandbox that no longer keeps its processes.
            keep_processes: Some(was.keep_processes && matches!(self.inner.config.criu, criu::Readiness::Ready(_))),
            egress: Some(req.egress.unwrap_or_else(|| was.egress.clone())),
        };
        // The resumed sandbox is the Space's owner's (the caller's, with
        // keys), on its template (fetched if it was made on another node).
        self.ensure_template(&meta.info.template).await?;
        let settings = meta.kept.clone().apply(Settings { owner: meta.owner.clone(), ..self.settings(&create, caller)? });
        if meta.info.kind == SpaceKind::Processes {
            return self.resume_processes(caller, meta, claimed, settings, keep).await;
        }
        let start = SpaceStart { upper: claimed.join("upper"), rootfs: meta.rootfs.clone(), id: keep };
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
    /// The Spaces `caller` may use (a cluster's: every node's).
    pub async fn spaces(&self, caller: &Caller) -> Result<Vec<SpaceInfo>, Error> {
        if let Some(mut all) = self.inner.directory.spaces().await? {
            // A hibernating sandbox's Space is the sandbox, listed as one.
            all.retain(|m| !m.hibernated && caller.may_use(m.owner.as_deref()));
            all.sort_by_key(|m| m.info.created_at);
            return Ok(all.into_iter().map(|m| m.info).collect());
        }
        let (state, caller) = (self.clone(), caller.clone());
        let spaces = tokio::task::spawn_blocking(move || state.inner.spaces.list(&caller)).await.unwrap_or_default();
        Ok(spaces.into_iter().map(|m| m.info).collect())
    }

    pub async fn space(&self, caller: &Caller, id: &str) -> Result<SpaceInfo, Error> {
        self.inner.spaces.path(id)?;
        if let Some(all) = self.inner.directory.spaces().await? {
            return all
                .into_iter()
                .find(|m| m.info.space_id == id && caller.may_use(m.owner.as_deref()))
                .map(|m| m.info)
                .ok_or_else(|| crate::space_store::no_space(id));
        }
        Ok(self.inner.spaces.get(caller, id)?.info)
    }

    /// Discard Space `id` and its files (a cluster's: wherever they are).
    pub async fn delete_space(&self, caller: &Caller, id: &str) -> Result<(), Error> {
        // Who may delete it is decided on its record, wherever that is.
        self.space(caller, id).await?;
        let deleted_beyond = self.inner.directory.delete_space(id).await?;
        let (state, who, id2) = (self.clone(), caller.clone(), id.to_string());
        let local = tokio::task::spawn_blocking(move || state.inner.spaces.delete(&who, &id2)).await.map_err(|e| io_err("delete task failed", e))?;
        match local {
            Err(Error::NotFound(_)) if deleted_beyond => Ok(()),
            other => other,
        }
    }
}
