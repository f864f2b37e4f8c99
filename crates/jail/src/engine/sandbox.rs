//! `Sandbox`, one member as the engine sees it: its limits and layers, the processes it runs, pause and resume, and its files and network.

use std::os::fd::AsFd;

use crate::cgroup::Cgroup;

use super::create::create_member_request;
use super::*;

/// One sandbox as the engine sees it.
pub struct Sandbox {
    /// The member's name in its family (the id it was created with; it
    /// stays the same when the server re-keys it after a merge).
    pub id: String,
    pub(super) family: Arc<FamilyHandle>,
    pub(super) template_rootfs: PathBuf,
    limits: StdMutex<Limits>,
    pub(super) cgroup: Cgroup,
    pub(super) subvolume: PathBuf,
    pub(super) volume: Volume,
    pub(super) next_command: std::sync::atomic::AtomicU64,
    /// A pidfd of the member's init; readable once init has exited.
    init_pidfd: StdMutex<Option<OwnedFd>>,
    /// Set once this member stopped counting towards its family.
    pub(super) released: std::sync::atomic::AtomicBool,
    /// Paused by request (`pause`); held while the freezer is changed, so a
    /// fork's own brief freeze never thaws a paused sandbox.
    pub(super) paused: Arc<StdMutex<bool>>,
    /// Mirror of `paused` readable without waiting for a fork's freeze.
    pub(super) paused_now: std::sync::atomic::AtomicBool,
    /// Held (read) while a command is asked for; a fork that snapshots
    /// without freezing holds it (write) so no process starts meanwhile
    /// (`quiet_for_snapshot`).
    pub(super) spawn_gate: Arc<tokio::sync::RwLock<()>>,
}

impl Sandbox {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        id: String,
        family: Arc<FamilyHandle>,
        template_rootfs: PathBuf,
        limits: Limits,
        cgroup: Cgroup,
        subvolume: PathBuf,
        volume: Volume,
        init_pidfd: Option<OwnedFd>,
    ) -> Sandbox {
        Sandbox {
            id,
            family,
            template_rootfs,
            limits: StdMutex::new(limits),
            cgroup,
            subvolume,
            volume,
            next_command: std::sync::atomic::AtomicU64::new(1),
            init_pidfd: StdMutex::new(init_pidfd),
            released: std::sync::atomic::AtomicBool::new(false),
            paused: Default::default(),
            paused_now: Default::default(),
            spawn_gate: Default::default(),
        }
    }

    pub(super) fn shim(&self) -> Arc<ShimHandle> {
        self.family.shim()
    }

    /// Whether it is a solo sandbox (`SandboxSpec::solo`).
    pub fn is_solo(&self) -> bool {
        self.family.config.solo
    }

    pub fn limits(&self) -> Limits {
        *self.limits.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Change the sandbox's resource limits (a warm spare handed out with
    /// the limits its create asked for). The disk limit is its subvolume's,
    /// once it has one.
    pub fn set_limits(&self, limits: &Limits) -> Result<()> {
        let have = self.limits();
        if have.cgroup_differs(limits) {
            self.cgroup.set_limits(limits)?;
        }
        if have.disk_bytes != limits.disk_bytes && self.subvolume.exists() {
            self.volume.set_limit(&self.subvolume, limits.disk_bytes)?;
        }
        *self.limits.lock().unwrap_or_else(|e| e.into_inner()) = *limits;
        Ok(())
    }

    /// The sandbox's filesystem as overlay layers on the host (for diff).
    /// Copy this sandbox's upper layer (every file it changed) to `dst`,
    /// owners made relative to its uid range. Pause it first for a
    /// consistent copy.
    pub fn export_upper(&self, dst: &Path) -> Result<crate::layer_copy::Copied> {
        let config = &self.family.config;
        let to_relative = crate::layer_copy::Shift { from: config.id_base, to: 0, count: config.id_count };
        crate::layer_copy::copy_tree(&self.subvolume.join("upper"), dst, &to_relative)
    }

    pub fn layers(&self) -> (PathBuf, PathBuf) {
        (self.subvolume.join("upper"), self.template_rootfs.clone())
    }

    /// Descriptors a forked REPL writes "0" to, to move itself into this
    /// sandbox's cgroup cheaply (v1 only; see `Cgroup::join_files`); the
    /// shim moves it otherwise.
    pub fn self_join_fds(&self) -> Vec<OwnedFd> {
        if self.cgroup.version() != crate::cgroup::Version::V1 {
            return Vec::new();
        }
        let open = |p: &PathBuf| std::fs::OpenOptions::new().write(true).open(p).ok().map(OwnedFd::from);
        let fds: Vec<OwnedFd> = self.cgroup.join_files().iter().filter_map(open).collect();
        if fds.len() == self.cgroup.join_files().len() {
            fds
        } else {
            Vec::new()
        }
    }

    /// Whether two sandboxes are members of the same family.
    pub fn same_family(&self, other: &Sandbox) -> bool {
        Arc::ptr_eq(&self.family, &other.family)
    }

    pub fn cgroup(&self) -> &Cgroup {
        &self.cgroup
    }

    /// Start the sandbox's REPL: `argv`/`env` run in the sandbox with the
    /// fd layout of docs/repl-protocol.md; `source` is offered on fd 4.
    pub async fn start_repl(&self, argv: Vec<String>, env: Vec<String>, cwd: &str, source: &[u8]) -> Result<ReplProcess> {
        let (stdout_r, stdout_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| Error::sys("pipe", e))?;
        let (stderr_r, stderr_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| Error::sys("pipe", e))?;
        let (ours, theirs) =
            if self.is_solo() { self.socketpair_inside()? } else { std::os::unix::net::UnixStream::pair().map_err(|e| Error::io("socketpair", e))? };
        let memfd = source_memfd(source)?;
        if self.is_solo() {
            // Owned by the sandbox's root, as what it makes is: criu
            // restores a file's owner, and host root is no owner inside.
            let root = Some(self.family.config.id_base);
            nix::unistd::fchown(&memfd, root.map(nix::unistd::Uid::from_raw), root.map(nix::unistd::Gid::from_raw))
                .map_err(|e| Error::sys("chown the REPL's source", e))?;
        }
        let theirs_fd = OwnedFd::from(theirs);
        let fds = [stdout_w.as_raw_fd(), stderr_w.as_raw_fd(), theirs_fd.as_raw_fd(), memfd.as_raw_fd()];
        let (exited_tx, exited_rx) = oneshot::channel();
        let shim = self.shim();
        shim.repl_exits.lock().await.insert(self.id.clone(), exited_tx);
        let req = Request::SpawnRepl { member: self.id.clone(), cgroup_procs: self.cgroup.join_files(), argv, env, cwd: cwd.to_string() };
        let (reply, mut reply_fds) = shim.call(req, &fds).await?;
        drop((stdout_w, stderr_w, theirs_fd, memfd));
        let host_pid = match reply {
            Reply::ReplSpawned { host_pid } => host_pid,
            other => return Err(Error::Protocol(format!("unexpected reply {other:?}"))),
        };
        let pidfd = reply_fds.pop().ok_or_else(|| Error::Protocol("no pidfd for the REPL".into()))?;
        ours.set_nonblocking(true).map_err(|e| Error::io("nonblocking", e))?;
        Ok(ReplProcess {
            control: tokio::net::UnixStream::from_std(ours).map_err(|e| Error::io("register control socket", e))?,
            stdout: tokio::net::unix::pipe::Receiver::from_owned_fd(stdout_r).map_err(|e| Error::io("register pipe", e))?,
            stderr: tokio::net::unix::pipe::Receiver::from_owned_fd(stderr_r).map_err(|e| Error::io("register pipe", e))?,
            pidfd,
            host_pid,
            exited: exited_rx,
        })
    }

    /// Run `argv` in the sandbox through its init (for bash calls), its
    /// stdin `/dev/null`.
    pub async fn spawn_command(&self, argv: Vec<String>, env: Vec<String>, cwd: &str) -> Result<CommandProcess> {
        self.spawn_piped(argv, env, cwd, false, RunAs::ROOT).await
    }

    /// Run `argv` as `run_as` through its init with its output on pipes, and
    /// its stdin on a pipe too when `stdin` (`CommandProcess::stdin`), else
    /// `/dev/null`.
    pub async fn spawn_piped(&self, argv: Vec<String>, env: Vec<String>, cwd: &str, stdin: bool, run_as: RunAs) -> Result<CommandProcess> {
        let pipe = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| Error::sys("pipe", e));
        let (stdout_r, stdout_w) = pipe()?;
        let (stderr_r, stderr_w) = pipe()?;
        let (stdin_r, stdin_w) = if stdin {
            let (r, w) = pipe()?;
            (r, Some(w))
        } else {
            (OwnedFd::from(std::fs::File::open("/dev/null").map_err(|e| Error::io("open /dev/null", e))?), None)
        };
        let launched = self.launch(argv, env, cwd, [stdin_r.as_raw_fd(), stdout_w.as_raw_fd(), stderr_w.as_raw_fd()], false, run_as).await?;
        let stdin = match stdin_w {
            Some(w) => Some(tokio::net::unix::pipe::Sender::from_owned_fd(w).map_err(|e| Error::io("register pipe", e))?),
            None => None,
        };
        Ok(CommandProcess {
            stdin,
            stdout: tokio::net::unix::pipe::Receiver::from_owned_fd(stdout_r).map_err(|e| Error::io("register pipe", e))?,
            stderr: tokio::net::unix::pipe::Receiver::from_owned_fd(stderr_r).map_err(|e| Error::io("register pipe", e))?,
            exited: launched.exited,
            started: launched.started,
            control: launched.control,
        })
    }

    /// Run `argv` as `run_as` on a new terminal of the sandbox's own devpts,
    /// as the leader of its session with the terminal as its controlling tty.
    pub async fn spawn_terminal(&self, argv: Vec<String>, env: Vec<String>, cwd: &str, size: crate::pty::Size, run_as: RunAs) -> Result<TerminalProcess> {
        let terminal = self.fs()?.open_terminal(size)?;
        let slave = terminal.slave.as_raw_fd();
        let launched = self.launch(argv, env, cwd, [slave, slave, slave], true, run_as).await?;
        drop(terminal.slave);
        Ok(TerminalProcess { master: terminal.master, exited: launched.exited, control: launched.control })
    }

    /// Have init start `argv` as `run_as` with `stdio` as fds 0-2 (a
    /// terminal when `tty`).
    async fn launch(&self, argv: Vec<String>, env: Vec<String>, cwd: &str, stdio: [i32; 3], tty: bool, run_as: RunAs) -> Result<Launched> {
        // Until the command is registered as on its way (see `spawn_gate`).
        let _gate = self.spawn_gate.read().await;
        let id = self.next_command.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let (started_tx, started_rx) = oneshot::channel();
        let shim = self.shim();
        let (argv, run_as) = run_as.for_protocol(shim.protocol(), argv);
        shim.commands.lock().await.insert((self.id.clone(), id), crate::supervisor::CommandWaiters { started: Some(started_tx), exited: tx });
        let req = Request::SpawnCommand { member: self.id.clone(), id, argv, env, cwd: cwd.to_string(), tty, run_as };
        if let Err(e) = shim.call(req, &stdio).await {
            shim.commands.lock().await.remove(&(self.id.clone(), id));
            return Err(e);
        }
        Ok(Launched { exited: rx, started: started_rx, control: CommandControl { shim, member: self.id.clone(), id } })
    }

    /// Close the member's network gate (docs/network.md#the-way-out-starts-on-first-use):
    /// its processes' network sockets wait from now on, and the answer
    /// resolves when the first one does; the caller then starts the way out
    /// and calls [`open_network`](Self::open_network). `None` from a family
    /// whose shim has no gates (an older one, adopted): start the way out
    /// ahead instead. The answer fails (the sender is dropped) if the
    /// member is destroyed or rebuilt first.
    pub async fn hold_network(&self) -> Result<Option<oneshot::Receiver<()>>> {
        let shim = self.shim();
        // A solo member has no notify filter to hold sockets with.
        if shim.protocol() < crate::shim::messages::NETWORK_GATES || self.is_solo() {
            return Ok(None);
        }
        let (tx, rx) = oneshot::channel();
        shim.network_wanted.lock().await.insert(self.id.clone(), tx);
        if let Err(e) = shim.call(Request::CloseNetwork { member: self.id.clone() }, &[]).await {
            shim.network_wanted.lock().await.remove(&self.id);
            return Err(e);
        }
        Ok(Some(rx))
    }

    /// Open the member's network gate: its waiting network sockets, and
    /// every later one, go through. A no-op for a family without gates.
    pub async fn open_network(&self) -> Result<()> {
        let shim = self.shim();
        shim.network_wanted.lock().await.remove(&self.id);
        if shim.protocol() < crate::shim::messages::NETWORK_GATES || self.is_solo() {
            return Ok(());
        }
        shim.call(Request::OpenNetwork { member: self.id.clone() }, &[]).await.map(|_| ())
    }

    /// Kill every process of the sandbox and build its namespaces and init
    /// again over the same files (after its init died, e.g. to `kill -1`
    /// from the REPL, or its supervisor died): the filesystem survives,
    /// processes do not.
    pub async fn rebuild(&self) -> Result<()> {
        kill_patiently_off_runtime(&self.cgroup, &self.id).await?;
        let shim = {
            let _one_at_a_time = self.family.restart.lock().await;
            let mut shim = self.shim();
            if shim.alive() {
                let _ = shim.call(Request::DestroyMember { member: self.id.clone() }, &[]).await;
                shim.network_wanted.lock().await.remove(&self.id);
            } else {
                // The supervisor died, and its family with it: start a new
                // one (the family's other members rebuild into it too).
                shim.shutdown().await;
                let config = &self.family.config;
                let range = crate::ids::IdRange { base: config.id_base, count: config.id_count };
                shim = ShimHandle::start(&self.family.launcher, config, range).await?;
                *self.family.shim.lock().unwrap_or_else(|e| e.into_inner()) = Arc::clone(&shim);
            }
            shim
        };
        let (_, fds) = shim.call(create_member_request(&self.id, &self.cgroup, &self.subvolume), &[]).await?;
        if let Ok(mut slot) = self.init_pidfd.lock() {
            *slot = fds.into_iter().next();
        }
        Ok(())
    }

    /// Wait up to `limit` for the member's init to be gone (after a failure
    /// that says it is dying: init exits only once every process of its pid
    /// namespace has). True when it is gone.
    pub async fn wait_init_gone(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        while self.init_alive() {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    /// Stop every process of the sandbox (cgroup freezer): no CPU, memory
    /// kept, until `resume`. Blocking.
    pub fn pause(&self) -> Result<()> {
        let mut paused = self.paused.lock().unwrap_or_else(|e| e.into_inner());
        self.cgroup.freeze()?;
        *paused = true;
        self.paused_now.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    /// Let a paused sandbox run on exactly where it stopped. Blocking.
    pub fn resume(&self) -> Result<()> {
        let mut paused = self.paused.lock().unwrap_or_else(|e| e.into_inner());
        if *paused {
            self.cgroup.thaw()?;
            *paused = false;
            self.paused_now.store(false, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(())
    }

    pub fn is_paused(&self) -> bool {
        self.paused_now.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The sandbox's root filesystem, opened for the host (the files API).
    /// Fails when the sandbox's init is gone (its root with it).
    pub fn fs(&self) -> Result<crate::fs::SandboxFs> {
        let root = self.open_init_proc("root", rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY)?;
        let config = &self.family.config;
        Ok(crate::fs::SandboxFs::new(root, config.id_base, config.id_count))
    }

    /// The sandbox's network namespace (for `setns` by one thread, to open
    /// sockets inside it, or by a child process such as `nft`).
    pub fn netns(&self) -> Result<OwnedFd> {
        self.open_init_proc("ns/net", rustix::fs::OFlags::RDONLY)
    }

    /// Connect to `port` on the sandbox's own loopback (the port proxy;
    /// see `ports::connect`).
    pub async fn connect_port(
        &self,
        port: u16,
        timeout: Duration,
    ) -> std::result::Result<(tokio::net::TcpStream, std::net::SocketAddr), crate::ports::PortError> {
        let netns = self.netns().map_err(|e| crate::ports::PortError::Unreachable(e.to_string()))?;
        crate::ports::connect(netns, port, timeout).await
    }

    /// Start `pasta` for the sandbox's network namespace (its way out; see
    /// `net::Pasta`). Blocking.
    pub fn start_pasta(&self) -> Result<crate::net::Pasta> {
        let netns = self.netns()?;
        let pid = self.init_pid()?;
        let pidfile = self.family.config.run_dir.join(format!("{}.pasta.pid", self.id));
        let pasta = crate::net::Pasta::start(pid, &pidfile)?;
        // pasta took a path; it must still name the namespace we hold (the
        // init's pid was not reused meanwhile).
        let same = match (rustix::fs::stat(format!("/proc/{pid}/ns/net").as_str()), rustix::fs::fstat(&netns)) {
            (Ok(a), Ok(b)) => a.st_ino == b.st_ino && a.st_dev == b.st_dev,
            _ => false,
        };
        if !same {
            pasta.stop();
            return Err(Error::Invalid("the sandbox's init went away while its network was set up".into()));
        }
        Ok(pasta)
    }

    /// A socketpair that belongs to the sandbox's network namespace: criu
    /// finds a unix socket only in the namespaces of the tree it dumps.
    /// Made on a thread of its own, which alone enters the namespace.
    fn socketpair_inside(&self) -> Result<(std::os::unix::net::UnixStream, std::os::unix::net::UnixStream)> {
        let netns = self.netns()?;
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| Error::sys("enter the sandbox's network namespace", e))?;
                    std::os::unix::net::UnixStream::pair().map_err(|e| Error::io("socketpair", e))
                })
                .join()
                .map_err(|_| Error::Thread("the socketpair thread panicked".into()))?
        })
    }

    /// Its init's pid on the host (while init lives).
    pub fn init_pid(&self) -> Result<i32> {
        let slot = self.init_pidfd.lock().unwrap_or_else(|e| e.into_inner());
        let pidfd = slot.as_ref().ok_or_else(|| Error::Invalid("the sandbox has no init".into()))?;
        crate::sys::pidfd_pid(pidfd.as_fd()).ok_or_else(|| Error::Invalid("the sandbox's init has exited".into()))
    }

    /// Open `/proc/<init>/<what>` of the member's init, making sure the pid
    /// still names that init afterwards (its pidfd is alive, so the pid was
    /// not reused in between).
    fn open_init_proc(&self, what: &str, flags: rustix::fs::OFlags) -> Result<OwnedFd> {
        let pid = self.init_pid()?;
        let fd = rustix::fs::open(format!("/proc/{pid}/{what}").as_str(), flags | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty())
            .map_err(|e| Error::io("open the sandbox init's /proc entry", e.into()))?;
        self.init_pid()?;
        Ok(fd)
    }

    /// Whether the member's init (and so the sandbox's namespaces) is alive.
    pub fn init_alive(&self) -> bool {
        let exited = self.init_pidfd.lock().ok().and_then(|slot| {
            slot.as_ref().map(|fd| {
                let mut fds = [nix::poll::PollFd::new(fd.as_fd(), nix::poll::PollFlags::POLLIN)];
                nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO).map(|n| n > 0).unwrap_or(true)
            })
        });
        exited == Some(false) && self.shim().alive()
    }
}

fn source_memfd(source: &[u8]) -> Result<OwnedFd> {
    use std::io::{Seek, Write};
    let fd = nix::sys::memfd::memfd_create(c"forkbox-repl", nix::sys::memfd::MFdFlags::MFD_CLOEXEC).map_err(|e| Error::sys("memfd_create", e))?;
    let mut file = std::fs::File::from(fd);
    file.write_all(source).map_err(|e| Error::io("write REPL source", e))?;
    file.rewind().map_err(|e| Error::io("rewind REPL source", e))?;
    Ok(OwnedFd::from(file))
}
