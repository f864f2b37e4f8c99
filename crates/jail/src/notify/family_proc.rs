//! The family's procfs: a procfs mounted for the family pid namespace.

use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::OFlag;

use crate::error::{Error, Result};
use crate::sys::{self, Forked};

/// Mount, at `target` in the caller's mount namespace, a procfs whose pid
/// namespace is `pidns` (a procfs shows the pid namespace that is active
/// for the task that mounts it). The caller must be single-threaded, should
/// be in a private mount namespace, and needs `CAP_SYS_ADMIN` over the pid
/// namespace's owning user namespace.
///
/// A child joins `pidns` for its children (`setns(CLONE_NEWPID)`) and
/// forks; the grandchild, now in the namespace, mounts proc
/// (`nosuid,nodev,noexec`). A failure comes back over a pipe as the stage
/// and errno.
pub fn mount_family_proc(pidns: BorrowedFd<'_>, target: &Path) -> Result<()> {
    const SETNS: u8 = 1;
    const FORK: u8 = 2;
    const MOUNT: u8 = 3;

    let target_c =
        std::ffi::CString::new(target.as_os_str().as_bytes()).map_err(|_| Error::Invalid(format!("mount point {} contains a NUL byte", target.display())))?;
    let (err_r, err_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| Error::sys("pipe", e))?;

    /// Report a failure of `stage` from a child and end it. Only raw,
    /// async-signal-safe system calls in the children.
    fn fail(w: RawFd, stage: u8, errno: i32) -> ! {
        let mut msg = [0u8; 5];
        msg[0] = stage;
        msg[1..].copy_from_slice(&errno.to_ne_bytes());
        // SAFETY: write(2) from a local buffer, then _exit: both async-signal-safe.
        unsafe {
            libc::write(w, msg.as_ptr().cast(), msg.len());
            libc::_exit(1)
        }
    }

    // SAFETY: the caller is single-threaded (documented requirement).
    let child = match unsafe { sys::fork_with(0) }.map_err(|e| Error::sys("fork to mount family proc", e))? {
        Forked::Child => {
            let w = err_w.as_raw_fd();
            // SAFETY: setns on a descriptor we were given.
            if unsafe { libc::setns(pidns.as_raw_fd(), libc::CLONE_NEWPID) } != 0 {
                fail(w, SETNS, Errno::last_raw());
            }
            // SAFETY: this child is single-threaded.
            match unsafe { sys::fork_with(0) } {
                Err(e) => fail(w, FORK, e as i32),
                Ok(Forked::Child) => {
                    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
                    // SAFETY: all strings are NUL-terminated and outlive the call.
                    let r = unsafe { libc::mount(c"proc".as_ptr(), target_c.as_ptr(), c"proc".as_ptr(), flags, std::ptr::null()) };
                    if r != 0 {
                        fail(w, MOUNT, Errno::last_raw());
                    }
                    // SAFETY: _exit is async-signal-safe.
                    unsafe { libc::_exit(0) }
                }
                Ok(Forked::Parent(grandchild)) => {
                    let mut status = 0;
                    let code = loop {
                        // SAFETY: waitpid on our own child, writing into a local.
                        let r = unsafe { libc::waitpid(grandchild.as_raw(), &mut status, 0) };
                        if r >= 0 || Errno::last_raw() != libc::EINTR {
                            break if r > 0 && libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { 2 };
                        }
                    };
                    // SAFETY: _exit is async-signal-safe.
                    unsafe { libc::_exit(code) }
                }
            }
        }
        Forked::Parent(child) => child,
    };
    drop(err_w);
    let status = loop {
        match nix::sys::wait::waitpid(child, None) {
            Err(Errno::EINTR) => continue,
            other => break other.map_err(|e| Error::sys("wait for family proc mounter", e))?,
        }
    };
    let mut msg = [0u8; 5];
    let got = nix::unistd::read(&err_r, &mut msg).unwrap_or(0);
    if got == msg.len() {
        let errno = Errno::from_raw(i32::from_ne_bytes([msg[1], msg[2], msg[3], msg[4]]));
        let what = match msg[0] {
            SETNS => "join the family pid namespace",
            FORK => "fork into the family pid namespace",
            _ => "mount the family procfs",
        };
        return Err(Error::sys(what, errno));
    }
    match status {
        nix::sys::wait::WaitStatus::Exited(_, 0) => Ok(()),
        other => Err(Error::Died(format!("family procfs mounter ended with {other:?}"))),
    }
}
