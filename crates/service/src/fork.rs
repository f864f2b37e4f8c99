//! fork and merge_into (docs/fork.md): the server's half of a family fork
//! (docs/architecture.md#processes-and-namespaces).
//!
//! A fork takes the parent's exec slot (so it waits for a running exec, in
//! arrival order), has the engine snapshot the parent's files and build one
//! new member per child, gives the family's shim each child's channels (the
//! shim copies them, with the child's namespaces, into the child the
//! parent's REPL forks: the parent never holds them), asks the parent's
//! REPL to fork, and waits until every child REPL said it is ready.
//! Whatever fails on the way is destroyed again: a fork makes all its
//! children or none.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use crate::engine::{Forked, Member, MemberRef};
use crate::error::Error;
use crate::ids::new_id;
use crate::keys::Caller;
use crate::sandbox::{new_entry, SandboxEntry};
use crate::state::Service;
use repl_host::session::ReplSession;

/// Children per fork (the podflare contract's limit).
pub const MAX_FORK: usize = 32;
/// Longest wait for the parent REPL to answer a fork.
const FORK_ANSWER_TIMEOUT: Duration = Duration::from_secs(60);
/// Most hollow spares a family keeps for its next fork (as many as its
/// last fork made, up to this).
const HOLLOW_SPARES: usize = 8;

/// The server's ends of one child's REPL channels, and the child's ends
/// that travel to the shim, which copies them into the forked child.
struct ChildChannels {
    control: std::os::unix::net::UnixStream,
    stdout: OwnedFd,
    stderr: OwnedFd,
    /// The REPL's ends: control socket, stdout and stderr write ends.
    /// Passed on in the order of `jail::fork_fds::CHANNELS`.
    theirs: [OwnedFd; jail::fork_fds::CHANNELS.len()],
}

fn child_channels() -> std::io::Result<ChildChannels> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    let pipe = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from);
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    Ok(ChildChannels { control: ours, stdout: out_r, stderr: err_r, theirs: [OwnedFd::from(theirs), out_w, err_w] })
}

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
        for c in &children {
            crate::sandbox::network::apply_soon(c, egress.clone()).await;
            self.inner.records.save(c);
        }
        tracing::info!(sandbox = %id, children = ?ids, "forked");
        Ok(ids)
    }

    /// Fork `parent` into `n` children that are not registered anywhere
    /// yet (the caller makes them sandboxes or checkpoints, and holds a
    /// reservation (`reserve_slots`) for them until they are registered).
    pub(crate) async fn fork_entries(&self, parent: &Arc<SandboxEntry>, n: usize) -> Result<Vec<Arc<SandboxEntry>>, Error> {
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
        let made = self.inner.engine.fork_members(parent.engine.as_ref(), &ids).await.map_err(|e| Error::internal("could not fork the sandbox", e))?;
        let snapshotted = started.elapsed();
        let children = self.fork_repl_into(session, parent.engine.as_ref(), made, None).await?;
        let mut lineage = parent.lineage.lock().map(|l| l.clone()).unwrap_or_default();
        lineage.push(parent.id.clone());
        let entries = children
            .into_iter()
            .map(|(member, session)| new_entry(member.id().to_string(), parent.settings.clone(), member, session, lineage.clone()))
            .collect();
        tracing::debug!(sandbox = %parent.id, n, snapshot_ms = snapshotted.as_millis() as u64,
            total_ms = started.elapsed().as_millis() as u64, "fork timings");
        Ok(entries)
    }

    /// Have the REPL of `session` (in `parent`) fork itself into the new
    /// members `made`, and wait until every child REPL is ready and adopted.
    /// `plan`: what the children must redo (jail::fork_plan), read from the
    /// REPL's /proc when None. All or nothing: on failure, at whichever
    /// step, every member in `made` is destroyed here, and only here.
    pub(crate) async fn fork_repl_into(
        &self,
        session: &mut ReplSession,
        parent: &dyn Member,
        made: Vec<Forked>,
        plan: Option<&serde_json::Value>,
    ) -> Result<Vec<(MemberRef, ReplSession)>, Error> {
        let mut members = Vec::with_capacity(made.len());
        let mut rest = Vec::with_capacity(made.len());
        for Forked { member, ns, exited } in made {
            members.push(member);
            rest.push((ns, exited));
        }
        match self.fork_steps(session, parent, &members, rest, plan).await {
            Ok(sessions) => Ok(members.into_iter().zip(sessions).collect()),
            Err(e) => {
                // Dropping the server's ends (gone with `fork_steps`) makes
                // any child REPL that did start exit; destroying the
                // members frees the rest.
                self.discard_members(&members).await;
                Err(e.into())
            }
        }
    }

    /// Destroy fork members that will not become sandboxes.
    pub(crate) async fn discard_members(&self, members: &[MemberRef]) {
        for m in members {
            if let Err(e) = self.inner.engine.destroy(m.as_ref()).await {
                tracing::warn!(member = %m.id(), err = %e, "could not destroy a fork member");
            }
        }
    }

    /// The steps of a fork, in order; `fork_repl_into` cleans up after any
    /// of them failing.
    async fn fork_steps(
        &self,
        session: &mut ReplSession,
        parent: &dyn Member,
        members: &[MemberRef],
        rest: Vec<(Vec<OwnedFd>, tokio::sync::oneshot::Receiver<jail::ExitStatus>)>,
        plan: Option<&serde_json::Value>,
    ) -> Result<Vec<ReplSession>, ForkError> {
        let engine = &self.inner.engine;
        let n = members.len();
        let channels = (0..n).map(|_| child_channels()).collect::<Result<Vec<_>, _>>().map_err(ForkError::Channels)?;
        let plan = match plan {
            Some(p) => p.clone(),
            None => serde_json::to_value(jail::fork_plan(session.host_pid)).unwrap_or_default(),
        };
        let parent_repl = session.host_pid;
        // Each child's descriptors go to the shim, never to the forking
        // REPL (docs/security.md, row 63): the shim copies them, with the
        // child's namespaces, into the child once it is forked. The layout
        // is `jail::fork_fds`'s.
        let counts: Vec<usize> = {
            let joins: Vec<Vec<OwnedFd>> = members.iter().map(|m| m.self_join_fds()).collect();
            let expected = members.iter().zip(&channels).zip(&joins).enumerate().map(|(slot, ((member, ch), join))| {
                let fds: Vec<BorrowedFd<'_>> = ch.theirs.iter().chain(join).map(|fd| fd.as_fd()).collect();
                async move { engine.expect_fork(parent, parent_repl, slot, member.as_ref(), &fds).await }
            });
            futures::future::join_all(expected).await.into_iter().collect::<Result<Vec<()>, _>>().map_err(ForkError::Handover)?;
            joins.iter().map(|join| jail::fork_fds::count(join.len())).collect()
        };
        let answer = match session.send_fork(&plan, &counts).await {
            Ok(fid) => match tokio::time::timeout(FORK_ANSWER_TIMEOUT, session.wait_forked(fid)).await {
                Ok(answer) => answer.map_err(|e| ForkError::Unreachable(e.to_string())),
                Err(_) => Err(ForkError::NoAnswer),
            },
            Err(e) => Err(ForkError::Unreachable(e.to_string())),
        };
        // The shim holds its copies now; ours would keep the children's
        // pipes open after they die.
        let mut starts = Vec::with_capacity(n);
        for ((ns, exited), ch) in rest.into_iter().zip(channels) {
            drop(ns);
            drop(ch.theirs);
            starts.push(start_child(ch.control, ch.stdout, ch.stderr, exited));
        }
        match answer? {
            f if f.error.is_none() && f.pids.len() == n => {}
            f => return Err(f.error.map(ForkError::Refused).unwrap_or(ForkError::Partial { forked: f.pids.len(), n })),
        }
        let mut sessions = futures::future::join_all(starts).await.into_iter().collect::<Result<Vec<_>, _>>()?;
        let refs: Vec<&dyn Member> = members.iter().map(|s| s.as_ref()).collect();
        let adopted = engine.adopt_forks(parent, parent_repl, &refs).await.map_err(ForkError::Adopt)?;
        let mut deposits = Vec::with_capacity(n);
        for ((session, (host_pid, pidfd)), member) in sessions.iter_mut().zip(adopted).zip(members) {
            session.adopted(host_pid, pidfd);
            deposits.extend(session.take_ends().map(|ends| (Arc::clone(member), host_pid, ends)));
        }
        // Off the fork's path: the shim is busy with the new REPLs settling
        // in, and the ends only matter if the server dies.
        tokio::spawn(async move {
            for (member, repl, ends) in deposits {
                crate::sandbox::keep_repl_ends(member.as_ref(), repl, ends).await;
            }
        });
        Ok(sessions)
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
        if !descends || !parent.engine.same_family(winner.engine.as_ref()) {
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

async fn start_child(
    control: std::os::unix::net::UnixStream,
    stdout: OwnedFd,
    stderr: OwnedFd,
    exited: tokio::sync::oneshot::Receiver<jail::ExitStatus>,
) -> Result<ReplSession, ForkError> {
    control.set_nonblocking(true).map_err(ForkError::Channels)?;
    let control = tokio::net::UnixStream::from_std(control).map_err(ForkError::Channels)?;
    let stdout = tokio::net::unix::pipe::Receiver::from_owned_fd(stdout).map_err(ForkError::Channels)?;
    let stderr = tokio::net::unix::pipe::Receiver::from_owned_fd(stderr).map_err(ForkError::Channels)?;
    ReplSession::start_forked(control, stdout, stderr, exited).await.map_err(ForkError::ChildStart)
}

/// Why a fork failed at one of its steps. The client sees only "could not
/// fork the sandbox"; this goes to the log.
#[derive(Debug, thiserror::Error)]
pub enum ForkError {
    #[error("could not make or register a child's channels: {0}")]
    Channels(std::io::Error),
    #[error("could not hand a child's descriptors to the shim: {0}")]
    Handover(jail::Error),
    #[error("could not reach the Python process: {0}")]
    Unreachable(String),
    #[error("the Python process did not answer the fork in time")]
    NoAnswer,
    #[error("the Python process could not fork: {0}")]
    Refused(String),
    #[error("{forked} of {n} children forked")]
    Partial { forked: usize, n: usize },
    #[error("a child REPL did not start: {0}")]
    ChildStart(repl_host::session::SessionError),
    #[error("the shim could not adopt the children: {0}")]
    Adopt(jail::Error),
}

impl From<ForkError> for Error {
    fn from(e: ForkError) -> Error {
        Error::internal("could not fork the sandbox", e)
    }
}
