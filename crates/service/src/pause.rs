//! Pause and resume in memory (docs/state.md): a paused sandbox's
//! processes are stopped by the cgroup freezer (no CPU, memory kept) and go
//! on exactly where they stopped. Every call that needs the sandbox running
//! (exec, files, PTYs, ports, fork) resumes it first; an idle sandbox may be
//! paused by the server (`--idle-pause-seconds`).

use std::sync::Arc;

use crate::error::Error;
use crate::keys::Caller;
pub use crate::sandbox::freezer::{ensure_running, pause_idle};
use crate::sandbox::SandboxEntry;
use crate::state::Service;

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
