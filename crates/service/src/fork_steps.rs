//! The two halves of a REPL fork (docs/fork.md, docs/repl-protocol.md, its fork section),
//! shared by a user's fork (`fork.rs`) and the warm pool's creates
//! (`pool.rs`): `fork_answered` needs the parent's REPL (descriptors to the
//! shim, the fork, its answer); `settle_fork` needs only the children
//! (their ready frames, the shim's adoption). Whatever fails on the way is
//! destroyed again: a user's fork makes all its children or none; the
//! pool's creates settle child by child (`settle_each`), so one slow or
//! failed child holds up or fails no other create.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use crate::engine::{Forked, Member, MemberRef};
use crate::error::Error;
use crate::state::Service;
use repl_host::session::ReplSession;

/// Longest wait for the parent REPL to answer a fork.
const FORK_ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// A fork its parent's REPL answered (`Service::fork_answered`): the
/// children are forked, and start on their own; `Service::settle_fork`
/// waits for them.
pub(crate) struct Answered {
    members: Vec<MemberRef>,
    children: Vec<ChildStart>,
    /// The forking REPL's host pid (the shim finds the children among its).
    parent_repl: i32,
}

/// The server's ends of one forked child's channels, and its exit.
struct ChildStart {
    control: std::os::unix::net::UnixStream,
    stdout: OwnedFd,
    stderr: OwnedFd,
    exited: tokio::sync::oneshot::Receiver<jail::ExitStatus>,
}

impl ChildStart {
    /// The child's session, once its REPL said it is ready.
    async fn start(self) -> Result<ReplSession, ForkError> {
        self.control.set_nonblocking(true).map_err(ForkError::Channels)?;
        let control = tokio::net::UnixStream::from_std(self.control).map_err(ForkError::Channels)?;
        let stdout = tokio::net::unix::pipe::Receiver::from_owned_fd(self.stdout).map_err(ForkError::Channels)?;
        let stderr = tokio::net::unix::pipe::Receiver::from_owned_fd(self.stderr).map_err(ForkError::Channels)?;
        ReplSession::start_forked(control, stdout, stderr, self.exited).await.map_err(ForkError::ChildStart)
    }
}

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
    /// Have the REPL of `session` (in `parent`) fork itself into the new
    /// members `made`: the first half of a fork, the part that needs the
    /// parent's REPL. `plan`: what the children must redo
    /// (jail::fork_plan), read from the REPL's /proc when None. On failure,
    /// at whichever step, every member in `made` is destroyed (here or by
    /// `settle_fork`, and only there). Here: hand the children's
    /// descriptors to the shim (as fork slots `first_slot`,
    /// `first_slot + 1`, …), have the REPL fork, take its answer. The REPL
    /// is free again when this returns; the children are still starting.
    /// `rooting`: their roots on the way, which a failure waits for before
    /// it destroys the members.
    pub(crate) async fn fork_answered(
        &self,
        session: &mut ReplSession,
        parent: &dyn Member,
        made: Vec<Forked>,
        plan: Option<&serde_json::Value>,
        first_slot: usize,
        rooting: &mut jail::Rooting,
    ) -> Result<Answered, Error> {
        let mut members = Vec::with_capacity(made.len());
        let mut rest = Vec::with_capacity(made.len());
        for Forked { member, ns, exited } in made {
            members.push(member);
            rest.push((ns, exited));
        }
        let children = self.answer_steps(session, parent, &members, rest, plan, first_slot).await;
        if children.is_err() {
            rooting.snapshots_done().await;
        }
        let children = self.or_discard(&members, children).await?;
        Ok(Answered { members, children, parent_repl: session.host_pid })
    }

    /// The second half of a fork: wait until each child REPL is
    /// ready and the shim adopted it.
    pub(crate) async fn settle_fork(&self, parent: &dyn Member, answered: Answered, rooting: jail::Rooting) -> Result<Vec<(MemberRef, ReplSession)>, Error> {
        let Answered { members, children, parent_repl } = answered;
        // The children take their namespaces once their members have their
        // roots (the shim holds their hand-overs until then).
        let sessions = match rooting.wait().await {
            Ok(()) => self.settle_steps(parent, parent_repl, &members, children).await,
            Err(e) => Err(ForkError::Root(e)),
        };
        let sessions = self.or_discard(&members, sessions).await?;
        Ok(members.into_iter().zip(sessions).collect())
    }

    /// A fork step's outcome; on failure the fork's members are destroyed
    /// first. Dropping the server's ends (gone with the failed step) makes
    /// any child REPL that did start exit; destroying the members frees the
    /// rest.
    async fn or_discard<T>(&self, members: &[MemberRef], outcome: Result<T, ForkError>) -> Result<T, Error> {
        if outcome.is_err() {
            self.discard_members(members).await;
        }
        outcome.map_err(Error::from)
    }

    /// Destroy fork members that will not become sandboxes.
    async fn discard_members(&self, members: &[MemberRef]) {
        for m in members {
            if let Err(e) = self.inner.engine.destroy(m.as_ref()).await {
                tracing::warn!(member = %m.id(), err = %e, "could not destroy a fork member");
            }
        }
    }

    /// `settle_fork` child by child: a future per child, in the fork's
    /// order, that settles that child alone (its REPL ready, the shim's
    /// adoption of it) and destroys it if it fails. The warm pool hands
    /// each create its sandbox as its future ends: under bench/load.py a
    /// batch of eight waited for its slowest child.
    pub(crate) fn settle_each<'a>(
        &'a self,
        parent: &'a dyn Member,
        answered: Answered,
    ) -> Vec<impl std::future::Future<Output = Result<(MemberRef, ReplSession), Error>> + 'a> {
        let Answered { members, children, parent_repl } = answered;
        let each = members.into_iter().zip(children).map(move |(member, child)| async move {
            let one = std::slice::from_ref(&member);
            let settled = self.settle_steps(parent, parent_repl, one, vec![child]).await;
            let session = self.or_discard(one, settled).await?.pop().ok_or_else(|| Error::Internal("a settled child has no session".into()))?;
            Ok((member, session))
        });
        each.collect()
    }

    /// The steps of `fork_answered`, in order; it cleans up after any of
    /// them failing.
    async fn answer_steps(
        &self,
        session: &mut ReplSession,
        parent: &dyn Member,
        members: &[MemberRef],
        rest: Vec<(Vec<OwnedFd>, tokio::sync::oneshot::Receiver<jail::ExitStatus>)>,
        plan: Option<&serde_json::Value>,
        first_slot: usize,
    ) -> Result<Vec<ChildStart>, ForkError> {
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
            let expected = members.iter().zip(&channels).zip(&joins).enumerate().map(|(i, ((member, ch), join))| {
                let fds: Vec<BorrowedFd<'_>> = ch.theirs.iter().chain(join).map(|fd| fd.as_fd()).collect();
                async move { engine.expect_fork(parent, parent_repl, first_slot + i, member.as_ref(), &fds).await }
            });
            futures::future::join_all(expected).await.into_iter().collect::<Result<Vec<()>, _>>().map_err(ForkError::Handover)?;
            joins.iter().map(|join| jail::fork_fds::count(join.len())).collect()
        };
        let answer = match session.send_fork(&plan, &counts, first_slot).await {
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
            starts.push(ChildStart { control: ch.control, stdout: ch.stdout, stderr: ch.stderr, exited });
        }
        match answer? {
            f if f.error.is_none() && f.pids.len() == n => Ok(starts),
            f => Err(f.error.map(ForkError::Refused).unwrap_or(ForkError::Partial { forked: f.pids.len(), n })),
        }
    }

    /// The steps of `settle_fork`, in order; it cleans up after any of
    /// them failing.
    async fn settle_steps(
        &self,
        parent: &dyn Member,
        parent_repl: i32,
        members: &[MemberRef],
        children: Vec<ChildStart>,
    ) -> Result<Vec<ReplSession>, ForkError> {
        let engine = &self.inner.engine;
        let starts = children.into_iter().map(ChildStart::start);
        let mut sessions = futures::future::join_all(starts).await.into_iter().collect::<Result<Vec<_>, _>>()?;
        let refs: Vec<&dyn Member> = members.iter().map(|s| s.as_ref()).collect();
        let adopted = engine.adopt_forks(parent, parent_repl, &refs).await.map_err(ForkError::Adopt)?;
        let mut deposits = Vec::with_capacity(members.len());
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
    #[error("a child's files could not be attached as its root: {0}")]
    Root(jail::Error),
}

impl From<ForkError> for Error {
    fn from(e: ForkError) -> Error {
        Error::internal("could not fork the sandbox", e)
    }
}
