//! fork and merge_into (docs/fork.md): the server's half of a family fork
//! (docs/architecture.md#processes-and-namespaces).
//!
//! A fork takes the parent's exec slot (so it waits for a running exec, in
//! arrival order), has the engine snapshot the parent's files and build one
//! new member per child, gives the family's shim each child's channels (the
//! shim copies them, with the child's namespaces, into the child the
//! parent's REPL forks: the parent never holds them), asks the parent's
//! REPL to fork, and waits until every child REPL said it is ready
//! (`fork_steps`). Whatever fails on the way is destroyed again: a fork
//! makes all its children or none.

use std::sync::Arc;

use crate::error::Error;
use crate::ids::new_id;
use crate::keys::Caller;
use crate::sandbox::{new_entry, SandboxEntry};
use crate::state::Service;

/// Children per fork (the podflare contract's limit).
pub const MAX_FORK: usize = 32;
/// Most hollow spares a family keeps for its next fork (as many as its
/// last fork made, up to this).
const HOLLOW_SPARES: usize = 8;

impl Service {
    /// Fork sandbox `id` into `n` children (all within `caller`'s
    /// quotas, or none); returns their ids.
    pub async fn fork(&self, caller: &Caller, id: &str, n: usize) -> Result<Vec<String>, Error> {
        if !(1..=MAX_FORK).contains(&n) {
            return Err(Error::Invalid(format!("n must be between 1 and {MAX_FORK}, got {n}")));
        }
        let parent = self.get(caller, id).await?;
        let quota = self.reserve_quota(caller, parent.settings.owner.as_deref(), n, parent.settings.ram_mib, true)?;
        let _reserved = self.reserve_slots(n)?;
        let beyond = self.reserve_beyond(caller, parent.settings.owner.as_deref(), n, parent.settings.ram_mib, true).await?;
        let started = std::time::Instant::now();
        let children = self.fork_entries(&parent, n).await?;
        // Recorded beyond this server first: children nobody can find
        // would be half made (docs/cluster.md).
        let records: Vec<crate::directory::Registered> = children.iter().map(|c| crate::create::registered(c)).collect();
        if let Err(e) = beyond.register(&records).await {
            for c in &children {
                self.teardown(c).await;
            }
            return Err(e);
        }
        self.inner.metrics.fork_seconds.observe(started.elapsed().as_secs_f64());
        let ids: Vec<String> = children.iter().map(|c| c.id.clone()).collect();
        {
            let mut all = self.inner.sandboxes.write().await;
            if parent.is_destroyed() {
                drop(all);
                for c in &children {
                    self.inner.directory.unregister(&c.id, c.settings.owner.as_deref()).await;
                    self.teardown(c).await;
                }
                return Err(Error::NotFound(format!("sandbox `{id}` was destroyed during the fork")));
            }
            for c in &children {
                all.insert(c.id.clone(), Arc::clone(c));
            }
            self.inner.capacity.registered(n);
            quota.commit();
        }
        // Children inherit the parent's policy, each on a network of its own.
        let egress = parent.egress.lock().unwrap_or_else(|e| e.into_inner()).clone();
        // Together: each closes its child's network gate through the
        // family's shim, and a fork(32) waited for 32 round trips in a row.
        futures::future::join_all(children.iter().map(|c| crate::sandbox::network::apply_soon(c, egress.clone()))).await;
        for c in &children {
            self.inner.records.save(c);
        }
        tracing::info!(sandbox = %id, children = ?ids, "forked");
        Ok(ids)
    }

    /// Fork `parent` into `n` children that are not registered anywhere
    /// yet (the caller makes them sandboxes or checkpoints, and holds a
    /// reservation (`reserve_slots`) for them until they are registered).
    pub(crate) async fn fork_entries(&self, parent: &Arc<SandboxEntry>, n: usize) -> Result<Vec<Arc<SandboxEntry>>, Error> {
        if parent.engine.is_solo() {
            // Its processes are kept whole, so criu copies them whole.
            let busy = parent.hold_busy();
            let children = self.fork_processes(parent, n).await;
            drop(busy);
            parent.touch();
            return children;
        }
        let busy = parent.hold_busy();
        // A paused parent runs for the moment its REPL forks itself, then
        // is paused again; the children run (docs/state.md).
        let was_paused = parent.engine.is_paused();
        let result = match crate::sandbox::freezer::ensure_running(parent).await {
            Ok(()) => self.fork_locked(parent, n).await,
            Err(e) => Err(e),
        };
        if was_paused {
            let engine = Arc::clone(&parent.engine);
            if let Ok(Err(e)) = tokio::task::spawn_blocking(move || engine.pause()).await {
                tracing::warn!(sandbox = %parent.id, err = %e, "could not pause the parent again after a fork");
            }
        }
        drop(busy);
        parent.touch();
        let children = result?;
        // Build the family's next children ahead of time (docs/fork.md).
        let (engine, member) = (Arc::clone(&self.inner.engine), Arc::clone(&parent.engine));
        tokio::spawn(async move {
            if let Err(e) = engine.refill_hollows(member.as_ref(), n.min(HOLLOW_SPARES), &new_id).await {
                tracing::debug!(err = %e, "could not build spare fork members");
            }
        });
        Ok(children)
    }

    async fn fork_locked(&self, parent: &Arc<SandboxEntry>, n: usize) -> Result<Vec<Arc<SandboxEntry>>, Error> {
        let started = std::time::Instant::now();
        let mut slot = parent.slot.lock().await;
        if !parent.lifecycle().can_run() {
            return Err(Error::NotFound(format!("sandbox `{}` was destroyed", parent.id)));
        }
        parent.ensure_repl(&mut slot).await.map_err(|e| Error::Conflict(e.to_string()))?;
        // Checked before members are made, which would otherwise be left.
        let session = slot.session.as_mut().ok_or_else(|| Error::Conflict("the sandbox has no Python process".into()))?;
        let ids: Vec<String> = (0..n).map(|_| new_id()).collect();
        let (made, mut rooting) = self
            .inner
            .engine
            .fork_members(parent.engine.as_ref(), &ids, Some(session.host_pid))
            .await
            .map_err(|e| Error::internal("could not fork the sandbox", e))?;
        let membered = started.elapsed();
        let answered = self.fork_answered(session, parent.engine.as_ref(), made, None, 0, &mut rooting).await?;
        let forked = started.elapsed();
        let children = self.settle_fork(parent.engine.as_ref(), answered, rooting).await?;
        let mut lineage = parent.lineage.lock().map(|l| l.clone()).unwrap_or_default();
        lineage.push(parent.id.clone());
        let entries = children
            .into_iter()
            .map(|(member, session)| new_entry(member.id().to_string(), parent.settings.clone(), member, session, lineage.clone()))
            .collect();
        // Fractional milliseconds: bench/fork.py splits a fork of a few
        // milliseconds with them.
        let ms = |d: std::time::Duration| (d.as_secs_f64() * 1e6).round() / 1e3;
        tracing::debug!(sandbox = %parent.id, n, members_ms = ms(membered), answered_ms = ms(forked),
            total_ms = ms(started.elapsed()), "fork timings");
        Ok(entries)
    }

    /// Make `parent`'s id drive `winner`'s REPL and files; free the
    /// parent's old state; `winner`'s id stops existing.
    pub async fn merge_into(&self, caller: &Caller, parent_id: &str, winner_id: &str) -> Result<(), Error> {
        if parent_id == winner_id {
            return Err(Error::Invalid("cannot merge a sandbox into itself".into()));
        }
        let parent = self.get(caller, parent_id).await?;
        let winner = self.get(caller, winner_id).await?;
        let descends = winner.lineage.lock().map(|l| l.iter().any(|a| a == parent_id)).unwrap_or(false);
        // criu's children (process_fork.rs) are each a family of their own.
        let kin = parent.engine.same_family(winner.engine.as_ref()) || (parent.engine.is_solo() && winner.engine.is_solo());
        if !descends || !kin {
            return Err(Error::Conflict(format!("`{winner_id}` is not a fork descendant of `{parent_id}`")));
        }
        // Both queues drain first: a running exec finishes before its
        // sandbox changes hands. Lock in a fixed order (parent, then
        // descendant) so two merges cannot deadlock.
        let mut parent_slot = parent.slot.lock().await;
        let mut winner_slot = winner.slot.lock().await;
        let mut all = self.inner.sandboxes.write().await;
        if !all.get(parent_id).is_some_and(|e| Arc::ptr_eq(e, &parent)) || !all.get(winner_id).is_some_and(|e| Arc::ptr_eq(e, &winner)) {
            return Err(Error::Conflict("a sandbox of this merge was destroyed or merged meanwhile".into()));
        }
        let lineage = parent.lineage.lock().map(|l| l.clone()).unwrap_or_default();
        let merged = crate::sandbox::successor_entry(&parent, &winner, &mut winner_slot, lineage);
        // The winner's checkpoints are of the state the parent's id holds now.
        crate::sandbox::checkpoint_list::adopt(&merged.checkpoints, &winner.checkpoints);
        winner.mark_destroyed();
        all.remove(winner_id);
        self.unregistered(&winner);
        self.inner.records.remove(winner_id);
        self.inner.records.save(&merged);
        all.insert(parent_id.to_string(), merged);
        // The winner's descendants now descend from the parent's id.
        for e in all.values() {
            if let Ok(mut l) = e.lineage.lock() {
                l.retain(|a| a != winner_id);
            }
        }
        drop(all);
        if let Ok(mut m) = self.inner.merged.lock() {
            m.insert(winner_id.to_string(), parent_id.to_string(), parent.settings.owner.clone());
        }
        parent_slot.session = None;
        drop(parent_slot);
        drop(winner_slot);
        self.teardown(&parent).await;
        tracing::info!(sandbox = %parent_id, winner = %winner_id, "merged");
        Ok(())
    }
}

impl Service {
    /// `{added, removed, modified}` between two sandboxes' files under
    /// `paths`, as the podflare SDK's client-side `diff` defines them,
    /// computed from their overlay layers on the host (crate jail::diff).
    pub async fn diff(&self, caller: &Caller, id: &str, other: &str, paths: Vec<String>) -> Result<protocol::DiffResult, Error> {
        let this = self.get(caller, id).await?;
        let that = self.get(caller, other).await?;
        let (a, b) = (Arc::clone(&this.engine), Arc::clone(&that.engine));
        let result = tokio::task::spawn_blocking(move || {
            let ((a_upper, a_lower), (b_upper, b_lower)) = (a.layers(), b.layers());
            jail::diff::diff(&jail::diff::Layers { upper: &a_upper, lower: &a_lower }, &jail::diff::Layers { upper: &b_upper, lower: &b_lower }, &paths)
        })
        .await
        .map_err(|e| Error::internal("diff failed", e))?;
        match result {
            Ok(d) => Ok(protocol::DiffResult { added: d.added, removed: d.removed, modified: d.modified }),
            Err(jail::Error::Invalid(msg)) => Err(Error::Invalid(msg)),
            Err(e) => Err(Error::internal("diff failed", e)),
        }
    }
}
