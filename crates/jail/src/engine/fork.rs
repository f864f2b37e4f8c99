//! The fork protocol: new members from a parent's snapshot, the hollow spares kept for the next fork, and handing the forked REPLs over.

use std::os::fd::BorrowedFd;

use super::*;

/// Why a solo sandbox's family takes no second member.
const SOLO_HAS_NO_SIBLINGS: &str =
    "a sandbox that keeps its processes is a family of one: its REPL cannot fork into new members (the service forks it through criu)";

impl Jail {
    /// Make `ids.len()` new members of `parent`'s family whose files are a
    /// snapshot of the parent's, taken while nothing in the parent can be
    /// halfway through a write. Their REPLs come from the parent's REPL
    /// (host pid `repl`) forking itself into their namespaces (see
    /// `ForkChild`); until then they have none.
    ///
    /// Members come from the family's *hollow* spares (namespaces and init
    /// built ahead of time, see `refill_hollows`) where there are some, else
    /// are built hollow now (names from `ids`); each then gets its root: a
    /// snapshot of the parent's layer, mounted in its own mount namespace.
    /// The roots are on their way when this returns (`Rooting`): the shim
    /// holds each child's hand-over until its member has one, so the REPL
    /// can fork meanwhile. When nothing but init and the idle REPL runs in
    /// the parent, even the snapshot is taken while the REPL forks
    /// (`quiet_for_snapshot`); otherwise the parent is frozen for it first.
    pub async fn fork_members(&self, parent: &Sandbox, ids: &[String], repl: Option<i32>) -> Result<(Vec<ForkChild>, Rooting)> {
        if parent.is_solo() {
            return Err(Error::Unsupported(SOLO_HAS_NO_SIBLINGS.into()));
        }
        let n = ids.len();
        let mut children: Vec<ForkChild> = {
            let mut spares = parent.family.hollows.lock().await;
            let k = n.min(spares.len());
            spares.drain(..k).collect()
        };
        self.forget_hollows(&children);
        if children.len() < n {
            let more = self.hollow_members(parent, &ids[..n - children.len()], &parent.limits()).await;
            match more {
                Ok(more) => children.extend(more),
                Err(e) => {
                    self.destroy_children(&children).await;
                    return Err(e);
                }
            }
        }
        match self.root_children(parent, &children, repl).await {
            Ok(rooting) => Ok((children, rooting)),
            Err(e) => {
                self.destroy_children(&children).await;
                Err(e)
            }
        }
    }

    async fn destroy_children(&self, children: &[ForkChild]) {
        for child in children {
            let _ = Box::pin(self.destroy(&child.sandbox)).await;
        }
    }

    /// Snapshot the parent's layer into each child's subvolume and ask the
    /// shim to attach it as each child's root. A shim older than
    /// `ROOTING_HOLDS_HANDOVERS` is waited for here.
    async fn root_children(&self, parent: &Sandbox, children: &[ForkChild], repl: Option<i32>) -> Result<Rooting> {
        // A hollow child has no subvolume yet: its disk limit comes with
        // its snapshot.
        let limits = parent.limits();
        for c in children {
            if c.sandbox.limits() != limits {
                c.sandbox.set_limits(&limits)?;
            }
        }
        let snapshots = Snapshots {
            volume: self.volume.clone(),
            src: parent.subvolume.clone(),
            dsts: children.iter().map(|c| c.sandbox.subvolume.clone()).collect(),
            limit: limits.disk_bytes,
        };
        let roots: Vec<Request> = children
            .iter()
            .map(|c| {
                let sub = &c.sandbox.subvolume;
                Request::RootMember { member: c.sandbox.id.clone(), upper: sub.join("upper"), work: sub.join("work") }
            })
            .collect();
        let shim = parent.shim();
        let quiet = match repl {
            Some(repl) if shim.protocol() >= HOLLOWS_HOLD_HANDOVERS => parent.quiet_for_snapshot(repl).await,
            _ => None,
        };
        if let Some(no_spawns) = quiet {
            // Nothing to freeze: snapshot while the REPL forks. New
            // processes wait (`no_spawns`) until the snapshot is taken.
            // Started here, not from the task below: a task waits for a
            // worker, and the REPL's fork would start before the snapshot.
            let taken = tokio::task::spawn_blocking(move || {
                let taken = snapshots.take();
                drop(no_spawns);
                taken
            });
            let task = tokio::spawn(async move {
                joined(taken.await)??;
                send_roots(&shim, roots).await
            });
            return Ok(Rooting(Roots::Snapshotting(task)));
        }
        // The parent is frozen only while its files are snapshotted (and
        // stays so if it was paused).
        let frozen = parent.cgroup.clone();
        let paused = Arc::clone(&parent.paused);
        let taken = tokio::task::spawn_blocking(move || -> Result<()> {
            let paused = paused.lock().unwrap_or_else(|e| e.into_inner());
            frozen.freeze()?;
            let taken = snapshots.take();
            if !*paused {
                frozen.thaw()?;
            }
            taken
        })
        .await;
        joined(taken)??;
        let rooting = Rooting(Roots::Sent(send_roots(&shim, roots).await?));
        if shim.protocol() < crate::shim::messages::ROOTING_HOLDS_HANDOVERS {
            rooting.wait().await?;
            return Ok(Rooting::done());
        }
        Ok(rooting)
    }

    /// Keep `target` hollow spares in `member`'s family, so its
    /// next fork only snapshots and attaches (called after a fork, in the
    /// background). Spares made for a family that has no other member left
    /// are destroyed at once.
    pub async fn refill_hollows(&self, member: &Sandbox, target: usize, new_id: &(dyn Fn() -> String + Sync)) -> Result<()> {
        let open = self.refills.read().await;
        if !*open || member.is_solo() {
            return Ok(());
        }
        let have = member.family.hollows.lock().await.len();
        if have >= target {
            return Ok(());
        }
        let ids: Vec<String> = (have..target).map(|_| new_id()).collect();
        let made = self.hollow_members(member, &ids, &member.limits()).await?;
        let family = &member.family;
        if let Ok(mut names) = self.hollow_ids.lock() {
            names.extend(made.iter().map(|c| c.sandbox.id.clone()));
        }
        family.hollows.lock().await.extend(made);
        self.release_idle_hollows(family).await;
        drop(open);
        Ok(())
    }

    /// No more refills: wait for those in flight (server shutdown, before
    /// the sandboxes are destroyed).
    pub async fn stop_refills(&self) {
        *self.refills.write().await = false;
    }

    /// If hollow spares are all a family has left, destroy them (the family
    /// and its shim go with the last).
    pub(super) async fn release_idle_hollows(&self, family: &Arc<FamilyHandle>) {
        let idle: Vec<ForkChild> = {
            let mut spares = family.hollows.lock().await;
            if family.members.load(std::sync::atomic::Ordering::SeqCst) > spares.len() {
                return;
            }
            spares.drain(..).collect()
        };
        self.forget_hollows(&idle);
        self.destroy_children(&idle).await;
    }

    fn forget_hollows(&self, children: &[ForkChild]) {
        if let Ok(mut names) = self.hollow_ids.lock() {
            for c in children {
                names.remove(&c.sandbox.id);
            }
        }
    }

    /// The hidden sandboxes the engine keeps: hollow fork spares.
    pub fn spare_ids(&self) -> Vec<String> {
        self.hollow_ids.lock().map(|n| n.iter().cloned().collect()).unwrap_or_default()
    }

    /// Hollow members of `sibling`'s family (no files yet): namespaces, init
    /// and cgroup, waiting for `root_children`.
    async fn hollow_members(&self, sibling: &Sandbox, ids: &[String], limits: &Limits) -> Result<Vec<ForkChild>> {
        self.new_members(sibling, ids, limits, true).await
    }

    /// New members of `sibling`'s family over fresh (template-only) files,
    /// waiting for a REPL like fork children do: the warm pool's spares.
    pub async fn spare_members(&self, sibling: &Sandbox, ids: &[String], limits: &Limits) -> Result<Vec<ForkChild>> {
        if sibling.is_solo() {
            return Err(Error::Unsupported(SOLO_HAS_NO_SIBLINGS.into()));
        }
        self.new_members(sibling, ids, limits, false).await
    }

    /// Before the parent's REPL (host pid `parent_repl`) forks itself into
    /// `child` as fork child `slot`: give the family's shim the descriptors
    /// that child gets besides its namespaces (`fds`: control socket,
    /// stdout and stderr write ends, then `child.self_join_fds()`). The
    /// shim copies them into the child itself once forked
    /// (`Request::ExpectFork`); the forking REPL never holds them.
    pub async fn expect_fork(&self, parent: &Sandbox, parent_repl: i32, slot: usize, child: &Sandbox, fds: &[BorrowedFd<'_>]) -> Result<()> {
        let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let request = Request::ExpectFork { parent_repl, slot, member: child.id.clone() };
        parent.shim().call(request, &raw).await.map(|_| ())
    }

    /// After the parent's REPL (host pid `parent_repl`) forked itself into
    /// `children` and each child said it is ready: move each into its
    /// cgroup and return (host pid, pidfd) per child.
    pub async fn adopt_forks(&self, parent: &Sandbox, parent_repl: i32, children: &[&Sandbox]) -> Result<Vec<(i32, OwnedFd)>> {
        let list = children.iter().map(|c| ForkedChild { member: c.id.clone(), cgroup_procs: c.cgroup.procs_files() }).collect();
        let (reply, fds) = parent.shim().call(Request::AdoptForks { parent_repl, children: list }, &[]).await?;
        match reply {
            Reply::Adopted { host_pids } if host_pids.len() == fds.len() => Ok(host_pids.into_iter().zip(fds).collect()),
            other => Err(Error::Protocol(format!("unexpected reply {other:?}"))),
        }
    }
}

/// The parent's layer and where each child's copy of it goes.
struct Snapshots {
    volume: Volume,
    src: PathBuf,
    dsts: Vec<PathBuf>,
    limit: u64,
}

impl Snapshots {
    /// All at once: concurrent snapshots share btrfs transaction commits.
    fn take(&self) -> Result<()> {
        let results: Vec<Result<()>> = std::thread::scope(|scope| {
            let jobs: Vec<_> = self.dsts.iter().map(|dst| scope.spawn(|| self.volume.snapshot(&self.src, dst, self.limit))).collect();
            jobs.into_iter().map(|j| j.join().unwrap_or_else(|_| Err(Error::Thread("snapshot thread panicked".into())))).collect()
        });
        results.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
    }
}

/// Ask the shim to move each member into its root (`RootMember`).
async fn send_roots(shim: &ShimHandle, roots: Vec<Request>) -> Result<Vec<crate::supervisor::Replying>> {
    let mut sent = Vec::with_capacity(roots.len());
    for req in roots {
        sent.push(shim.send(req, &[]).await?);
    }
    Ok(sent)
}

/// The roots of a fork's members on their way (`Jail::fork_members`).
/// Dropped, nothing waits for them; a member whose root failed is
/// destroyed with the fork (after `snapshots_done`).
pub struct Rooting(Roots);

enum Roots {
    /// `RootMember` sent to the shim: its answers.
    Sent(Vec<crate::supervisor::Replying>),
    /// The snapshots still being taken (while the REPL forks); then sent.
    Snapshotting(tokio::task::JoinHandle<Result<Vec<crate::supervisor::Replying>>>),
}

impl Rooting {
    /// Nothing left to wait for.
    pub fn done() -> Rooting {
        Rooting(Roots::Sent(Vec::new()))
    }

    /// Until every member has its root (or one failed).
    pub async fn wait(self) -> Result<()> {
        let sent = match self.0 {
            Roots::Sent(sent) => sent,
            Roots::Snapshotting(task) => joined(task.await)??,
        };
        futures::future::try_join_all(sent.into_iter().map(crate::supervisor::Replying::reply)).await.map(|_| ())
    }

    /// Until no snapshot into the members is being taken any more: before
    /// a failed fork destroys them, so no subvolume is made after its
    /// member is gone.
    pub async fn snapshots_done(&mut self) {
        if let Roots::Snapshotting(task) = &mut self.0 {
            let sent = task.await.ok().and_then(Result::ok).unwrap_or_default();
            self.0 = Roots::Sent(sent);
        }
    }
}

/// A new member made by `Jail::fork_members`, waiting for its REPL.
pub struct ForkChild {
    pub sandbox: Sandbox,
    /// Its mnt, net, uts, ipc and leaf pid namespaces (the shim hands its
    /// own copies to the forked REPL, see `Jail::expect_fork`).
    pub ns: Vec<OwnedFd>,
    /// Resolves with its REPL's exit status once that REPL dies.
    pub exited: oneshot::Receiver<ExitStatus>,
}

/// A finished task's result, its panic (or cancellation) as an error.
fn joined<T>(result: std::result::Result<T, tokio::task::JoinError>) -> Result<T> {
    result.map_err(|e| Error::Thread(format!("join: {e}")))
}
