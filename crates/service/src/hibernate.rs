//! Hibernation (docs/state.md#hibernation): a sandbox sent to disk that
//! keeps its id. It is a Space marked `hibernated` (of either kind: a
//! `keep_processes` sandbox keeps every process); `GET` shows it as
//! `hibernated`, `DELETE` discards it, and any other call wakes it, under
//! the same id, before it is served. Persistent sandboxes hibernate at
//! their idle timeout and at a graceful shutdown.

use std::sync::Arc;

use protocol::{ResumeSpace, SandboxInfo};

use crate::error::Error;
use crate::keys::Caller;
use crate::sandbox::SandboxEntry;
use crate::space_store::{Freeze, SpaceMeta};
use crate::state::Service;

impl Service {
    /// Send sandbox `id` to disk, keeping its id; its info as it now is.
    pub async fn hibernate(&self, caller: &Caller, id: &str) -> Result<SandboxInfo, Error> {
        Ok(self.freeze_as(caller, id, Freeze::Hibernate).await?.sandbox)
    }

    /// E2B's pause: to disk with every process, else in memory (which
    /// keeps every process too). Whether it hibernated.
    pub async fn pause_keeping_processes(&self, caller: &Caller, id: &str) -> Result<bool, Error> {
        let entry = self.get(caller, id).await?;
        if entry.settings.keep_processes {
            match self.freeze_as(caller, id, Freeze::HibernateWhole).await {
                Ok(_) => return Ok(true),
                Err(Error::Conflict(why)) => tracing::info!(sandbox = %id, %why, "paused in memory, not hibernated"),
                Err(e) => return Err(e),
            }
        }
        self.pause(caller, id).await?;
        Ok(false)
    }

    /// Wake hibernating sandbox `id` from its Space (`meta`): the way in
    /// of the call that found it so.
    pub(crate) async fn wake(&self, caller: &Caller, id: &str, meta: &SpaceMeta) -> Result<Arc<SandboxEntry>, Error> {
        let _one = self.inner.waking.lock().await;
        // A call that waited here finds it woken by the one before.
        if let Some(entry) = self.inner.sandboxes.read().await.get(id).cloned() {
            return Ok(entry);
        }
        let started = std::time::Instant::now();
        let entry = self.resume_space_as(caller, &meta.info.space_id, ResumeSpace::default(), Some(id.to_string())).await?;
        // Its lifetime goes on from where it stood.
        entry.set_expires_at(meta.sandbox.expires_at);
        self.inner.records.save(&entry);
        tracing::info!(sandbox = %id, kind = ?meta.info.kind, ms = started.elapsed().as_millis() as u64, "woke from hibernation");
        Ok(entry)
    }

    /// Whether a freeze here keeps every process (the server has criu).
    pub fn keeps_processes(&self) -> bool {
        matches!(self.inner.config.criu, criu::Readiness::Ready(_))
    }

    /// Hibernating sandbox `id`'s Space, looked at, not woken; `None` if
    /// `id` is not hibernating or not `caller`'s.
    pub async fn hibernating(&self, caller: &Caller, id: &str) -> Option<SpaceMeta> {
        // A live sandbox is not on disk: its id spares the Spaces' scan.
        if self.inner.sandboxes.read().await.contains_key(id) {
            return None;
        }
        match self.frozen(caller, id).await {
            Some(crate::state::Frozen::Space(meta)) if meta.hibernated => Some(*meta),
            _ => None,
        }
    }

    /// Every hibernating sandbox `caller` may use, oldest first (a
    /// cluster's: every node lists them all, and its gateway merges).
    pub async fn hibernating_all(&self, caller: &Caller) -> Vec<SpaceMeta> {
        match self.inner.directory.spaces().await {
            Ok(Some(mut all)) => {
                all.retain(|m| m.hibernated && caller.may_use(m.owner.as_deref()));
                all.sort_by_key(|m| m.info.created_at);
                return all;
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(err = %e, "could not list the cluster's hibernating sandboxes"),
        }
        let (state, caller) = (self.clone(), caller.clone());
        tokio::task::spawn_blocking(move || state.inner.spaces.hibernating(&caller)).await.unwrap_or_default()
    }

    /// A sandbox created to pause at the end of its lifetime reached it
    /// (E2B's `autoPause`): one that keeps its processes hibernates (to
    /// disk, every process kept), any other is paused in memory. Either
    /// lives until deleted or resumed.
    pub(crate) async fn pause_at_lifetime_end(&self, entry: &Arc<SandboxEntry>) {
        let lifetime = entry.expires_at();
        entry.set_expires_at(u64::MAX);
        if entry.settings.keep_processes {
            // Busy meanwhile, so no idle timeout picks it.
            let _busy = entry.hold_busy();
            match self.freeze_as(&Caller::server(), &entry.id, Freeze::HibernateWhole).await {
                Ok(_) => return tracing::info!(sandbox = %entry.id, "hibernated at the end of its lifetime"),
                Err(e) => tracing::info!(sandbox = %entry.id, err = %e, "not hibernated at the end of its lifetime; pausing it in memory"),
            }
        }
        if crate::sandbox::freezer::pause_idle(entry).await.is_ok() {
            tracing::info!(sandbox = %entry.id, "paused at the end of its lifetime");
            self.inner.records.save(entry);
        } else {
            // Busy now: tried again on the next tick.
            entry.set_expires_at(lifetime);
        }
    }
}
