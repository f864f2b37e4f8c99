//! The per-family supervisor ("shim"): a small single-threaded process, one
//! per family, started by the server as `forkbox __shim <config>`. It owns the
//! family's namespaces, builds members, spawns their REPLs and commands, and
//! reports deaths. Being single-threaded it may fork freely; being separate
//! from the server, a crash here touches only this family.
//!
//! It lives in a private mount namespace, so the overlay and id-mapped mounts
//! it makes are never visible on the host and vanish with it.

mod confine;
mod family;
mod gate;
mod handover;
pub mod init;
mod lazy;
mod member;
pub mod messages;
mod move_edges;
mod restore;
mod sealed_policy;
pub(crate) mod solo;

use std::collections::{HashMap, HashSet};
use std::fs;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use nix::mount::{mount, MsFlags};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sched::{setns, unshare, CloneFlags};
use nix::sys::wait::waitpid;
use nix::unistd::{chdir, pipe, Pid};

use crate::channel;
use crate::error::{Error, Result};
use crate::sys::{self, Forked};
use confine::Confinement;
use family::Family;
use member::Member;
use messages::*;

/// The descriptor the server passes the shim's socket on.
pub const SHIM_SOCKET_FD: i32 = 3;

/// Highest pid + 1 in a sandbox's leaf pid namespace. A REPL lives in the
/// family pid namespace (docs/architecture.md#processes-and-namespaces) and sees the leaf's /proc; its own
/// family pid is chosen at or above this, so `/proc/<os.getpid()>` can never
/// be a different process of the sandbox (it does not exist instead).
pub const LEAF_PID_MAX: i32 = 1 << 21;

struct Shim {
    config: ShimConfig,
    /// The server's socket; None while the server is gone (orphaned).
    sock: Option<OwnedFd>,
    /// Where a new server connects to adopt an orphaned family
    /// (`run_dir/shim.sock`); None when the family ends with its server.
    listener: Option<OwnedFd>,
    /// False from a new server's connect until it says `Attached`: events
    /// wait in `queued` until its waiters are registered.
    attached: bool,
    /// Events that happened while no server was attached, oldest first.
    queued: std::collections::VecDeque<ShimMessage>,
    /// When the server went away (the grace period runs from here).
    orphaned_at: Option<std::time::Instant>,
    /// Duplicates of the server's ends of each member's REPL: member →
    /// (REPL host pid, [control, stdout, stderr]). They keep the REPL's
    /// peers open across a server restart.
    deposits: HashMap<String, (i32, Vec<OwnedFd>)>,
    family: Family,
    members: HashMap<String, Member>,
    /// REPL host pid → member. The shim is a child subreaper, so REPLs
    /// (whose spawning helper exits) become its children and it reaps them.
    repls: HashMap<i32, String>,
    /// REPLs forked from other REPLs (not our children): host pid →
    /// (member, pidfd). Their exit is seen on the pidfd and their status
    /// read from the zombie's /proc entry.
    forked: HashMap<i32, (String, OwnedFd)>,
    sigchld: nix::sys::signalfd::SignalFd,
    confinement: Confinement,
    /// `confinement`'s seccomp programs, for each member's init
    /// (`sealed_policy`).
    sealed_policy: OwnedFd,
    /// Seccomp listeners of the REPLs (shared with their forks), and the
    /// view of the family's processes their calls are vetted against.
    listeners: Vec<crate::notify::Listener>,
    family_view: crate::notify::ProcFamilyView,
    /// Fork children waiting for their descriptors (see `handover`).
    handovers: handover::HandOvers,
    /// Members whose network sockets wait for their way out (see `gate`).
    gates: gate::NetworkGates,
    /// Members whose init is still setting up, with the request to answer.
    creating: Vec<Creating>,
    /// Hollow members moving into their root → the request to answer.
    rooting: HashMap<String, u64>,
    /// Hollow members not yet asked to move into a root (`RootMember`): a
    /// fork may snapshot its parent while the REPL forks, so a child's
    /// hand-over can come first, and waits (see `handover`).
    unrooted: HashSet<String>,
    /// The shim's own mount namespace, to come back to from a member's.
    own_mnt: OwnedFd,
    /// REPLs that solo members' inits started (see `solo`).
    solo_repls: solo::SoloRepls,
    /// A lazily restored member's pages still coming in (see `lazy`), and
    /// the `PagesIn` requests to answer once they are.
    lazy: Option<lazy::Transfer>,
    pages_in: Vec<u64>,
}

struct Creating {
    req: u64,
    name: String,
    hollow: bool,
    root: std::path::PathBuf,
    pending: member::Pending,
}

/// Entry point of `forkbox __shim`. Never returns.
pub fn main(config_json: &str) -> ! {
    // SAFETY: the server passed the socket on this descriptor.
    let sock = unsafe { OwnedFd::from_raw_fd(SHIM_SOCKET_FD) };
    let code = match run(config_json, sock) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("forkbox shim: {e}");
            1
        }
    };
    std::process::exit(code)
}

fn run(config_json: &str, sock: OwnedFd) -> Result<()> {
    let config: ShimConfig = serde_json::from_str(config_json).map_err(|e| Error::Protocol(format!("bad config: {e}")))?;
    let _ = fcntl_cloexec(sock.as_raw_fd());
    unshare(CloneFlags::CLONE_NEWNS).map_err(|e| Error::sys("private mount namespace", e))?;
    let none: Option<&str> = None;
    mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none).map_err(|e| Error::sys("make / private", e))?;
    fs::create_dir_all(&config.run_dir).map_err(|e| Error::io("create run dir", e))?;
    let confinement = Confinement::load().map_err(|e| Error::Policy(e.to_string()))?;
    let sealed_policy = sealed_policy::seal(&confinement.seccomp).map_err(|e| Error::Policy(e.to_string()))?;
    // SAFETY: plain prctl.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let mut mask = nix::sys::signal::SigSet::empty();
    mask.add(nix::sys::signal::Signal::SIGCHLD);
    mask.thread_block().map_err(|e| Error::sys("block SIGCHLD", e))?;
    let sigchld = nix::sys::signalfd::SignalFd::with_flags(&mask, nix::sys::signalfd::SfdFlags::SFD_CLOEXEC | nix::sys::signalfd::SfdFlags::SFD_NONBLOCK)
        .map_err(|e| Error::sys("signalfd", e))?;
    let started = Family::create(config.id_base, config.id_count, &config.lower_layers(), &config.run_dir).and_then(|family| {
        match family_view(&family, &config.run_dir) {
            Ok(view) => Ok((family, view)),
            Err(e) => {
                family.terminate();
                Err(e)
            }
        }
    });
    let started = started.and_then(|(family, view)| match open_own_mnt() {
        Ok(own) => Ok((family, view, own)),
        Err(e) => {
            family.terminate();
            Err(e)
        }
    });
    let (family, family_view, own_mnt) = match started {
        Ok(f) => f,
        Err(e) => {
            let failed = ShimMessage::Reply { req: 0, reply: Reply::Failed { error: e.to_string() } };
            let _ = channel::send(sock.as_fd(), &failed, &[]);
            return Err(e);
        }
    };
    let listener = match orphan_listener(&config) {
        Ok(l) => l,
        Err(e) => {
            family.terminate();
            let failed = ShimMessage::Reply { req: 0, reply: Reply::Failed { error: e.to_string() } };
            let _ = channel::send(sock.as_fd(), &failed, &[]);
            return Err(e);
        }
    };
    channel::send(sock.as_fd(), &ShimMessage::Ready, &[])?;
    let mut shim = Shim {
        config,
        sock: Some(sock),
        listener,
        attached: true,
        queued: Default::default(),
        orphaned_at: None,
        deposits: HashMap::new(),
        family,
        members: HashMap::new(),
        repls: HashMap::new(),
        forked: HashMap::new(),
        sigchld,
        confinement,
        sealed_policy,
        listeners: Vec::new(),
        family_view,
        handovers: Default::default(),
        gates: Default::default(),
        creating: Vec::new(),
        rooting: HashMap::new(),
        unrooted: HashSet::new(),
        own_mnt,
        solo_repls: Default::default(),
        lazy: None,
        pages_in: Vec::new(),
    };
    let result = shim.serve();
    shim.family.terminate();
    for m in shim.members.values() {
        member::unmount_root(&m.root);
    }
    let _ = fs::remove_dir_all(&shim.config.run_dir);
    result
}

/// The socket an orphaned family waits on for a new server (only the
/// host's root can reach the run directory; sandboxes never see it).
fn orphan_listener(config: &ShimConfig) -> Result<Option<OwnedFd>> {
    if config.orphan_grace_ms == 0 {
        return Ok(None);
    }
    channel::listen(&config.run_dir.join(SHIM_SOCKET_NAME)).map(Some)
}

/// Most events kept for a server that has not come back yet.
const MAX_QUEUED_EVENTS: usize = 65536;

fn open_own_mnt() -> Result<OwnedFd> {
    fs::File::open("/proc/self/ns/mnt").map(OwnedFd::from).map_err(|e| Error::io("open own mount namespace", e))
}

/// A procfs of the family's pid namespace (REPLs name pids in it) and the
/// view that resolves them, for vetting the REPLs' signals.
fn family_view(family: &Family, run_dir: &std::path::Path) -> Result<crate::notify::ProcFamilyView> {
    let proc_dir = run_dir.join("proc");
    fs::create_dir_all(&proc_dir).map_err(|e| Error::io("create family proc dir", e))?;
    crate::notify::mount_family_proc(family.pidns.as_fd(), &proc_dir)?;
    crate::notify::ProcFamilyView::for_reaper(&proc_dir, family.reaper().as_raw()).map_err(|e| Error::io("family process view", e))
}

/// Whether a seccomp listener reports a hang-up (no process uses its
/// filter any more); a recv on it would never succeed again.
fn listener_hung_up(l: &crate::notify::Listener) -> bool {
    let mut fds = [PollFd::new(l.as_fd(), PollFlags::POLLIN)];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
        && fds[0].revents().is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL))
}

fn fcntl_cloexec(fd: i32) -> nix::Result<()> {
    // SAFETY: fcntl on an fd number.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return Err(nix::errno::Errno::last());
    }
    Ok(())
}

impl Shim {
    fn serve(&mut self) -> Result<()> {
        loop {
            if self.sock.is_none() && self.listener.is_none() {
                return Ok(()); // the server is gone and nobody may adopt us
            }
            let timeout = match self.orphaned_at {
                None => PollTimeout::NONE,
                Some(since) => {
                    let left = std::time::Duration::from_millis(self.config.orphan_grace_ms).saturating_sub(since.elapsed());
                    if left.is_zero() {
                        return Ok(()); // no server came back in time: the family ends
                    }
                    PollTimeout::try_from(left.as_millis().min(60_000) as i32 + 1).unwrap_or(PollTimeout::MAX)
                }
            };
            let names: Vec<String> = self.members.keys().cloned().collect();
            let forked: Vec<i32> = self.forked.keys().copied().collect();
            let listeners = self.listeners.len();
            let creating = self.creating.len();
            let handing: Vec<(i32, usize)> = self.handovers.watched().into_iter().map(|(p, s, _)| (p, s)).collect();
            let lazy_socket = self.lazy.as_ref().and_then(|t| t.daemon_socket());
            let lazy_watched = lazy_socket.is_some();
            let ready: Vec<bool> = {
                // The server's socket, or while orphaned the adoption socket.
                let first = match (&self.sock, &self.listener) {
                    (Some(sock), _) => sock.as_fd(),
                    (None, Some(listener)) => listener.as_fd(),
                    (None, None) => return Ok(()),
                };
                let mut fds = vec![PollFd::new(first, PollFlags::POLLIN), PollFd::new(self.sigchld.as_fd(), PollFlags::POLLIN)];
                for n in &names {
                    fds.push(PollFd::new(self.members[n].init.as_fd(), PollFlags::POLLIN));
                }
                for pid in &forked {
                    fds.push(PollFd::new(self.forked[pid].1.as_fd(), PollFlags::POLLIN));
                }
                for l in &self.listeners {
                    fds.push(PollFd::new(l.as_fd(), PollFlags::POLLIN));
                }
                for c in &self.creating {
                    fds.push(PollFd::new(c.pending.sock.as_fd(), PollFlags::POLLIN));
                }
                for (_, _, pidfd) in self.handovers.watched() {
                    fds.push(PollFd::new(pidfd, PollFlags::POLLIN));
                }
                if let Some(socket) = lazy_socket {
                    fds.push(PollFd::new(socket, PollFlags::POLLIN));
                }
                match poll(&mut fds, timeout) {
                    // POLLIN, or a hang-up (a listener whose filter nobody uses any more).
                    Ok(_) => fds.iter().map(|f| f.any().unwrap_or(false)).collect(),
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => return Err(Error::sys("poll", e)),
                }
            };
            // Before the daemon's end is reaped: what it sent first.
            if lazy_watched && ready[ready.len() - 1] {
                if let Some(transfer) = self.lazy.as_mut() {
                    transfer.hear_daemon();
                }
            }
            if ready[1] {
                while let Ok(Some(_)) = self.sigchld.read_signal() {}
                if !self.reap()? {
                    return Err(Error::Died("family reaper died".into()));
                }
            }
            for (i, name) in names.iter().enumerate() {
                if ready[2 + i] {
                    self.on_init_message(name)?;
                }
            }
            for (i, pid) in forked.iter().enumerate() {
                if ready[2 + names.len() + i] {
                    self.on_forked_exit(*pid)?;
                }
            }
            let first = 2 + names.len() + forked.len();
            let mut gone = Vec::new();
            for i in 0..listeners {
                if ready[first + i] {
                    // Nothing to receive (every process using the filter is
                    // gone: a hang-up) or an error retires the listener.
                    match self.listeners[i].serve_one(&self.family_view) {
                        Ok(Some(crate::notify::Served::HandOver(n, _, step))) => self.hand_over(i, n, step),
                        Ok(Some(crate::notify::Served::Socket(n))) => self.on_socket(i, n)?,
                        Ok(Some(_)) => {}
                        Ok(None) if listener_hung_up(&self.listeners[i]) => gone.push(i),
                        Ok(None) => {}
                        Err(_) => gone.push(i),
                    }
                }
            }
            for i in gone.into_iter().rev() {
                self.listeners.remove(i);
            }
            let first = first + listeners;
            for (i, (parent, slot)) in handing.iter().enumerate() {
                if ready[first + creating + i] {
                    self.handovers.child_gone(*parent, *slot);
                }
            }
            for i in (0..creating).rev() {
                if ready[first + i] {
                    self.on_member_ready(i)?;
                }
            }
            if ready[0] {
                let Some(sock) = &self.sock else {
                    self.accept_server();
                    continue;
                };
                match channel::recv::<Envelope>(sock.as_fd()) {
                    Ok(Some(env)) if matches!(env.msg.request, Request::Shutdown) => return Ok(()),
                    Ok(Some(env)) => self.on_request(env.msg, env.fds)?,
                    Err(Error::Sys { source: nix::errno::Errno::EAGAIN, .. }) => {}
                    // The server is gone without saying `Shutdown`: wait
                    // for a new one (or end, when nobody may adopt us).
                    Ok(None) | Err(_) => self.server_gone(),
                }
            }
        }
    }

    /// A step of a fork's descriptor hand-over (see `handover`).
    fn hand_over(&mut self, listener: usize, n: crate::notify::Notification, step: crate::notify::HandOver) {
        let call = handover::Call { listener: &self.listeners[listener], id: n.id, caller: n.pid };
        let members = handover::Members { all: &self.members, rooting: &self.rooting, unrooted: &self.unrooted };
        match step {
            crate::notify::HandOver::Give { slot, pid } => self.handovers.give(call, slot, pid, self.family_view.family_level(), &members),
            crate::notify::HandOver::Take { slot } => self.handovers.take(call, slot, &members),
        }
    }

    /// A network `socket` call: through, or waiting at its member's gate.
    /// Every network socket of the family comes here, so it is kept cheap
    /// (bench/egress.py): with no gate closed it goes through unread; else
    /// its caller's member is one `stat` of its mount namespace, and the
    /// notification is checked to be still pending only after (a pid is
    /// reused only once its caller is gone, and then it is not pending).
    fn on_socket(&mut self, listener: usize, n: crate::notify::Notification) -> Result<()> {
        let l = &self.listeners[listener];
        if self.gates.all_open() {
            let _ = l.respond(n.id, crate::notify::Verdict::Continue);
            return Ok(());
        }
        let mnt = proc_ns_inode(n.pid, "mnt");
        if !l.id_valid(n.id).unwrap_or(false) {
            return Ok(());
        }
        let Some(mnt) = mnt else {
            let _ = l.respond(n.id, crate::notify::Verdict::Continue);
            return Ok(());
        };
        match self.gates.on_socket(mnt, l, n.id) {
            gate::OnSocket::Tell(member) => self.send(ShimMessage::Event(ShimEvent::NetworkWanted { member }), &[]),
            gate::OnSocket::Through | gate::OnSocket::Wait => Ok(()),
        }
    }

    /// The mount-namespace inode by which `name`'s processes are known.
    fn member_mnt(&self, name: &str) -> Result<u64> {
        let m = self.members.get(name).ok_or_else(|| Error::Invalid(format!("no member {name}")))?;
        ns_inode(m.ns.mnt.as_fd())
    }

    fn server_gone(&mut self) {
        // Nobody would open the gates: what waits goes through (without a
        // way out); a new server closes them again when it adopts us.
        self.gates.open_all();
        self.sock = None;
        self.attached = false;
        self.orphaned_at = Some(std::time::Instant::now());
        if self.deposits.is_empty() {
            // Nothing a new server could take back (no REPL's ends were
            // handed over): a family its server was still making. End now,
            // rather than wait out the grace where a new server that looked
            // before this shim was listening would never find it.
            self.listener = None;
        }
    }

    /// A new server connected to the adoption socket: it gets replies at
    /// once, and the queued events once it says `Attached`.
    fn accept_server(&mut self) {
        let Some(listener) = &self.listener else { return };
        if let Ok(conn) = channel::accept(listener.as_fd()) {
            self.sock = Some(conn);
            self.attached = false;
            self.orphaned_at = None;
        }
    }

    /// Send to the server; an event waits while no server is attached, and
    /// a failed send means the server is gone (not a reason to end).
    fn send(&mut self, msg: ShimMessage, fds: &[i32]) -> Result<()> {
        let is_event = matches!(msg, ShimMessage::Event(_));
        let sent = match &self.sock {
            Some(sock) if self.attached || !is_event => channel::send(sock.as_fd(), &msg, fds).is_ok(),
            _ => false,
        };
        if !sent {
            if self.sock.is_some() && (self.attached || !is_event) {
                self.server_gone();
            }
            // A reply is for the server that asked; an event waits for the next.
            if is_event {
                self.queue(msg);
            }
        }
        Ok(())
    }

    fn queue(&mut self, msg: ShimMessage) {
        if self.queued.len() >= MAX_QUEUED_EVENTS {
            self.queued.pop_front();
        }
        self.queued.push_back(msg);
    }

    /// The new server registered its waiters: hand it what happened.
    fn flush_queued(&mut self) {
        self.attached = true;
        while let Some(msg) = self.queued.pop_front() {
            let _ = self.send(msg, &[]);
            if !self.attached {
                break;
            }
        }
    }

    /// Reap exited children; report REPLs. False when the reaper died.
    fn reap(&mut self) -> Result<bool> {
        use nix::sys::wait::{WaitPidFlag, WaitStatus};
        loop {
            let (pid, status) = match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => (pid, ExitStatus::Code(code)),
                Ok(WaitStatus::Signaled(pid, sig, _)) => (pid, ExitStatus::Signal(sig as i32)),
                Ok(WaitStatus::StillAlive) | Err(_) => return Ok(true),
                Ok(_) => continue,
            };
            if pid == self.family.reaper() {
                return Ok(false);
            }
            if self.lazy.as_ref().is_some_and(|t| t.daemon == pid) {
                if let Some(transfer) = self.lazy.take() {
                    transfer.finish(status == ExitStatus::Code(0));
                }
                for req in std::mem::take(&mut self.pages_in) {
                    self.reply(req, Ok((Reply::Done, vec![])))?;
                }
            }
            if let Some(member) = self.repls.remove(&pid.as_raw()) {
                self.forget_deposit(&member, pid.as_raw());
                self.send(ShimMessage::Event(ShimEvent::ReplExited { member, host_pid: pid.as_raw(), status: Some(status) }), &[])?;
            }
        }
    }

    /// A forked REPL is gone: report it with the status its zombie holds.
    fn on_forked_exit(&mut self, pid: i32) -> Result<()> {
        let Some((member, _pidfd)) = self.forked.remove(&pid) else {
            return Ok(());
        };
        let status = zombie_status(pid);
        self.forget_deposit(&member, pid);
        self.send(ShimMessage::Event(ShimEvent::ReplExited { member, host_pid: pid, status }), &[])
    }

    /// Find the children a REPL just forked (docs/architecture.md#processes-and-namespaces): each entered
    /// its member's mount namespace before it said it was ready, which is
    /// how we tell them apart. Move each into its member's cgroup and watch it.
    fn adopt_forks(&mut self, parent_repl: i32, children: &[ForkedChild]) -> Result<(Vec<i32>, Vec<OwnedFd>)> {
        let candidates = children_of(parent_repl);
        let mut host_pids = Vec::with_capacity(children.len());
        let mut pidfds = Vec::with_capacity(children.len());
        for child in children {
            let want = self.member_mnt(&child.member)?;
            let pid = candidates
                .iter()
                .copied()
                .find(|pid| proc_ns_inode(*pid, "mnt") == Some(want))
                .ok_or_else(|| Error::Died(format!("the forked REPL of {} is gone", child.member)))?;
            let pidfd = sys::pidfd_open(Pid::from_raw(pid)).map_err(|e| Error::sys("pidfd_open forked REPL", e))?;
            // The child normally moved itself (the cheap way, see
            // Cgroup::join_files); move it if it could not.
            if !in_cgroups(pid, &child.member, child.cgroup_procs.len()) {
                for file in &child.cgroup_procs {
                    fs::write(file, pid.to_string()).map_err(|e| Error::io("move forked REPL into its cgroup", e))?;
                }
            }
            let watch = pidfd.try_clone().map_err(|e| Error::io("dup pidfd", e))?;
            self.forked.insert(pid, (child.member.clone(), watch));
            host_pids.push(pid);
            pidfds.push(pidfd);
        }
        Ok((host_pids, pidfds))
    }

    fn on_init_message(&mut self, name: &str) -> Result<()> {
        let (got, mut fds) = match channel::recv::<InitMessage>(self.members[name].init.as_fd()) {
            Ok(Some(m)) => (m.msg, m.fds),
            _ => {
                // Init died: keep the member record (destroy cleans up) but
                // stop polling a dead socket.
                if let Some(m) = self.members.get_mut(name) {
                    let (dead, _) = channel::pair()?;
                    m.init = dead;
                }
                // A solo member's REPL died with its init (a dump ends
                // both), which can no longer say how.
                if let Some(host_pid) = self.solo_repls.forget_member(name) {
                    self.forget_deposit(name, host_pid);
                    self.send(ShimMessage::Event(ShimEvent::ReplExited { member: name.to_string(), host_pid, status: None }), &[])?;
                }
                return self.send(ShimMessage::Event(ShimEvent::InitExited { member: name.to_string() }), &[]);
            }
        };
        let member = name.to_string();
        match got {
            InitMessage::Started { id } => self.send(ShimMessage::Event(ShimEvent::CommandStarted { member, id }), &[]),
            InitMessage::ReplStarted { id, pid } => match self.solo_repls.started(id) {
                Some((req, _)) => self.on_solo_repl_started(req, &member, pid),
                None => Ok(()),
            },
            InitMessage::Exited { id, status } => match self.solo_repls.exited(&member, id) {
                Some(host_pid) => {
                    self.forget_deposit(&member, host_pid);
                    self.send(ShimMessage::Event(ShimEvent::ReplExited { member, host_pid, status: Some(status) }), &[])
                }
                None => self.send(ShimMessage::Event(ShimEvent::CommandExited { member, id, status }), &[]),
            },
            InitMessage::SpawnFailed { id, error } if id >= solo::FIRST_ID => match self.solo_repls.started(id) {
                Some((req, _)) => self.reply(req, Err(Error::Setup(error))),
                None => Ok(()),
            },
            InitMessage::SpawnFailed { id, error } => {
                tracing::debug!(%error, "spawn failed");
                self.send(ShimMessage::Event(ShimEvent::CommandExited { member, id, status: ExitStatus::Code(127) }), &[])
            }
            InitMessage::Listener if fds.len() == 1 => {
                let listener = crate::notify::Listener::new(fds.remove(0)).map_err(|e| Error::io("init's seccomp listener", e))?;
                self.listeners.push(listener);
                Ok(())
            }
            InitMessage::Rooted => match self.rooting.remove(&member) {
                Some(req) => {
                    self.handovers.rooted(&member, &self.members);
                    self.reply(req, Ok((Reply::Done, vec![])))
                }
                None => Ok(()),
            },
            InitMessage::SetupFailed { error } => match self.rooting.remove(&member) {
                Some(req) => {
                    // Its fork child never gets its namespaces.
                    self.handovers.forget_member(&member);
                    self.reply(req, Err(Error::Setup(error)))
                }
                None => Ok(()),
            },
            _ => Ok(()),
        }
    }

    fn on_request(&mut self, env: Envelope, fds: Vec<OwnedFd>) -> Result<()> {
        let req = env.req;
        match env.request {
            // Answered once the member's init is ready (see `on_member_ready`),
            // so several members' inits set up at once.
            Request::CreateMember { member, hostname, upper, work, cgroup_procs } => {
                let layers = upper.zip(work);
                match self.start_member(req, member, &hostname, layers.as_ref().map(|(u, w)| (u.as_path(), w.as_path())), &cgroup_procs) {
                    Ok(()) => Ok(()),
                    Err(e) => self.reply(req, Err(e)),
                }
            }
            Request::PagesIn if self.lazy.is_some() => {
                self.pages_in.push(req);
                Ok(())
            }
            // Answered once the member's init has moved into its root.
            Request::RootMember { member, upper, work } => match self.root_member(req, member, &upper, &work) {
                Ok(()) => Ok(()),
                Err(e) => self.reply(req, Err(e)),
            },
            Request::RestoreMember { member, upper, work, cgroup_procs, images, edges, criu_root, lazily } => {
                let asked = restore::Request {
                    name: &member,
                    upper: &upper,
                    work: &work,
                    cgroup_procs: &cgroup_procs,
                    images: &images,
                    edges: &edges,
                    criu_root: criu_root.as_deref(),
                    id_base: self.config.id_base,
                    lazily,
                };
                let result = self.restore_member(&asked);
                self.reply(req, result)
            }
            // A solo member's REPL is init's child: answered once init started it.
            Request::SpawnRepl { member, argv, env, cwd, .. } if self.config.solo => match self.spawn_solo_repl(req, &member, argv, env, cwd, &fds) {
                Ok(()) => Ok(()),
                Err(e) => self.reply(req, Err(e)),
            },
            request => {
                let result = self.handle(request, fds);
                self.reply(req, result)
            }
        }
    }

    /// Mount a hollow member's overlay in *its* mount namespace (so the
    /// mount is its own, not a locked copy of ours) and tell its init to
    /// move in.
    fn root_member(&mut self, req: u64, name: String, upper: &std::path::Path, work: &std::path::Path) -> Result<()> {
        let m = self.members.get(&name).ok_or_else(|| Error::Invalid(format!("no member {name}")))?;
        if self.rooting.contains_key(&name) {
            return Err(Error::Invalid(format!("member {name} is being given its root")));
        }
        setns(m.ns.mnt.as_fd(), CloneFlags::CLONE_NEWNS).map_err(|e| Error::sys("enter member mount namespace", e))?;
        let mounted = member::mount_root(&self.family, &self.config.run_dir, &name, upper, work);
        // Back home whatever happened: the shim's own mounts are in its namespace.
        setns(self.own_mnt.as_fd(), CloneFlags::CLONE_NEWNS).map_err(|e| Error::sys("return to the shim's mount namespace", e))?;
        let root = mounted?;
        channel::send(m.init.as_fd(), &InitRequest::Root { root }, &[])?;
        self.unrooted.remove(&name);
        self.rooting.insert(name, req);
        Ok(())
    }

    /// Build a solo member from criu's images (see `restore`).
    fn restore_member(&mut self, req: &restore::Request<'_>) -> Result<(Reply, Vec<OwnedFd>)> {
        if !self.config.solo || !self.members.is_empty() || !self.creating.is_empty() {
            return Err(Error::Invalid("only an empty solo family takes a restored member".into()));
        }
        let restored = restore::restore(&self.family, &self.config.run_dir, req)?;
        let mut fds = restored.member.reply_fds()?;
        let repl_host_pid = restored.repl.as_ref().map(|(pid, _)| *pid);
        if let Some((pid, ends)) = restored.repl {
            fds.push(sys::pidfd_open(Pid::from_raw(pid)).map_err(|e| Error::sys("pidfd_open REPL", e))?);
            fds.extend(ends);
            self.solo_repls.running(req.name, pid);
        }
        self.members.insert(req.name.to_string(), restored.member);
        self.lazy = restored.lazy;
        Ok((Reply::Restored { repl_host_pid }, fds))
    }

    /// Ask a solo member's init for its REPL (see `solo`).
    fn spawn_solo_repl(&mut self, req: u64, name: &str, argv: Vec<String>, env: Vec<String>, cwd: String, fds: &[OwnedFd]) -> Result<()> {
        let m = self.members.get(name).ok_or_else(|| Error::Invalid(format!("no member {name}")))?;
        if fds.len() != 4 {
            return Err(Error::Invalid("spawn repl needs 4 descriptors".into()));
        }
        let id = self.solo_repls.start(req, name);
        let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
        if let Err(e) = channel::send(m.init.as_fd(), &InitRequest::SpawnRepl { id, argv, env, cwd }, &raw) {
            self.solo_repls.started(id);
            return Err(e);
        }
        Ok(())
    }

    /// Init started a solo member's REPL as `leaf_pid`: answer its request
    /// as a pooled REPL's spawn is answered.
    fn on_solo_repl_started(&mut self, req: u64, name: &str, leaf_pid: i32) -> Result<()> {
        let found = self.members.get(name).and_then(|m| solo::host_pid_of(m.init_pid.as_raw(), leaf_pid));
        let opened = found
            .ok_or_else(|| Error::Died(format!("the REPL of {name} is gone")))
            .and_then(|pid| sys::pidfd_open(Pid::from_raw(pid)).map(|fd| (pid, fd)).map_err(|e| Error::sys("pidfd_open REPL", e)));
        match opened {
            Ok((host_pid, pidfd)) => {
                self.solo_repls.running(name, host_pid);
                self.reply(req, Ok((Reply::ReplSpawned { host_pid }, vec![pidfd])))
            }
            Err(e) => self.reply(req, Err(e)),
        }
    }

    fn reply(&mut self, req: u64, result: Result<(Reply, Vec<OwnedFd>)>) -> Result<()> {
        let (reply, out_fds) = result.unwrap_or_else(|e| (Reply::Failed { error: e.to_string() }, vec![]));
        let raw: Vec<i32> = out_fds.iter().map(|f| f.as_raw_fd()).collect();
        self.send(ShimMessage::Reply { req, reply }, &raw)
    }

    fn forget_deposit(&mut self, member: &str, repl: i32) {
        if self.deposits.get(member).is_some_and(|(pid, _)| *pid == repl) {
            self.deposits.remove(member);
        }
    }

    /// The host pid of `member`'s live REPL, if it has one.
    fn repl_of(&self, member: &str) -> Option<i32> {
        self.repls
            .iter()
            .find(|(_, m)| *m == member)
            .map(|(pid, _)| *pid)
            .or_else(|| self.forked.iter().find(|(_, (m, _))| m == member).map(|(pid, _)| *pid))
            .or_else(|| self.solo_repls.of(member))
    }

    /// Hand a member back to a new server (`Reattach`).
    fn reattach(&self, name: &str) -> Result<(Reply, Vec<OwnedFd>)> {
        let m = self.members.get(name).ok_or_else(|| Error::Invalid(format!("no member {name}")))?;
        let mut fds = vec![sys::pidfd_open(m.init_pid).map_err(|e| Error::sys("pidfd_open init", e))?];
        let repl = self.repl_of(name).filter(|pid| self.deposits.get(name).is_some_and(|(p, _)| p == pid));
        if let (Some(pid), Some((_, ends))) = (repl, self.deposits.get(name)) {
            fds.push(sys::pidfd_open(Pid::from_raw(pid)).map_err(|e| Error::sys("pidfd_open REPL", e))?);
            for end in ends {
                fds.push(end.try_clone().map_err(|e| Error::io("dup a deposited descriptor", e))?);
            }
        }
        Ok((Reply::Reattached { repl_host_pid: repl }, fds))
    }

    fn start_member(
        &mut self,
        req: u64,
        name: String,
        hostname: &str,
        layers: Option<(&std::path::Path, &std::path::Path)>,
        cgroup_procs: &[std::path::PathBuf],
    ) -> Result<()> {
        if self.members.contains_key(&name) || self.creating.iter().any(|c| c.name == name) {
            return Err(Error::Invalid(format!("member {name} exists")));
        }
        self.repls.retain(|_, mem| *mem != name);
        let root = match layers {
            Some((upper, work)) => member::mount_root(&self.family, &self.config.run_dir, &name, upper, work)?,
            // Hollow: its overlay is mounted by `root_member`, in its own namespace.
            None => self.config.run_dir.join(&name),
        };
        let shape = if self.config.solo { init::Shape::Solo } else { init::Shape::Pooled };
        match member::start(&self.family, self.sealed_policy.as_fd(), hostname, &root, layers.is_none(), cgroup_procs, shape) {
            Ok(pending) => {
                self.creating.push(Creating { req, name, hollow: layers.is_none(), root, pending });
                Ok(())
            }
            Err(e) => {
                member::unmount_root(&root);
                Err(e)
            }
        }
    }

    /// A member's init answered: finish the member and reply to its create.
    fn on_member_ready(&mut self, index: usize) -> Result<()> {
        let Creating { req, name, hollow, root, pending } = self.creating.remove(index);
        let shape = if self.config.solo { init::Shape::Solo } else { init::Shape::Pooled };
        let made = member::finish(pending, shape).and_then(|m| {
            // The server watches init through a pidfd: its death must be
            // known before the next request, not after.
            let fds = m.reply_fds()?;
            Ok((m, fds))
        });
        match made {
            Ok((m, fds)) => {
                if hollow {
                    self.unrooted.insert(name.clone());
                }
                self.members.insert(name, m);
                self.reply(req, Ok((Reply::Done, fds)))
            }
            Err(e) => {
                member::unmount_root(&root);
                self.reply(req, Err(e))
            }
        }
    }

    fn handle(&mut self, request: Request, fds: Vec<OwnedFd>) -> Result<(Reply, Vec<OwnedFd>)> {
        match request {
            Request::CreateMember { .. } | Request::RootMember { .. } | Request::RestoreMember { .. } => Err(Error::Invalid("answered in on_request".into())),
            Request::SpawnRepl { member: name, cgroup_procs, argv, env, cwd } => {
                let pidfd = self.spawn_repl(&name, &cgroup_procs, &argv, &env, &cwd, fds)?;
                Ok((Reply::ReplSpawned { host_pid: pidfd.0 }, vec![pidfd.1]))
            }
            Request::SpawnCommand { member: name, id, argv, env, cwd, tty, run_as } => {
                let m = self.members.get(&name).ok_or_else(|| Error::Invalid(format!("no member {name}")))?;
                let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
                channel::send(m.init.as_fd(), &InitRequest::Spawn { id, argv, env, cwd, tty, run_as }, &raw)?;
                Ok((Reply::Done, vec![]))
            }
            Request::SignalCommand { member: name, id, signal } => {
                let m = self.members.get(&name).ok_or_else(|| Error::Invalid(format!("no member {name}")))?;
                channel::send(m.init.as_fd(), &InitRequest::Signal { id, signal }, &[])?;
                Ok((Reply::Done, vec![]))
            }
            Request::AdoptForks { parent_repl, children } => {
                let (host_pids, pidfds) = self.adopt_forks(parent_repl, &children)?;
                Ok((Reply::Adopted { host_pids }, pidfds))
            }
            Request::Deposit { member, repl } => {
                let pid = self.repl_of(&member).filter(|p| *p == repl).ok_or_else(|| Error::Invalid(format!("member {member} no longer runs REPL {repl}")))?;
                if fds.len() != 3 {
                    return Err(Error::Invalid("a deposit is [control, stdout, stderr]".into()));
                }
                self.deposits.insert(member, (pid, fds));
                Ok((Reply::Done, vec![]))
            }
            Request::PagesIn => Ok((Reply::Done, vec![])),
            Request::ListMembers => {
                let members = self
                    .members
                    .iter()
                    .map(|(name, m)| MemberState {
                        member: name.clone(),
                        init_alive: nix::sys::signal::kill(m.init_pid, None).is_ok(),
                        repl: self.repl_of(name),
                    })
                    .collect();
                Ok((Reply::Members { members, protocol: messages::PROTOCOL }, vec![]))
            }
            Request::Reattach { member } => self.reattach(&member),
            Request::Attached => {
                self.flush_queued();
                Ok((Reply::Done, vec![]))
            }
            Request::Shutdown => Ok((Reply::Done, vec![])),
            Request::ExpectFork { parent_repl, slot, member } => {
                if !self.members.contains_key(&member) {
                    return Err(Error::Invalid(format!("no member {member}")));
                }
                if !self.repls.contains_key(&parent_repl) && !self.forked.contains_key(&parent_repl) {
                    return Err(Error::Invalid(format!("{parent_repl} is no REPL of this family")));
                }
                self.handovers.expect(parent_repl, slot, member, fds);
                Ok((Reply::Done, vec![]))
            }
            Request::CloseNetwork { member } => {
                let mnt = self.member_mnt(&member)?;
                self.gates.close(mnt, &member);
                Ok((Reply::Done, vec![]))
            }
            Request::OpenNetwork { member } => {
                let mnt = self.member_mnt(&member)?;
                self.gates.open(mnt);
                Ok((Reply::Done, vec![]))
            }
            Request::DestroyMember { member: name } => {
                if let Ok(mnt) = self.member_mnt(&name) {
                    self.gates.forget(mnt);
                }
                self.handovers.forget_member(&name);
                self.unrooted.remove(&name);
                // A fork that failed before its members had their roots.
                if let Some(req) = self.rooting.remove(&name) {
                    let _ = self.reply(req, Err(Error::Invalid(format!("member {name} was destroyed before it had its root"))));
                }
                let _ = self.solo_repls.forget_member(&name);
                self.deposits.remove(&name);
                if let Some(m) = self.members.remove(&name) {
                    self.repls.retain(|_, mem| *mem != name);
                    self.forked.retain(|_, (mem, _)| *mem != name);
                    member::unmount_root(&m.root);
                }
                Ok((Reply::Done, vec![]))
            }
        }
    }

    /// Fork a helper that enters the family and forks the REPL into the
    /// family's pid namespace, then into the member's other namespaces with
    /// pid_for_children = the member's leaf. Returns (host pid, pidfd).
    fn spawn_repl(
        &mut self,
        name: &str,
        cgroup_procs: &[std::path::PathBuf],
        argv: &[String],
        env: &[String],
        cwd: &str,
        fds: Vec<OwnedFd>,
    ) -> Result<(i32, OwnedFd)> {
        let m = self.members.get(name).ok_or_else(|| Error::Invalid(format!("no member {name}")))?;
        if fds.len() != 4 {
            return Err(Error::Invalid("spawn repl needs 4 descriptors".into()));
        }
        let (report_r, report_w) = pipe().map_err(|e| Error::sys("pipe", e))?;
        let (listener_r, listener_w) = channel::pair()?;
        // SAFETY: the shim is single-threaded.
        match unsafe { sys::fork_with(0) }.map_err(|e| Error::sys("fork", e))? {
            Forked::Child => {
                drop(report_r);
                drop(listener_r);
                let helper = ReplHelper { family: &self.family, member: m, cgroup_procs, argv, env, cwd, fds: &fds, listener_to: listener_w };
                let code = helper.run(report_w, &self.confinement);
                // SAFETY: leaving a forked child.
                unsafe { libc::_exit(code) }
            }
            Forked::Parent(helper) => {
                drop(report_w);
                drop(listener_w);
                let mut buf = [0u8; 4];
                let n = nix::unistd::read(report_r.as_fd(), &mut buf).unwrap_or(0);
                let _ = waitpid(helper, None);
                if n != 4 {
                    return Err(Error::Died("REPL helper failed before starting the REPL".into()));
                }
                let host_pid = i32::from_ne_bytes(buf);
                let pidfd = sys::pidfd_open(Pid::from_raw(host_pid)).map_err(|e| Error::sys("pidfd_open", e))?;
                self.repls.insert(host_pid, name.to_string());
                // The REPL hands over its seccomp listener right before it
                // execs (or the socket closes if it failed before that).
                match channel::recv::<String>(listener_r.as_fd()) {
                    Ok(Some(mut got)) if got.fds.len() == 1 => {
                        let listener = crate::notify::Listener::new(got.fds.remove(0)).map_err(|e| Error::io("seccomp listener", e))?;
                        self.listeners.push(listener);
                    }
                    _ => {
                        let _ = sys::pidfd_send_signal(pidfd.as_fd(), nix::sys::signal::Signal::SIGKILL);
                        return Err(Error::Died("the REPL could not install its seccomp filter".into()));
                    }
                }
                Ok((host_pid, pidfd))
            }
        }
    }
}

/// Host pids of the children of every thread of `pid`.
pub(crate) fn children_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            let text = fs::read_to_string(task.path().join("children")).unwrap_or_default();
            out.extend(text.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
        }
    }
    out
}

/// Whether `pid` is in `count` cgroups named `member` (one per hierarchy).
fn in_cgroups(pid: i32, member: &str, count: usize) -> bool {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let suffix = format!("/{member}");
    text.lines().filter(|l| l.ends_with(&suffix)).count() >= count
}

/// The inode number that identifies a namespace.
fn ns_inode(fd: std::os::fd::BorrowedFd<'_>) -> Result<u64> {
    nix::sys::stat::fstat(fd).map(|st| st.st_ino).map_err(|e| Error::sys("stat namespace", e))
}

fn proc_ns_inode(pid: i32, kind: &str) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(format!("/proc/{pid}/ns/{kind}")).ok().map(|m| m.ino())
}

/// The exit status a zombie holds (field 52 of /proc/<pid>/stat, in
/// waitpid's encoding); None once it was reaped.
fn zombie_status(pid: i32) -> Option<ExitStatus> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // After the comm field: state is field 3, exit_code is field 52.
    if fields.first() != Some(&"Z") {
        return None;
    }
    let raw: i32 = fields.get(52 - 3)?.parse().ok()?;
    Some(if raw & 0x7f == 0 { ExitStatus::Code((raw >> 8) & 0xff) } else { ExitStatus::Signal(raw & 0x7f) })
}

/// Fork the REPL with a family pid at or above LEAF_PID_MAX (falling back
/// to any pid where the kernel cannot place it there).
fn fork_repl() -> nix::Result<Forked> {
    let mut pid = LEAF_PID_MAX + 1 + (std::process::id() as i32 % 1000);
    loop {
        // SAFETY: the helper is single-threaded.
        match unsafe { sys::fork_with_pid(pid) } {
            Err(nix::errno::Errno::EEXIST) if pid < LEAF_PID_MAX + 100_000 => pid += 1,
            // SAFETY: as above.
            Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOSYS | nix::errno::Errno::EPERM) => return unsafe { sys::fork_with(0) },
            other => return other,
        }
    }
}

/// What the forked REPL helper needs: it enters the family and forks the
/// REPL into the member (see `Shim::spawn_repl`).
struct ReplHelper<'a> {
    family: &'a Family,
    member: &'a Member,
    cgroup_procs: &'a [std::path::PathBuf],
    argv: &'a [String],
    env: &'a [String],
    cwd: &'a str,
    fds: &'a [OwnedFd],
    /// Where the REPL sends its seccomp listener.
    listener_to: OwnedFd,
}

impl ReplHelper<'_> {
    fn run(self, report: OwnedFd, confinement: &Confinement) -> i32 {
        let ReplHelper { family, member: m, cgroup_procs, argv, env, cwd, fds, listener_to } = self;
        if let Err(e) = member::enter_family(family, cgroup_procs) {
            eprintln!("forkbox shim: {e}");
            return 1;
        }
        if let Err(e) = setns(family.pidns.as_fd(), CloneFlags::CLONE_NEWPID) {
            eprintln!("forkbox shim: enter family pid namespace: {e}");
            return 1;
        }
        match fork_repl() {
            Ok(Forked::Parent(pid)) => {
                let _ = nix::unistd::write(report.as_fd(), &pid.as_raw().to_ne_bytes());
                0
            }
            Ok(Forked::Child) => {
                drop(report);
                if let Err(e) = member::enter_member(&m.ns) {
                    let msg = format!("forkbox: {e}\n");
                    let _ = nix::unistd::write(fds[1].as_fd(), msg.as_bytes());
                    return 1;
                }
                // fds: 0 = /dev/null inside, 1/2 = pipes, 3 = control, 4 = source.
                let null = match fs::File::open("/dev/null") {
                    Ok(f) => OwnedFd::from(f),
                    Err(_) => return 1,
                };
                // 5 and 6: the family's and the member's pid namespaces, between
                // which the REPL switches its pid_for_children (repl/repl.py).
                let sources = [
                    null.as_raw_fd(),
                    fds[0].as_raw_fd(),
                    fds[1].as_raw_fd(),
                    fds[2].as_raw_fd(),
                    fds[3].as_raw_fd(),
                    family.pidns.as_raw_fd(),
                    m.ns.pid.as_raw_fd(),
                    listener_to.as_raw_fd(),
                ];
                let _ = sys::place_fds(&sources, 0);
                sys::close_fds_from(confine::LISTENER_SOCKET_FD + 1);
                let _ = fcntl_cloexec(confine::LISTENER_SOCKET_FD);
                if chdir(cwd).is_err() {
                    let _ = chdir("/");
                }
                let err = confinement.exec(confine::Role::Repl, argv, env);
                let msg = format!("forkbox: {err}\n");
                // SAFETY: writing to stderr and leaving the forked child.
                unsafe {
                    libc::write(2, msg.as_ptr().cast(), msg.len());
                    libc::_exit(127)
                }
            }
            Err(e) => {
                eprintln!("forkbox shim: fork repl: {e}");
                1
            }
        }
    }
}
