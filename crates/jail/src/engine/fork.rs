//! The fork protocol: new members from a parent's snapshot, the hollow spares kept for the next fork, and handing the forked REPLs over.

use std::os::fd::BorrowedFd;

use super::*;

/// Why a solo sandbox's family takes no second member.
const SOLO_HAS_NO_SIBLINGS: &str =
    "a sandbox that keeps its processes is a family of one: its REPL cannot fork into new members (the service forks it through criu)";

impl Jail {
    /// Make `ids.len()` new members of `parent`'s family whose files are a
    /// snapshot of the parent's, taken while the parent is frozen. Their
    /// REPLs come from the parent's REPL forking itself into their
    /// namespaces (see `ForkChild`); until then they have none.
    ///
    /// Members come from the family's *hollow* spares (namespaces and init
    /// built ahead of time, see `refill_hollows`) where there are some, else
    /// are built hollow now (names from `ids`); each then gets its root: a
    /// snapshot of the parent's layer, mounted in its own mount namespace.
    /// The roots are on their way when this returns (`Rooting`): the shim
    /// holds each child's hand-over until its member has one, so the REPL
    /// can fork meanwhile.
    pub async fn fork_members(&self, parent: &Sandbox, ids: &[String]) -> Result<(Vec<ForkChild>, Rooting)> {
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
        match self.root_children(parent, &children).await {
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

    /// Snapshot the parent's layer (frozen) into each child's subvolume and
    /// ask the shim to attach it as each child's root. A shim older than
    /// `ROOTING_HOLDS_HANDOVERS` is waited for here.
    async fn root_children(&self, parent: &Sandbox, children: &[ForkChild]) -> Result<Rooting> {
        // A hollow child has no subvolume yet: its disk limit comes with
        // its snapshot.
        let limits = parent.limits();
        for c in children {
            if c.sandbox.limits() != limits {
                c.sandbox.set_limits(&limits)?;
            }
        }
        // The parent is frozen only while its files are snapshotted (and
        // stays so if it was paused).
        let frozen = parent.cgroup.clone();
        let paused = Arc::clone(&parent.paused);
        let dsts: Vec<PathBuf> = children.iter().map(|c| c.sandbox.subvolume.clone()).collect();
        let (volume, src) = (self.volume.clone(), parent.subvolume.clone());
        tokio::task::spawn_blocking(move || -> Result<()> {
            let paused = paused.lock().unwrap_or_else(|e| e.into_inner());
            frozen.freeze()?;
            // In parallel: concurrent snapshots share btrfs transaction commits.
            let results: Vec<Result<()>> = std::thread::scope(|scope| {
                let jobs: Vec<_> = dsts.iter().map(|dst| scope.spawn(|| volume.snapshot(&src, dst, limits.disk_bytes))).collect();
                jobs.into_iter().map(|j| j.join().unwrap_or_else(|_| Err(Error::Thread("snapshot thread panicked".into())))).collect()
            });
            if !*paused {
                frozen.thaw()?;
            }
            results.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
        })
        .await
        .map_err(|e| Error::Thread(format!("join: {e}")))??;
        let shim = parent.shim();
        let mut sent = Vec::with_capacity(children.len());
        for c in children {
            let sub = &c.sandbox.subvolume;
            let req = Request::RootMember { member: c.sandbox.id.clone(), upper: sub.join("upper"), work: sub.join("work") };
            sent.push(shim.send(req, &[]).await?);
        }
        let rooting = Rooting(sent);
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

/// The roots of a fork's members on their way (`Jail::fork_members`).
/// Dropped, nothing waits for them; a member whose root failed is
/// destroyed with the fork.
pub struct Rooting(Vec<crate::supervisor::Replying>);

impl Rooting {
    /// Nothing left to wait for.
    pub fn done() -> Rooting {
        Rooting(Vec::new())
    }

    /// Until every member has its root (or one failed).
    pub async fn wait(self) -> Result<()> {
        futures::future::try_join_all(self.0.into_iter().map(crate::supervisor::Replying::reply)).await.map(|_| ())
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
