//! Lazy restores (docs/state.md#lazy-resume): criu's `lazy-pages` daemon
//! fills a restored tree's memory when a page is first touched and copies
//! the rest in the background, so the tree runs before its pages are in.
//!
//! A restored task's userfaultfd is made in the task itself, which runs as
//! the sandbox's unprivileged host ids: the system call would need the
//! host-wide `vm.unprivileged_userfaultfd`. The patched criu (tools/criu.toml)
//! makes it from an open `/dev/userfaultfd` instead, which the shim (host
//! root) opens and hands to criu, and which criu closes in every task
//! before the task's own code runs again. The daemon only probes the device
//! and closes it.
//!
//! A daemon that dies before every page is in would leave the pages it had
//! not copied to be filled with zeros (the kernel drops a userfaultfd's
//! ranges when its last holder closes it). So the patched criu also sends
//! each task's userfaultfd to a socket of the shim's (its *keeper*), and
//! the shim holds them while the daemon works: a fault then waits instead,
//! and a daemon that fails has its tree killed before any fault is
//! answered. The daemon tells the shim (on a second socket) of each
//! userfaultfd a task's fork makes, which the shim holds too, and hands
//! each one back as it lets go of it, when its task's pages are all in or
//! the task is gone; the shim lets go of its copy then: a copy held on
//! would keep the task's ranges registered with nobody answering, and a
//! later fault (a heap grown, memory given back and touched again) would
//! wait until the daemon ends.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use crate::error::{Error, Result};
use crate::sys;

const DEVICE: &str = "/dev/userfaultfd";
/// Where the daemon writes its log, in the restore's image directory.
pub const LAZY_LOG: &str = "lazy-pages.log";
/// The descriptors the daemon gets: its readiness pipe, then the device,
/// then the socket it tells the shim of userfaultfds on.
const STATUS_FD: i32 = 10;
/// How long a daemon may take to listen.
const START_WAIT: Duration = Duration::from_secs(10);
/// The environment variable naming the keeper socket's descriptor
/// (tools/criu.toml).
const KEEPER_FD_ENV: &str = "CRIU_USERFAULTFD_KEEPER_FD";
/// The byte the daemon sends with a forked task's new userfaultfd; any
/// other (`L`) hands one back (tools/criu.toml).
const HOLD_TOO: u8 = b'H';

/// `/dev/userfaultfd`, open, when `criu` can restore lazily with it and
/// this host has it (Linux >= 6.1); else the restore reads every page first.
fn device(criu: &criu::Criu) -> Option<OwnedFd> {
    if !criu.lazy_pages {
        return None;
    }
    // (std opens it close-on-exec: it reaches criu only where placed.)
    std::fs::OpenOptions::new().read(true).write(true).open(DEVICE).ok().map(OwnedFd::from)
}

/// A `criu lazy-pages` daemon that listens for a restore, the keeper
/// socket the restore sends each task's userfaultfd to, and the socket the
/// daemon tells of forked tasks' userfaultfds and hands each back on.
pub struct Daemon {
    child: Child,
    /// `/dev/userfaultfd`, until the restore has run.
    device: Option<OwnedFd>,
    keeper: OwnedFd,
    /// The end criu writes to, until the restore has it.
    keeper_for_criu: Option<OwnedFd>,
    from_daemon: OwnedFd,
    /// Set once the daemon was seen to end during the restore.
    ended: Option<std::process::ExitStatus>,
}

/// Start the daemon for the images criu sees at `images` (`binds` as the
/// restore's), run as `id`, and wait until it listens. None when criu or
/// the host cannot restore lazily, or the daemon did not start: that costs
/// the restore its laziness, not its success.
pub fn start(criu: &criu::Criu, binds: &[(&Path, &Path)], images: &Path, id: u32) -> Option<Daemon> {
    let device = device(criu)?;
    start_with(criu, binds, images, id, device).inspect_err(|e| eprintln!("forkbox shim: restoring every page first: {e}")).ok()
}

fn start_with(criu: &criu::Criu, binds: &[(&Path, &Path)], images: &Path, id: u32, device: OwnedFd) -> Result<Daemon> {
    let (status_r, status_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| Error::sys("pipe", e))?;
    let (from_daemon, daemon_end) = socket_pair()?;
    // A shim slow to read must not stall the daemon: a send that would
    // block fails (a copy is then held until the daemon ends, or a fork's
    // userfaultfd is not held).
    daemon_end.set_nonblocking(true).map_err(|e| Error::io("make the daemon's keeper socket non-blocking", e))?;
    let mut command: Command = criu.command_as("lazy-pages", binds, id);
    command.arg("-D").arg(images).args(["-o", LAZY_LOG, "--status-fd", &STATUS_FD.to_string()]);
    command.env(criu::USERFAULTFD_DEV_FD_ENV, (STATUS_FD + 1).to_string());
    command.env(KEEPER_FD_ENV, (STATUS_FD + 2).to_string());
    command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    // A group of its own: criu forks helpers (usernsd) that inherit the
    // status pipe and outlive a daemon killed alone.
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let sources = [status_w.as_raw_fd(), device.as_raw_fd(), daemon_end.as_raw_fd()];
    // SAFETY: the closure runs between fork and exec and only makes system calls.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, move || sys::place_fds(&sources, STATUS_FD).map_err(std::io::Error::from));
    }
    let child = command.spawn().map_err(|e| Error::io("start criu lazy-pages", e))?;
    drop((status_w, daemon_end));
    let (keeper, keeper_for_criu) = socket_pair()?;
    let mut daemon = Daemon {
        child,
        keeper: keeper.into(),
        keeper_for_criu: Some(keeper_for_criu.into()),
        from_daemon: from_daemon.into(),
        ended: None,
        device: Some(device),
    };
    // criu writes one byte once it listens, and closes the pipe; a daemon
    // that dies first ends the wait (its helpers may hold the pipe open).
    let exited = sys::pidfd_open(Pid::from_raw(daemon.child.id() as i32)).map_err(|e| Error::sys("pidfd_open", e))?;
    let mut fds = [PollFd::new(status_r.as_fd(), PollFlags::POLLIN), PollFd::new(exited.as_fd(), PollFlags::POLLIN)];
    let polled = poll(&mut fds, PollTimeout::try_from(START_WAIT.as_millis() as i32).unwrap_or(PollTimeout::MAX));
    let ready = matches!(polled, Ok(n) if n > 0)
        && fds[0].revents().is_some_and(|r| r.contains(PollFlags::POLLIN))
        && nix::unistd::read(status_r.as_fd(), &mut [0u8; 1]).is_ok_and(|n| n == 1);
    if !ready {
        daemon.stop();
        return Err(Error::Setup("criu lazy-pages did not start".into()));
    }
    Ok(daemon)
}

impl Daemon {
    /// Give `command` (the restore) the device and the keeper, placed with
    /// the descriptors in `sources` from `first` on.
    pub fn hand_to(&mut self, command: &mut Command, sources: &mut Vec<i32>, first: i32) {
        let Some(device) = &self.device else {
            return;
        };
        command.arg("--lazy-pages");
        command.env(criu::USERFAULTFD_DEV_FD_ENV, (first + sources.len() as i32).to_string());
        sources.push(device.as_raw_fd());
        if let Some(end) = &self.keeper_for_criu {
            command.env(KEEPER_FD_ENV, (first + sources.len() as i32).to_string());
            sources.push(end.as_raw_fd());
        }
    }

    /// Why the restore must stop, if the daemon failed under it. (One
    /// that filled every page may end before the restore does.)
    pub fn died(&mut self) -> Option<String> {
        if self.ended.is_none() {
            self.ended = self.child.try_wait().ok().flatten();
        }
        self.ended.filter(|status| !status.success()).map(|status| format!("criu lazy-pages failed ({status}) during the restore"))
    }

    /// End a daemon whose restore failed.
    pub fn stop(&mut self) {
        self.device = None;
        if self.ended.is_none() {
            // The daemon leads its group: this kills it and its helpers.
            let _ = killpg(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }

    /// The restore is done: hold the userfaultfds it sent the keeper, of
    /// the tree whose init is `init`, and hand the rest of the daemon's
    /// life to the shim, which cleans `images_dir` (and `keep`) when it
    /// ends. None when the daemon already ended: done (every page is in),
    /// or failed, and then the tree is killed here.
    pub fn transfer(mut self, init: Pid, images_dir: PathBuf, keep: Box<dyn std::any::Any>) -> Option<Transfer> {
        (self.keeper_for_criu, self.device) = (None, None);
        let failed = self.died().is_some();
        let daemon = Pid::from_raw(self.child.id() as i32);
        let held = received_fds(&self.keeper).0.into_iter().map(|(_, fd)| fd).collect();
        // A pidfd: the tree's init may be gone and its pid reused by the time it is killed.
        let init = sys::pidfd_open(init).ok();
        let mut transfer = Transfer { daemon, init, images_dir, held, from_daemon: Some(self.from_daemon), _keep: keep, started: Instant::now() };
        transfer.hear_daemon();
        if self.ended.is_some() {
            transfer.finish(!failed);
            return None;
        }
        // The child is reaped by the shim's SIGCHLD handling, not by `Child`.
        std::mem::forget(self.child);
        Some(transfer)
    }
}

/// A restored tree whose pages the daemon is still copying.
pub struct Transfer {
    pub daemon: Pid,
    /// A pidfd of the restored tree's init (None if it was already gone).
    init: Option<OwnedFd>,
    images_dir: PathBuf,
    /// The shim's copies of the tree's userfaultfds the daemon still fills.
    held: Vec<OwnedFd>,
    /// Where the daemon tells of forked tasks' userfaultfds and hands each
    /// back when done with it; None once it hung up.
    from_daemon: Option<OwnedFd>,
    _keep: Box<dyn std::any::Any>,
    started: Instant,
}

impl Transfer {
    /// The socket to watch for [`Transfer::hear_daemon`], while the daemon has it open.
    pub fn daemon_socket(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.from_daemon.as_ref().map(|fd| fd.as_fd())
    }

    /// Hold the userfaultfds of tasks forked since, and let go of the
    /// copies of those the daemon handed back, in the order it sent them.
    pub fn hear_daemon(&mut self) {
        let Some(socket) = &self.from_daemon else {
            return;
        };
        let (sent, hung_up) = received_fds(socket);
        for (what, fd) in sent {
            if what == HOLD_TOO {
                self.held.push(fd);
            } else {
                self.held.retain(|held| !sys::same_file(held.as_fd(), fd.as_fd()));
            }
        }
        if hung_up {
            self.from_daemon = None;
        }
    }

    /// The daemon ended with `succeeded`: a tree it failed is killed while
    /// its faults still wait (its memory is not all there); then (on drop)
    /// the userfaultfds and the images go.
    pub fn finish(self, succeeded: bool) {
        // The daemon is reaped; what it forked must not outlive it.
        let _ = killpg(self.daemon, Signal::SIGKILL);
        if !succeeded {
            if let Some(init) = &self.init {
                let _ = sys::pidfd_send_signal(init.as_fd(), Signal::SIGKILL);
            }
            let log = std::fs::read_to_string(self.images_dir.join(LAZY_LOG)).unwrap_or_default();
            let errors: Vec<&str> = log.lines().filter(|l| l.contains("Error")).collect();
            eprintln!("forkbox shim: criu lazy-pages failed after {:?}; the restored tree was killed: {}", self.started.elapsed(), errors.join("; "));
        }
    }
}

impl Drop for Transfer {
    fn drop(&mut self) {
        self.held.clear();
        let _ = std::fs::remove_dir_all(&self.images_dir);
    }
}

fn socket_pair() -> Result<(std::os::unix::net::UnixStream, std::os::unix::net::UnixStream)> {
    std::os::unix::net::UnixStream::pair().map_err(|e| Error::io("socketpair", e))
}

/// Every descriptor queued on `sock`, each with the byte its message
/// carried (each of criu's sendmsg carries one of each), and whether its
/// peer has hung up.
fn received_fds(sock: &OwnedFd) -> (Vec<(u8, OwnedFd)>, bool) {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut fds = Vec::new();
    loop {
        let mut buf = [0u8; 64];
        let mut iov = [std::io::IoSliceMut::new(&mut buf)];
        let mut space = nix::cmsg_space!([std::os::fd::RawFd; 8]);
        let Ok(msg) = recvmsg::<()>(sock.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC) else {
            return (fds, false);
        };
        if msg.bytes == 0 {
            return (fds, true);
        }
        let mut got = Vec::new();
        for cmsg in msg.cmsgs().into_iter().flatten() {
            if let ControlMessageOwned::ScmRights(raw) = cmsg {
                // SAFETY: the kernel gave us these descriptors.
                got.extend(raw.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
            }
        }
        fds.extend(got.into_iter().map(|fd| (buf[0], fd)));
    }
}
