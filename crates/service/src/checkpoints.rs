//! Checkpoints (docs/state.md): undo for agents. A checkpoint is a fork of
//! the sandbox (REPL process and files, copy-on-write) that is paused at
//! once and never registered as a sandbox: it uses no CPU, has no timers,
//! and cannot be reached except through its sandbox. Restoring forks the
//! checkpoint again and hands the fork the sandbox's id, so a checkpoint
//! can be restored any number of times.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use protocol::{CheckpointInfo, CheckpointList};

use crate::error::Error;
use crate::keys::Caller;
use crate::sandbox::checkpoint_list::{lock, Checkpoint};
use crate::sandbox::SandboxEntry;
use crate::state::Service;
use repl_host::events::now_ms;

/// Checkpoint ids: `cp-` and 20 lowercase base-32 characters.
fn new_checkpoint_id() -> String {
    format!("cp-{}", &crate::ids::new_id()[3..])
}

impl Service {
    /// Capture `id`'s REPL and files as a new checkpoint.
    pub async fn checkpoint(&self, caller: &Caller, id: &str) -> Result<CheckpointInfo, Error> {
        let entry = self.get(caller, id).await?;
        let max = self.inner.config.limits.max_checkpoints;
        if lock(&entry.checkpoints).len() >= max {
            return Err(Error::Capacity(format!("sandbox `{id}` has {max} checkpoints, the most allowed (--max-checkpoints); delete one first")));
        }
        let _reserved = self.reserve_slots(1)?;
        let fork = self.fork_entries(&entry, 1).await?.pop().ok_or_else(|| Error::Internal("a fork made no child".into()))?;
        if let Err(e) = crate::sandbox::freezer::set_paused(&fork, true).await {
            self.teardown(&fork).await;
            return Err(e);
        }
        let checkpoint = Checkpoint { id: new_checkpoint_id(), created_at: now_ms(), entry: fork };
        let info = checkpoint.info(id);
        let refused = {
            let mut list = lock(&entry.checkpoints);
            // Two checkpoints made at once may both have passed the check.
            if list.len() >= max || entry.is_destroyed() {
                Some(checkpoint)
            } else {
                list.push(checkpoint);
                None
            }
        };
        if let Some(c) = refused {
            self.teardown(&c.entry).await;
            return Err(if entry.is_destroyed() {
                Error::NotFound(format!("sandbox `{id}` was destroyed"))
            } else {
                Error::Capacity(format!("sandbox `{id}` has {max} checkpoints, the most allowed (--max-checkpoints)"))
            });
        }
        tracing::info!(sandbox = %id, checkpoint = %info.checkpoint, "checkpointed");
        Ok(info)
    }

    pub async fn checkpoints(&self, caller: &Caller, id: &str) -> Result<CheckpointList, Error> {
        let entry = self.get(caller, id).await?;
        let list = lock(&entry.checkpoints);
        Ok(CheckpointList { checkpoints: list.iter().map(|c| c.info(id)).collect() })
    }

    pub async fn delete_checkpoint(&self, caller: &Caller, id: &str, checkpoint: &str) -> Result<(), Error> {
        let entry = self.get(caller, id).await?;
        let removed = {
            let mut list = lock(&entry.checkpoints);
            let at = list.iter().position(|c| c.id == checkpoint).ok_or_else(|| no_checkpoint(id, checkpoint))?;
            list.remove(at)
        };
        self.teardown(&removed.entry).await;
        Ok(())
    }

    /// Destroy every checkpoint of `entry` (its id is going away).
    pub(crate) async fn drop_checkpoints(&self, entry: &SandboxEntry) {
        let all: Vec<Checkpoint> = lock(&entry.checkpoints).drain(..).collect();
        for c in all {
            self.teardown(&c.entry).await;
        }
    }

    /// Roll `id` back to `checkpoint`: a fresh fork of the checkpoint takes
    /// over the id; the sandbox's current processes and files are freed.
    /// Its settings, lifetime, egress policy and checkpoints stay.
    pub async fn restore(&self, caller: &Caller, id: &str, checkpoint: &str) -> Result<Arc<SandboxEntry>, Error> {
        let entry = self.get(caller, id).await?;
        let source = lock(&entry.checkpoints).iter().find(|c| c.id == checkpoint).map(|c| Arc::clone(&c.entry)).ok_or_else(|| no_checkpoint(id, checkpoint))?;
        let _reserved = self.reserve_slots(1)?;
        let fork = self.fork_entries(&source, 1).await?.pop().ok_or_else(|| Error::Internal("a fork made no child".into()))?;
        // A running exec finishes first; later ones run on the restored state.
        let mut slot = entry.slot.lock().await;
        let mut fork_slot = fork.slot.lock().await;
        let mut all = self.inner.sandboxes.write().await;
        if !all.get(id).is_some_and(|e| Arc::ptr_eq(e, &entry)) {
            drop((all, fork_slot));
            self.teardown(&fork).await;
            return Err(Error::Conflict(format!("sandbox `{id}` was destroyed or replaced during the restore")));
        }
        let lineage = entry.lineage.lock().map(|l| l.clone()).unwrap_or_default();
        let restored = crate::sandbox::successor_entry(&entry, &fork, &mut fork_slot, lineage);
        restored.execs.store(entry.execs.load(Ordering::Relaxed), Ordering::Relaxed);
        all.insert(id.to_string(), Arc::clone(&restored));
        drop(all);
        drop(fork_slot);
        slot.session = None;
        drop(slot);
        let egress = entry.egress.lock().unwrap_or_else(|e| e.into_inner()).clone();
        // The replaced state is freed after the answer: nothing can reach
        // it any more, and the caller wants the restored sandbox now.
        let state = self.clone();
        tokio::spawn(async move { state.teardown(&entry).await });
        crate::sandbox::network::apply_soon(&restored, egress).await;
        self.inner.records.save(&restored);
        tracing::info!(sandbox = %id, checkpoint, "restored");
        Ok(restored)
    }
}

fn no_checkpoint(id: &str, checkpoint: &str) -> Error {
    Error::NotFound(format!("sandbox `{id}` has no checkpoint `{}`", checkpoint.chars().take(80).collect::<String>()))
}
