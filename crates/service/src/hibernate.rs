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
}
