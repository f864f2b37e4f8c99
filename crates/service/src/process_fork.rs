//! Forking a `keep_processes` sandbox (docs/fork.md#forking-a-sandbox-that-keeps-its-processes).
//!
//! Such a sandbox is solo: no family, no zygote, its REPL inside its own
//! pid namespace, so its REPL cannot fork itself into new members. criu
//! forks it instead: the paused sandbox's files and processes are dumped
//! once (`dump_whole`, as a freeze does, but the sandbox goes on), and
//! every child is a restore of that dump in a family of its own with a
//! fresh uid range, network and cgroup (`restore_whole`, as a resume
//! does). Every process comes along, not only the REPL; a checkpoint is a
//! paused child, so checkpoints and their restores work the same way.
//!
//! The dump lives in a `.partial-` directory of the Space store, which a
//! restarted server clears: a crash leaves the parent as it was.

use std::sync::Arc;

use crate::error::Error;
use crate::ids::new_id;
use crate::process_spaces::Pages;
use crate::sandbox::SandboxEntry;
use crate::space_store::PARTIAL;
use crate::state::Service;

impl Service {
    /// `n` new solo sandboxes (not registered yet), each a copy of solo
    /// `parent` with every process running. The parent's exec slot is
    /// held throughout, so the copies are of a REPL between execs.
    pub(crate) async fn fork_processes(&self, parent: &Arc<SandboxEntry>, n: usize) -> Result<Vec<Arc<SandboxEntry>>, Error> {
        let criu = self.criu_for(parent).map_err(Error::Unsupported)?;
        let started = std::time::Instant::now();
        let slot = parent.slot.lock().await;
        if !parent.lifecycle().can_run() {
            return Err(Error::NotFound(format!("sandbox `{}` was destroyed", parent.id)));
        }
        let dir = self.inner.spaces.dir.join(format!("{PARTIAL}fork-{}", new_id()));
        let was_paused = parent.engine.is_paused();
        // Paused for the dump: a crash meanwhile must not leave it so.
        self.mark_freezing(parent, !was_paused);
        if let Err(e) = crate::sandbox::freezer::set_paused(parent, true).await {
            self.mark_freezing(parent, false);
            return Err(e);
        }
        let dumped = self.dump_whole(parent, &criu, &dir).await;
        if !was_paused {
            if let Err(e) = crate::sandbox::freezer::set_paused(parent, false).await {
                tracing::warn!(sandbox = %parent.id, err = %e, "could not resume a sandbox after dumping it for a fork");
            }
            self.mark_freezing(parent, false);
        }
        drop(slot);
        let made = match dumped {
            Ok(dumped) => {
                let dumped_ms = started.elapsed().as_millis() as u64;
                let made = self.restore_children(parent, n, &dir, &dumped.edges, &criu).await;
                tracing::debug!(sandbox = %parent.id, n, dumped_ms, total_ms = started.elapsed().as_millis() as u64, "fork by criu timings");
                made
            }
            Err(why) => Err(Error::Conflict(format!("could not fork sandbox `{}`: {why}", parent.id))),
        };
        let doomed = dir.clone();
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(doomed)).await;
        made
    }

    /// One restore of the dump in `dir` per child, one after another: a
    /// restore lends the dump's page images to the child's uid range for
    /// its duration. All of them, or none.
    async fn restore_children(
        &self,
        parent: &SandboxEntry,
        n: usize,
        dir: &std::path::Path,
        edges: &jail::Edges,
        criu: &criu::Criu,
    ) -> Result<Vec<Arc<SandboxEntry>>, Error> {
        let mut lineage = parent.lineage.lock().map(|l| l.clone()).unwrap_or_default();
        lineage.push(parent.id.clone());
        let pinned = self.pinned_lower(parent);
        let mut children = Vec::with_capacity(n);
        for _ in 0..n {
            match self.restore_whole(new_id(), parent.settings.clone(), pinned.as_deref(), dir, edges, criu, lineage.clone(), Pages::First).await {
                Ok(child) => {
                    // Copies must not draw the same random numbers.
                    if let Some(session) = child.slot.lock().await.session.as_mut() {
                        if let Err(e) = session.send_reseed().await {
                            tracing::warn!(sandbox = %child.id, err = %e, "could not ask a forked REPL to reseed");
                        }
                    }
                    children.push(child)
                }
                Err(e) => {
                    for child in &children {
                        self.teardown(child).await;
                    }
                    return Err(e);
                }
            }
        }
        Ok(children)
    }
}
