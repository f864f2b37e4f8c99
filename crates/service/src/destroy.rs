//! Destroy: a sandbox leaves the registry (and the caps and quotas it
//! counted against), then everything it used is freed.

use std::sync::Arc;

use crate::error::Error;
use crate::ids::valid_id;
use crate::keys::Caller;
use crate::sandbox::SandboxEntry;
use crate::state::{no_sandbox, Service};

impl Service {
    /// Remove a sandbox `caller` may use from the registry and free
    /// everything it used.
    pub async fn destroy(&self, caller: &Caller, id: &str) -> Result<(), Error> {
        if !valid_id(id) {
            // The same answer as any other call with a malformed id.
            self.get(caller, id).await?;
        }
        let removed = {
            let mut all = self.inner.sandboxes.write().await;
            match all.get(id) {
                Some(e) if caller.may_use(e.settings.owner.as_deref()) => all.remove(id),
                _ => None,
            }
        };
        let Some(entry) = removed else {
            // Deleting an id that was merged away is harmless: its state
            // lives on under the id it was merged into.
            let merged = self.inner.merged.lock().ok().and_then(|m| m.get(id).cloned());
            if merged.is_some_and(|(_, owner)| caller.may_use(owner.as_deref())) {
                return Ok(());
            }
            // So is deleting a frozen one: its Space stays (DELETE the
            // Space to discard it), as a persistent sandbox's client that
            // closes it after an idle freeze expects.
            match self.frozen(caller, id).await {
                // A hibernating sandbox's Space is the sandbox: it goes.
                Some(crate::state::Frozen::Space(space)) if space.hibernated => return self.delete_space(caller, &space.info.space_id).await,
                Some(_) => return Ok(()),
                None => {}
            }
            return Err(no_sandbox(id));
        };
        self.unregistered(&entry);
        self.inner.records.remove(id);
        self.drop_checkpoints(&entry).await;
        self.teardown(&entry).await;
        Ok(())
    }

    pub(crate) async fn teardown(&self, entry: &SandboxEntry) {
        entry.mark_destroyed();
        self.inner.metrics.forget(entry);
        crate::sandbox::network::teardown(entry).await;
        if let Err(e) = self.inner.engine.destroy(entry.engine.as_ref()).await {
            tracing::error!(sandbox = %entry.id, err = %e, "destroy failed");
        }
        // Drop the REPL session (the process is gone already).
        if let Ok(mut slot) = entry.slot.try_lock() {
            slot.session = None;
        }
        tracing::info!(sandbox = %entry.id, "destroyed");
    }

    /// Destroy everything (server shutdown).
    pub async fn destroy_all(&self) {
        self.destroy_pool().await;
        // Persistent sandboxes outlive the server hibernating: their ids
        // wake them on the next server.
        let persistent: Vec<String> = self.inner.sandboxes.read().await.values().filter(|e| e.settings.persistent).map(|e| e.id.clone()).collect();
        for id in persistent {
            if let Err(e) = self.hibernate(&Caller::server(), &id).await {
                tracing::error!(sandbox = %id, err = %e, "could not hibernate a persistent sandbox at shutdown");
            }
        }
        let all: Vec<Arc<SandboxEntry>> = self.inner.sandboxes.write().await.drain().map(|(_, e)| e).collect();
        for e in &all {
            self.unregistered(e);
        }
        let jobs = all.iter().map(|e| async move {
            self.inner.records.remove(&e.id);
            self.drop_checkpoints(e).await;
            self.teardown(e).await
        });
        futures::future::join_all(jobs).await;
        self.inner.templates.layers.unmount_all();
    }
}
