//! A sandbox's code contexts as its entry holds them (the calls that make
//! and use them are src/contexts.rs).

use std::sync::Arc;

use super::{ReplSlot, SandboxEntry};
use crate::error::Error;

pub struct Context {
    pub id: String,
    pub language: String,
    pub cwd: String,
    /// Executions run in it (E2B's `execution_count`).
    pub execs: std::sync::atomic::AtomicU64,
    pub(crate) slot: tokio::sync::Mutex<ReplSlot>,
}

/// A sandbox's extra contexts.
#[derive(Default)]
pub struct Contexts(std::sync::Mutex<Vec<Arc<Context>>>);

impl Contexts {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Context>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn get(&self, id: &str) -> Result<Arc<Context>, Error> {
        self.lock().iter().find(|c| c.id == id).cloned().ok_or_else(|| Error::NotFound(format!("context `{id}` not found")))
    }

    pub fn list(&self) -> Vec<Arc<Context>> {
        self.lock().clone()
    }
}

/// What an exec runs on: the sandbox's own REPL or one of its contexts.
#[derive(Clone, Default)]
pub enum Target {
    #[default]
    Sandbox,
    Context(Arc<Context>),
}

impl Target {
    pub(crate) async fn slot<'a>(&'a self, entry: &'a SandboxEntry) -> tokio::sync::MutexGuard<'a, ReplSlot> {
        match self {
            Target::Sandbox => entry.slot.lock().await,
            Target::Context(c) => c.slot.lock().await,
        }
    }
}
