//! Pause and resume in memory (docs/state.md): a paused sandbox's
//! processes are stopped by the cgroup freezer (no CPU, memory kept) and go
//! on exactly where they stopped. Every call that needs the sandbox running
//! (exec, files, PTYs, ports, fork) resumes it first; an idle sandbox may be
//! paused by the server (`--idle-pause-seconds`).

use std::sync::Arc;

use crate::error::Error;
use crate::keys::Caller;
use crate::lifecycle::Lifecycle;
use crate::sandbox::SandboxEntry;
use crate::state::Service;

pub(crate) async fn set_paused(entry: &Arc<SandboxEntry>, pause: bool) -> Result<(), Error> {
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

impl Service {
    /// Pause sandbox `id` in memory (refused while an exec runs or waits).
    pub async fn pause(&self, caller: &Caller, id: &str) -> Result<Arc<SandboxEntry>, Error> {
        let entry = self.get(caller, id).await?;
        pause_idle(&entry).await?;
        Ok(entry)
    }

    /// Resume sandbox `id` if it is paused; it counts as active.
    pub async fn resume(&self, caller: &Caller, id: &str) -> Result<Arc<SandboxEntry>, Error> {
        let entry = self.get(caller, id).await?;
        ensure_running(&entry).await?;
        entry.touch();
        Ok(entry)
    }
}
