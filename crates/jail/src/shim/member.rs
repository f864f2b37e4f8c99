//! A member (one sandbox): an overlay root over the family's template, its
//! own mount, net, uts and ipc namespaces and a leaf pid namespace whose PID 1
//! is the member's init. All namespaces are owned by the family's user
//! namespace; the leaf is a child of the family's pid namespace, never of
//! another member's, so nothing nests per generation.

use std::fs;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{setns, unshare, CloneFlags};
use nix::sys::wait::waitpid;
use nix::unistd::{setresgid, setresuid, Gid, Pid, Uid};

use super::family::{open_ns, Family};
use super::init;
use super::messages::InitMessage;
use crate::channel;
use crate::error::{Error, Result};
use crate::sys::{self, Forked};

/// Namespaces of a member, held open by the shim.
pub struct MemberNs {
    pub mnt: OwnedFd,
    pub net: OwnedFd,
    pub uts: OwnedFd,
    pub ipc: OwnedFd,
    /// The leaf pid namespace (pid_for_children of the member's REPL).
    pub pid: OwnedFd,
}

impl MemberNs {
    /// The namespaces of the member whose init is host pid `init`, which
    /// is spared by the OOM killer (it must pick user processes, never init).
    pub fn of_init(init: Pid) -> Result<MemberNs> {
        let _ = fs::write(format!("/proc/{init}/oom_score_adj"), "-1000");
        Ok(MemberNs {
            mnt: open_ns(init, "mnt")?,
            net: open_ns(init, "net")?,
            uts: open_ns(init, "uts")?,
            ipc: open_ns(init, "ipc")?,
            pid: open_ns(init, "pid")?,
        })
    }
}

impl Member {
    /// What the server gets of a new member: a pidfd of its init, then its
    /// mnt, net, uts, ipc and leaf pid namespaces.
    pub fn reply_fds(&self) -> Result<Vec<OwnedFd>> {
        let mut fds = vec![sys::pidfd_open(self.init_pid).map_err(|e| Error::sys("pidfd_open init", e))?];
        for ns in [&self.ns.mnt, &self.ns.net, &self.ns.uts, &self.ns.ipc, &self.ns.pid] {
            fds.push(ns.try_clone().map_err(|e| Error::io("dup namespace", e))?);
        }
        Ok(fds)
    }
}

pub struct Member {
    pub root: PathBuf,
    pub ns: MemberNs,
    /// Seqpacket socket to the member's init.
    pub init: OwnedFd,
    /// Host pid of the member's init.
    pub init_pid: Pid,
}

/// The overlay for a member, mounted at `run_dir/name` in the current mount
/// namespace (the shim's own, or a hollow member's; see `root_member`).
pub fn mount_root(family: &Family, run_dir: &Path, name: &str, upper: &Path, work: &Path) -> Result<PathBuf> {
    let root = run_dir.join(name);
    match fs::create_dir(&root) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(Error::io("create root mount point", e)),
        _ => {}
    }
    // The layers by descriptor: the strings passed are what the sandbox's
    // /proc/self/mountinfo shows, and `/proc/self/fd/N` names no host path.
    // No file is made per member for it (links on the host's ext4 cost
    // the family's one thread an inode search each; docs/fork.md). Opened
    // here, in the namespace the overlay is mounted in: overlayfs takes no
    // layer mounted in another.
    let open = |dir: &Path| {
        rustix::fs::open(dir, rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty())
            .map_err(|e| Error::io("open overlay layer", e.into()))
    };
    let lowers = family.lowers.iter().map(|l| open(l)).collect::<Result<Vec<OwnedFd>>>()?;
    let (upper, work) = (open(upper)?, open(work)?);
    let by_fd = |fd: &OwnedFd| format!("/proc/self/fd/{}", fd.as_raw_fd());
    let lowerdir: Vec<String> = lowers.iter().map(by_fd).collect();
    let options = format!("lowerdir={},upperdir={},workdir={}", lowerdir.join(":"), by_fd(&upper), by_fd(&work));
    // After a rebuild the previous overlay on these layers may take a moment
    // to be released by the kernel (EBUSY: "upperdir in use").
    let mut tries = 0;
    let mounted = loop {
        match mount(Some("overlay"), &root, Some("overlay"), MsFlags::empty(), Some(options.as_str())) {
            Err(nix::errno::Errno::EBUSY) if tries < 200 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => break other,
        }
    };
    if let Err(e) = mounted {
        let _ = fs::remove_dir(&root);
        return Err(Error::sys("mount overlay", e));
    }
    Ok(root)
}

pub fn unmount_root(root: &Path) {
    let _ = umount2(root, MntFlags::MNT_DETACH);
    let _ = fs::remove_dir(root);
}

/// Join the cgroup, enter the family's user namespace as its root.
/// Runs in a forked child of the shim.
pub fn enter_family(family: &Family, cgroup_procs: &[PathBuf]) -> std::result::Result<(), String> {
    for file in cgroup_procs {
        fs::write(file, "0").map_err(|e| format!("join cgroup {}: {e}", file.display()))?;
    }
    // Supplementary groups of host root must not follow us in.
    nix::unistd::setgroups(&[]).map_err(|e| format!("setgroups: {e}"))?;
    setns(family.userns.as_fd(), CloneFlags::CLONE_NEWUSER).map_err(|e| format!("enter user namespace: {e}"))?;
    setresgid(Gid::from_raw(0), Gid::from_raw(0), Gid::from_raw(0)).map_err(|e| format!("setresgid: {e}"))?;
    setresuid(Uid::from_raw(0), Uid::from_raw(0), Uid::from_raw(0)).map_err(|e| format!("setresuid: {e}"))?;
    Ok(())
}

/// A member whose init is being set up (see `start` and `finish`).
pub struct Pending {
    root: PathBuf,
    /// Our end of the socket to the member's init; readable once init
    /// reported ready (or failed).
    pub sock: OwnedFd,
    helper: Pid,
}

/// Start building the member's namespaces and init; `finish` completes it
/// once `Pending::sock` is readable. Splitting the two lets the shim build
/// several members at once (their inits set up in parallel).
///
/// `root` is where the member's overlay is (or, for a hollow member, will
/// be) mounted; a hollow member's init waits for `InitRequest::Root`.
/// `policy`: the shim's sealed seccomp programs, which init reads instead
/// of compiling them (`sealed_policy`).
pub fn start(
    family: &Family,
    policy: BorrowedFd<'_>,
    hostname: &str,
    root: &Path,
    hollow: bool,
    cgroup_procs: &[PathBuf],
    shape: init::Shape,
) -> Result<Pending> {
    let (ours, theirs) = channel::pair()?;
    channel::pass_credentials(ours.as_fd())?;
    // SAFETY: the shim is single-threaded.
    match unsafe { sys::fork_with(0) }.map_err(|e| Error::sys("fork", e))? {
        Forked::Child => {
            drop(ours);
            let code = match build_in_child(family, policy, hostname, (!hollow).then_some(root), cgroup_procs, theirs, shape) {
                Ok(()) => 0,
                Err((sock, e)) => {
                    let _ = channel::send(sock.as_fd(), &InitMessage::SetupFailed { error: e }, &[]);
                    1
                }
            };
            // SAFETY: leaving a forked child without running the parent's destructors.
            unsafe { libc::_exit(code) }
        }
        Forked::Parent(helper) => {
            drop(theirs);
            Ok(Pending { root: root.to_path_buf(), sock: ours, helper })
        }
    }
}

/// Complete a member once its init said whether it is ready.
pub fn finish(pending: Pending, shape: init::Shape) -> Result<Member> {
    let Pending { root, sock: ours, helper } = pending;
    let first = channel::recv::<InitMessage>(ours.as_fd());
    let _ = waitpid(helper, None);
    let got = first?.ok_or_else(|| Error::Died("member init died during setup".into()))?;
    match got.msg {
        InitMessage::Ready => {
            let pid = Pid::from_raw(got.sender_pid.ok_or_else(|| Error::Protocol("init sent no credentials".into()))?);
            let ns = MemberNs::of_init(pid)?;
            let init = match shape {
                init::Shape::Pooled => ours,
                init::Shape::Solo => own_channel(&ours)?,
            };
            Ok(Member { root, ns, init, init_pid: pid })
        }
        InitMessage::SetupFailed { error } => Err(Error::Setup(error)),
        other => Err(Error::Protocol(format!("unexpected first message from init: {other:?}"))),
    }
}

/// The channel a solo member's init moved to (`InitMessage::Channel`).
fn own_channel(first: &OwnedFd) -> Result<OwnedFd> {
    let mut got = channel::recv::<InitMessage>(first.as_fd())?.ok_or_else(|| Error::Died("member init died during setup".into()))?;
    match got.msg {
        InitMessage::Channel if got.fds.len() == 1 => Ok(got.fds.remove(0)),
        other => Err(Error::Protocol(format!("expected init's channel, got {other:?}"))),
    }
}

/// In the forked helper: enter the family, then fork into the family's pid
/// namespace (so the new leaf becomes its child), unshare the member's
/// namespaces and fork init.
fn build_in_child(
    family: &Family,
    policy: BorrowedFd<'_>,
    hostname: &str,
    root: Option<&Path>,
    cgroup_procs: &[PathBuf],
    sock: OwnedFd,
    shape: init::Shape,
) -> std::result::Result<(), (OwnedFd, String)> {
    if let Err(e) = enter_family(family, cgroup_procs) {
        return Err((sock, e));
    }
    if let Err(e) = setns(family.pidns.as_fd(), CloneFlags::CLONE_NEWPID) {
        return Err((sock, format!("enter family pid namespace: {e}")));
    }
    // SAFETY: single-threaded (forked from the single-threaded shim).
    match unsafe { sys::fork_with(0) } {
        Err(e) => Err((sock, format!("fork into family: {e}"))),
        Ok(Forked::Parent(child)) => {
            drop(sock);
            let _ = waitpid(child, None);
            Ok(())
        }
        Ok(Forked::Child) => {
            let flags = CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWNET | CloneFlags::CLONE_NEWUTS | CloneFlags::CLONE_NEWIPC | CloneFlags::CLONE_NEWPID;
            if let Err(e) = unshare(flags) {
                let _ = channel::send(sock.as_fd(), &InitMessage::SetupFailed { error: format!("unshare: {e}") }, &[]);
                // SAFETY: leaving a forked child.
                unsafe { libc::_exit(1) }
            }
            // SAFETY: single-threaded.
            match unsafe { sys::fork_with(0) } {
                Ok(Forked::Child) => init::run(sock, policy, root, hostname, shape),
                Ok(Forked::Parent(_)) => {
                    // SAFETY: leaving a forked child; init is reparented to the reaper.
                    unsafe { libc::_exit(0) }
                }
                Err(e) => {
                    let _ = channel::send(sock.as_fd(), &InitMessage::SetupFailed { error: format!("fork init: {e}") }, &[]);
                    // SAFETY: leaving a forked child.
                    unsafe { libc::_exit(1) }
                }
            }
        }
    }
}

/// Enter a member's mount, net, uts and ipc namespaces (from a process
/// already in the family). The pid namespace for children is left to the
/// caller: the REPL keeps the family's (see repl/repl.py).
pub fn enter_member(ns: &MemberNs) -> std::result::Result<(), String> {
    for (fd, flag, what) in [
        (&ns.mnt, CloneFlags::CLONE_NEWNS, "mnt"),
        (&ns.net, CloneFlags::CLONE_NEWNET, "net"),
        (&ns.uts, CloneFlags::CLONE_NEWUTS, "uts"),
        (&ns.ipc, CloneFlags::CLONE_NEWIPC, "ipc"),
    ] {
        setns(fd.as_fd(), flag).map_err(|e| format!("enter {what} namespace: {e}"))?;
    }
    Ok(())
}
