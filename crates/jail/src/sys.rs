//! Thin, safe wrappers over the few Linux syscalls that `nix` does not cover
//! (the new mount API, pidfds, fork-with-namespace-flags). Each returns
//! `nix::Result` so callers use one error type for all syscalls.

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use nix::errno::Errno;
use nix::unistd::Pid;

fn cstr(path: &Path) -> nix::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)
}

fn check(ret: libc::c_long) -> nix::Result<libc::c_long> {
    if ret < 0 {
        Err(Errno::last())
    } else {
        Ok(ret)
    }
}

/// `open_tree(AT_FDCWD, path, OPEN_TREE_CLONE | AT_RECURSIVE)`: a detached copy
/// of the mount tree at `path`, to be changed and attached elsewhere.
pub fn open_tree_clone(path: &Path) -> nix::Result<OwnedFd> {
    let p = cstr(path)?;
    let flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC | libc::AT_RECURSIVE as libc::c_uint;
    // SAFETY: `p` is a valid NUL-terminated string that outlives the call.
    let fd = check(unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, p.as_ptr(), flags) })?;
    // SAFETY: the kernel returned a new file descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Make the detached mount `tree` id-mapped through the user namespace
/// `userns` (on-disk uid 0 appears as that namespace's uid 0) and read-only.
pub fn mount_setattr_idmap(tree: BorrowedFd<'_>, userns: BorrowedFd<'_>, read_only: bool) -> nix::Result<()> {
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    const MOUNT_ATTR_RDONLY: u64 = 0x1;
    const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP | if read_only { MOUNT_ATTR_RDONLY } else { 0 },
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    let empty = c"";
    // SAFETY: `attr` is a properly laid out `struct mount_attr` whose size we pass.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })?;
    Ok(())
}

/// Attach the detached mount `tree` at `target`.
pub fn move_mount_to(tree: BorrowedFd<'_>, target: &Path) -> nix::Result<()> {
    let t = cstr(target)?;
    let empty = c"";
    // SAFETY: both strings are valid for the duration of the call.
    check(unsafe { libc::syscall(libc::SYS_move_mount, tree.as_raw_fd(), empty.as_ptr(), libc::AT_FDCWD, t.as_ptr(), libc::MOVE_MOUNT_F_EMPTY_PATH) })?;
    Ok(())
}

/// A pidfd for `pid` (a pid in the caller's pid namespace).
pub fn pidfd_open(pid: Pid) -> nix::Result<OwnedFd> {
    // SAFETY: plain syscall with integer arguments.
    let fd = check(unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) })?;
    // SAFETY: the kernel returned a new descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Send `signal` through a pidfd (race-free against pid reuse).
pub fn pidfd_send_signal(pidfd: BorrowedFd<'_>, signal: nix::sys::signal::Signal) -> nix::Result<()> {
    // SAFETY: plain syscall; a null siginfo means "as kill(2) would".
    check(unsafe { libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), signal as libc::c_int, std::ptr::null::<libc::siginfo_t>(), 0) })?;
    Ok(())
}

/// The pid (in our pid namespace) a pidfd names, or None once the process
/// has exited (the kernel then reports -1).
pub fn pidfd_pid(pidfd: BorrowedFd<'_>) -> Option<i32> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd())).ok()?;
    let pid: i32 = info.lines().find_map(|l| l.strip_prefix("Pid:"))?.trim().parse().ok()?;
    (pid > 0).then_some(pid)
}

/// Whether two descriptors of this process name the same open file
/// (`kcmp(KCMP_FILE)`): anonymous-inode files such as userfaultfds all
/// share one inode, so their stat cannot tell them apart.
pub fn same_file(a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> bool {
    const KCMP_FILE: libc::c_int = 0;
    let me = std::process::id() as libc::pid_t;
    // SAFETY: plain syscall with integer arguments.
    unsafe { libc::syscall(libc::SYS_kcmp, me, me, KCMP_FILE, a.as_raw_fd(), b.as_raw_fd()) == 0 }
}

/// What `fork_with` returns in each process.
pub enum Forked {
    Parent(Pid),
    Child,
}

/// `clone(flags | SIGCHLD)` with fork semantics (no shared memory, the child
/// continues on a copy of the caller's stack). Used to create a process
/// directly in new namespaces.
///
/// # Safety
/// As for `fork(2)`: the caller must be single-threaded, or the child must
/// only call async-signal-safe functions.
pub unsafe fn fork_with(flags: libc::c_int) -> nix::Result<Forked> {
    // SAFETY: the caller upholds fork's contract; a null stack with no CLONE_VM
    // makes clone behave like fork.
    let ret = check(unsafe { libc::syscall(libc::SYS_clone, (flags | libc::SIGCHLD) as libc::c_ulong, 0usize, 0usize, 0usize, 0usize) })?;
    Ok(if ret == 0 { Forked::Child } else { Forked::Parent(Pid::from_raw(ret as i32)) })
}

/// Close every descriptor from `first` up, except those listed in `keep`
/// (which must all be below `first`).
pub fn close_fds_from(first: RawFd) {
    // SAFETY: close_range only closes descriptors; no memory is touched.
    unsafe {
        libc::syscall(libc::SYS_close_range, first as libc::c_uint, libc::c_uint::MAX, 0 as libc::c_uint);
    }
}

/// `prctl(PR_SET_PDEATHSIG, sig)`.
pub fn set_parent_death_signal(sig: nix::sys::signal::Signal) -> nix::Result<()> {
    // SAFETY: plain prctl with integer arguments.
    check(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong, 0, 0, 0) } as libc::c_long)?;
    Ok(())
}

/// `prctl(PR_SET_DUMPABLE, 0)`: nobody without CAP_SYS_PTRACE may inspect us.
pub fn set_not_dumpable() -> nix::Result<()> {
    // SAFETY: plain prctl with integer arguments.
    check(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } as libc::c_long)?;
    Ok(())
}

/// `prctl(PR_SET_NO_NEW_PRIVS, 1)`.
pub fn set_no_new_privs() -> nix::Result<()> {
    // SAFETY: plain prctl with integer arguments.
    check(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } as libc::c_long)?;
    Ok(())
}

/// Bring the loopback interface of the caller's network namespace up.
pub fn loopback_up() -> nix::Result<()> {
    // SAFETY: socket/ioctl/close on a descriptor we own, with a zeroed ifreq
    // whose name we fill with a NUL-terminated "lo".
    unsafe {
        let sock = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if sock < 0 {
            return Err(Errno::last());
        }
        let mut req: libc::ifreq = std::mem::zeroed();
        req.ifr_name[0] = b'l' as libc::c_char;
        req.ifr_name[1] = b'o' as libc::c_char;
        let mut res = libc::ioctl(sock, libc::SIOCGIFFLAGS, &mut req);
        if res == 0 {
            req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            res = libc::ioctl(sock, libc::SIOCSIFFLAGS, &req);
        }
        let err = Errno::last();
        libc::close(sock);
        if res != 0 {
            return Err(err);
        }
    }
    Ok(())
}

/// `dup2(old, new)`: `new` becomes a copy of `old` without close-on-exec.
/// When `old == new`, only clears close-on-exec.
pub fn dup_to(old: RawFd, new: RawFd) -> nix::Result<()> {
    if old == new {
        // SAFETY: fcntl on a descriptor number; no memory involved.
        check(unsafe { libc::fcntl(old, libc::F_SETFD, 0) } as libc::c_long)?;
        return Ok(());
    }
    // SAFETY: dup2 only manipulates the descriptor table.
    check(unsafe { libc::dup2(old, new) } as libc::c_long)?;
    Ok(())
}

/// Place `sources` on descriptors `first`, `first + 1`, … (without
/// close-on-exec). Each is first copied above every target, so no dup2
/// clobbers a source that sits on a target number; the copies are
/// close-on-exec. Allocates nothing (safe between fork and exec); at most
/// 16 sources.
pub fn place_fds(sources: &[RawFd], first: RawFd) -> nix::Result<()> {
    let mut high = [-1; 16];
    if sources.len() > high.len() {
        return Err(Errno::EINVAL);
    }
    let above = first + sources.len() as RawFd;
    for (slot, fd) in high.iter_mut().zip(sources) {
        // SAFETY: fcntl duplicating a descriptor we hold.
        *slot = check(unsafe { libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, above) } as libc::c_long)? as RawFd;
    }
    for (i, fd) in high[..sources.len()].iter().enumerate() {
        dup_to(*fd, first + i as RawFd)?;
    }
    Ok(())
}

/// `clone3` with fork semantics that gives the child the pid `pid` in the
/// caller's pid_for_children namespace (needs CAP_SYS_ADMIN over it).
///
/// # Safety
/// As for `fork(2)`: the caller must be single-threaded.
pub unsafe fn fork_with_pid(pid: i32) -> nix::Result<Forked> {
    #[repr(C)]
    #[derive(Default)]
    struct CloneArgs {
        flags: u64,
        pidfd: u64,
        child_tid: u64,
        parent_tid: u64,
        exit_signal: u64,
        stack: u64,
        stack_size: u64,
        tls: u64,
        set_tid: u64,
        set_tid_size: u64,
        cgroup: u64,
    }
    let tids = [pid as libc::pid_t];
    let args = CloneArgs { exit_signal: libc::SIGCHLD as u64, set_tid: tids.as_ptr() as u64, set_tid_size: 1, ..Default::default() };
    // SAFETY: `args` is a valid clone_args of the size passed; `tids` outlives
    // the call; no stack means fork semantics. The caller upholds fork's contract.
    let ret = check(unsafe { libc::syscall(libc::SYS_clone3, &args as *const CloneArgs, std::mem::size_of::<CloneArgs>()) })?;
    Ok(if ret == 0 { Forked::Child } else { Forked::Parent(Pid::from_raw(ret as i32)) })
}

/// `struct sched_attr` (sched_setattr(2)), version 1 (56 bytes).
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
    util_min: u32,
    util_max: u32,
}

/// Give every thread of process `pid` (a host pid) a scheduler time slice
/// of `slice` under the normal policy at nice 0. On EEVDF kernels (≥ 6.12)
/// a shorter slice means an earlier deadline when the thread wakes, and a
/// waking thread with a shorter slice than the running one preempts it
/// (`PREEMPT_SHORT`), so it runs sooner beside CPU-bound neighbours. Its
/// children do *not* inherit it (`SCHED_FLAG_RESET_ON_FORK`): a hog started
/// from a REPL runs with the default slice. Older kernels ignore the slice.
pub fn set_time_slice(pid: i32, slice: std::time::Duration) -> std::io::Result<()> {
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))?.flatten() {
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse::<i32>().ok()) else { continue };
        set_thread_time_slice(tid, slice)?;
    }
    Ok(())
}

/// `set_time_slice` for one thread; `tid` 0 is the calling thread (the
/// server gives its own threads the REPLs' slice, so that the hops of an
/// exec through it are not held up either).
pub fn set_thread_time_slice(tid: i32, slice: std::time::Duration) -> std::io::Result<()> {
    const SCHED_FLAG_RESET_ON_FORK: u64 = 0x01;
    let attr =
        SchedAttr { size: std::mem::size_of::<SchedAttr>() as u32, flags: SCHED_FLAG_RESET_ON_FORK, runtime: slice.as_nanos() as u64, ..Default::default() };
    // SAFETY: `attr` is a valid sched_attr of the size it declares.
    check(unsafe { libc::syscall(libc::SYS_sched_setattr, tid, &attr as *const SchedAttr, 0) }).map_err(std::io::Error::from)?;
    Ok(())
}

/// Take an exclusive `flock` on `file` without waiting: whether it was
/// free. The lock lives as long as the open file description.
pub fn try_lock_exclusive(file: &std::fs::File) -> bool {
    // SAFETY: flock on a descriptor the caller owns.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn same_file_tells_a_duplicate_from_a_file_of_the_same_kind() {
        let (a, b) = nix::unistd::pipe().unwrap();
        let a_again = a.try_clone().unwrap();
        assert!(same_file(a.as_fd(), a_again.as_fd()));
        assert!(!same_file(a.as_fd(), b.as_fd()));
        // Anonymous-inode files share one inode: only kcmp tells them apart.
        let eventfd = || {
            // SAFETY: plain syscall; the new descriptor is ours.
            unsafe { OwnedFd::from_raw_fd(libc::eventfd(0, libc::EFD_CLOEXEC)) }
        };
        let (x, y) = (eventfd(), eventfd());
        assert!(!same_file(x.as_fd(), y.as_fd()));
        assert!(same_file(x.as_fd(), x.as_fd()));
    }
}
