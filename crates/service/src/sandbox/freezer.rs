//! Pausing and resuming one sandbox through the engine's freezer
//! (docs/state.md): what every call that needs it running does first.

use std::sync::Arc;

use crate::error::Error;
use crate::lifecycle::Lifecycle;

use super::SandboxEntry;

pub async fn set_paused(entry: &Arc<SandboxEntry>, pause: bool) -> Result<(), Error> {
    let engine = Arc::clone(&entry.engine);
    tokio::task::spawn_blocking(move || if pause { engine.pause() } else { engine.resume() })
        .await
        .map_err(|e| Error::internal("pause task failed", e))?
        .map_err(|e| Error::internal(if pause { "could not pause the sandbox" } else { "could not resume the sandbox" }, e))
}

/// Resume `entry` if it is paused (before anything that needs it running).
pub async fn ensure_running(entry: &Arc<SandboxEntry>) -> Result<(), Error> {
    if entry.engine.is_paused() {
        set_paused(entry, false).await?;
        tracing::info!(sandbox = %entry.id, "resumed");
    }
    Ok(())
}

/// Pause `entry` unless an exec runs or waits (it would stall mid-call).
pub async fn pause_idle(entry: &Arc<SandboxEntry>) -> Result<(), Error> {
    let Ok(_slot) = entry.slot.try_lock() else {
        return Err(Error::Conflict("an exec is running or queued; pause after it".into()));
    };
    match entry.lifecycle() {
        Lifecycle::Running => Err(Error::Conflict("an exec is running or queued; pause after it".into())),
        Lifecycle::Destroyed => Err(Error::NotFound(format!("sandbox `{}` was destroyed", entry.id))),
        // Idempotent.
        Lifecycle::Paused => Ok(()),
        Lifecycle::Ready => {
            set_paused(entry, true).await?;
            tracing::info!(sandbox = %entry.id, "paused");
            Ok(())
        }
    }
}
