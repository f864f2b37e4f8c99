//! The checkpoints a sandbox id holds (the operations on them are
//! checkpoints.rs's): each is a paused, unregistered fork of it.

use std::sync::Arc;

use protocol::CheckpointInfo;

use super::SandboxEntry;

pub struct Checkpoint {
    pub id: String,
    pub created_at: u64,
    /// The paused fork holding the state.
    pub entry: Arc<SandboxEntry>,
}

/// A sandbox id's checkpoints, oldest first.
pub type Checkpoints = Arc<std::sync::Mutex<Vec<Checkpoint>>>;

pub fn lock(list: &Checkpoints) -> std::sync::MutexGuard<'_, Vec<Checkpoint>> {
    list.lock().unwrap_or_else(|e| e.into_inner())
}

/// Move `from`'s checkpoints to the end of `into` (a merge).
pub fn adopt(into: &Checkpoints, from: &Checkpoints) {
    if Arc::ptr_eq(into, from) {
        return;
    }
    let moved: Vec<Checkpoint> = lock(from).drain(..).collect();
    lock(into).extend(moved);
}

impl Checkpoint {
    pub fn info(&self, sandbox_id: &str) -> CheckpointInfo {
        CheckpointInfo { checkpoint: self.id.clone(), sandbox_id: sandbox_id.to_string(), created_at: self.created_at }
    }
}
