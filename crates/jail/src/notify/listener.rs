//! The listener: the shim's end of the notify filter, which receives the
//! REPL's notified calls and answers them.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::OnceLock;

use super::vet::{int, vet_caller, Caller, FamilyView};
use super::{HANDOVER_GIVE, HANDOVER_TAKE};

const SECCOMP_IOC_MAGIC: u8 = b'!';
/// `_IOWR('!', 0, struct seccomp_notif)`.
const NOTIF_RECV: libc::c_ulong = nix::request_code_readwrite!(SECCOMP_IOC_MAGIC, 0, std::mem::size_of::<libc::seccomp_notif>()) as libc::c_ulong;
/// `_IOWR('!', 1, struct seccomp_notif_resp)`.
const NOTIF_SEND: libc::c_ulong = nix::request_code_readwrite!(SECCOMP_IOC_MAGIC, 1, std::mem::size_of::<libc::seccomp_notif_resp>()) as libc::c_ulong;
/// `_IOW('!', 2, __u64)`.
const NOTIF_ID_VALID: libc::c_ulong = nix::request_code_write!(SECCOMP_IOC_MAGIC, 2, std::mem::size_of::<u64>()) as libc::c_ulong;

/// `_IOW('!', 3, struct seccomp_notif_addfd)`.
const NOTIF_ADDFD: libc::c_ulong = nix::request_code_write!(SECCOMP_IOC_MAGIC, 3, std::mem::size_of::<libc::seccomp_notif_addfd>()) as libc::c_ulong;

/// Room for the kernel's `struct seccomp_notif` or `seccomp_notif_resp`,
/// should it be larger than ours (it may grow; we read our prefix).
const NOTIF_BUF_WORDS: usize = 64;

/// One vetted call, as the kernel describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Notification {
    /// The notification's cookie, for [`Listener::respond`].
    pub id: u64,
    /// The calling thread's id in the listener reader's pid namespace (the
    /// host's, for the shim); 0 if the caller is not visible there.
    pub pid: i32,
    /// The system call number (native architecture: the filter notifies no
    /// other).
    pub nr: libc::c_long,
    pub args: [u64; 6],
}

/// The answer to a [`Notification`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Let the kernel run the call as made (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`).
    Continue,
    /// Skip the call; it fails with this errno.
    Errno(i32),
    /// Skip the call; it returns this value.
    Return(i64),
}

/// The listening end of a notify filter, owned by the shim. Poll its fd for
/// `POLLIN` before [`Listener::recv`] (which blocks otherwise); `POLLHUP`
/// means no process uses the filter any more.
pub struct Listener {
    fd: OwnedFd,
}

/// `SECCOMP_GET_NOTIF_SIZES`, asked once per process.
fn notif_sizes() -> io::Result<libc::seccomp_notif_sizes> {
    static SIZES: OnceLock<std::result::Result<(u16, u16, u16), i32>> = OnceLock::new();
    let got = SIZES.get_or_init(|| {
        let mut s = libc::seccomp_notif_sizes { seccomp_notif: 0, seccomp_notif_resp: 0, seccomp_data: 0 };
        // SAFETY: the kernel writes a `struct seccomp_notif_sizes` into `s`.
        let r = unsafe { libc::syscall(libc::SYS_seccomp, libc::SECCOMP_GET_NOTIF_SIZES, 0, &mut s as *mut libc::seccomp_notif_sizes) };
        if r < 0 {
            Err(io::Error::last_os_error().raw_os_error().unwrap_or(libc::ENOSYS))
        } else {
            Ok((s.seccomp_notif, s.seccomp_notif_resp, s.seccomp_data))
        }
    });
    match *got {
        Ok((seccomp_notif, seccomp_notif_resp, seccomp_data)) => Ok(libc::seccomp_notif_sizes { seccomp_notif, seccomp_notif_resp, seccomp_data }),
        Err(e) => Err(io::Error::from_raw_os_error(e)),
    }
}

fn retry_eintr(mut f: impl FnMut() -> libc::c_int) -> io::Result<libc::c_int> {
    loop {
        let r = f();
        if r >= 0 {
            return Ok(r);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

impl Listener {
    /// Wrap a listener fd from [`install_with_listener`](super::install_with_listener). Fails if the
    /// kernel's notification structures are smaller than ours (we would
    /// read fields it does not fill) or larger than we leave room for.
    pub fn new(fd: OwnedFd) -> io::Result<Listener> {
        let sizes = notif_sizes()?;
        let room = NOTIF_BUF_WORDS * 8;
        let fits = |kernel: u16, ours: usize| (ours..=room).contains(&usize::from(kernel));
        if !fits(sizes.seccomp_notif, std::mem::size_of::<libc::seccomp_notif>())
            || !fits(sizes.seccomp_notif_resp, std::mem::size_of::<libc::seccomp_notif_resp>())
            || !fits(sizes.seccomp_data, std::mem::size_of::<libc::seccomp_data>())
        {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("kernel seccomp notification sizes {}/{}/{} do not fit ours", sizes.seccomp_notif, sizes.seccomp_notif_resp, sizes.seccomp_data),
            ));
        }
        Ok(Listener { fd })
    }

    /// Read the next notification (`SECCOMP_IOCTL_NOTIF_RECV`). Blocks if
    /// none is pending. `ENOENT`: the caller gave up (a signal interrupted
    /// it) between `poll` and now; there is nothing to answer.
    pub fn recv(&self) -> io::Result<Notification> {
        let mut buf = [0u64; NOTIF_BUF_WORDS];
        // SAFETY: `buf` is zeroed (the kernel insists), 8-byte aligned and
        // larger than the kernel's `struct seccomp_notif` (checked in `new`).
        retry_eintr(|| unsafe { libc::ioctl(self.fd.as_raw_fd(), NOTIF_RECV as _, buf.as_mut_ptr()) })?;
        // SAFETY: the buffer is aligned for and at least as large as
        // `seccomp_notif`, a plain-data struct the kernel has just filled.
        let n: libc::seccomp_notif = unsafe { std::ptr::read(buf.as_ptr().cast()) };
        Ok(Notification { id: n.id, pid: n.pid as i32, nr: n.data.nr as libc::c_long, args: n.data.args })
    }

    /// Answer notification `id` (`SECCOMP_IOCTL_NOTIF_SEND`). A caller that
    /// has died or been interrupted meanwhile (`ENOENT`) is not an error.
    pub fn respond(&self, id: u64, verdict: Verdict) -> io::Result<()> {
        let (val, error, flags) = match verdict {
            Verdict::Continue => (0, 0, libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32),
            Verdict::Errno(e) => (0, -e.abs(), 0),
            Verdict::Return(v) => (v, 0, 0),
        };
        let mut buf = [0u64; NOTIF_BUF_WORDS];
        // SAFETY: `buf` is aligned and large enough for `seccomp_notif_resp`.
        unsafe { std::ptr::write(buf.as_mut_ptr().cast(), libc::seccomp_notif_resp { id, val, error, flags }) };
        // SAFETY: the kernel reads its `struct seccomp_notif_resp` from the
        // buffer, which is at least that large and zero past our fields.
        match retry_eintr(|| unsafe { libc::ioctl(self.fd.as_raw_fd(), NOTIF_SEND as _, buf.as_ptr()) }) {
            Ok(_) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Whether notification `id` is still pending (its caller still waits),
    /// `SECCOMP_IOCTL_NOTIF_ID_VALID`.
    pub fn id_valid(&self, id: u64) -> io::Result<bool> {
        // SAFETY: the kernel reads one u64 from `&id`.
        match retry_eintr(|| unsafe { libc::ioctl(self.fd.as_raw_fd(), NOTIF_ID_VALID as _, &id as *const u64) }) {
            Ok(_) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Answer notification `id` with a copy of `src` in its caller: the
    /// call returns the new descriptor's number (close-on-exec, the lowest
    /// free one). `SECCOMP_IOCTL_NOTIF_ADDFD` with
    /// `SECCOMP_ADDFD_FLAG_SEND`: the caller's own thread installs it, so
    /// it lands in that process's table and in no other.
    pub fn answer_with_fd(&self, id: u64, src: BorrowedFd<'_>) -> io::Result<i32> {
        let add = libc::seccomp_notif_addfd {
            id,
            flags: libc::SECCOMP_ADDFD_FLAG_SEND as u32,
            srcfd: src.as_raw_fd() as u32,
            newfd: 0,
            newfd_flags: libc::O_CLOEXEC as u32,
        };
        // SAFETY: the kernel reads one `struct seccomp_notif_addfd`.
        retry_eintr(|| unsafe { libc::ioctl(self.fd.as_raw_fd(), NOTIF_ADDFD as _, &add as *const libc::seccomp_notif_addfd) })
    }

    /// A second handle on the same listener (to answer a notification
    /// later, whatever happens to this one).
    pub fn try_clone(&self) -> io::Result<Listener> {
        Ok(Listener { fd: self.fd.try_clone()? })
    }

    /// Receive, vet and answer one notification; call when the fd polls
    /// readable. `Ok(None)`: the caller went away before it could be
    /// answered. A step of a descriptor hand-over from a process of the
    /// family pid namespace is not answered: it comes back as
    /// [`Served::HandOver`] for the shim; nor is a network `socket` call,
    /// which comes back as [`Served::Socket`], unchecked (see there).
    ///
    /// The caller is looked up by its host pid and only then is the
    /// notification checked to be still pending: a pid is only reused after
    /// its process is gone, and a gone caller's notification is not
    /// pending, so what was read described the caller.
    pub fn serve_one(&self, view: &dyn FamilyView) -> io::Result<Option<Served>> {
        let n = match self.recv() {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(e),
        };
        if n.nr == libc::SYS_socket {
            // The shim knows the caller cheaply (its mount namespace), or
            // needs not (no gate closed): every network socket comes here.
            return Ok(Some(Served::Socket(n)));
        }
        let caller = view.caller(n.pid);
        if !self.id_valid(n.id)? {
            return Ok(None);
        }
        if let (Some(step), Some(c)) = (HandOver::of(&n), caller.as_ref()) {
            if !c.in_leaf {
                return Ok(Some(Served::HandOver(n, *c, step)));
            }
        }
        let verdict = vet_caller(&n, caller.as_ref(), view);
        self.respond(n.id, verdict)?;
        Ok(Some(Served::Answered(n, verdict)))
    }
}

/// What [`Listener::serve_one`] did with a notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    Answered(Notification, Verdict),
    /// Left pending: a hand-over step of `Caller`, which the shim answers
    /// (with [`Listener::respond`] or [`Listener::answer_with_fd`]).
    HandOver(Notification, Caller, HandOver),
    /// Left pending and unchecked: a `socket` call of a domain other than
    /// `AF_UNIX` (notified by [`socket_filter`](super::socket_filter) and
    /// the REPL's filter), which the shim lets through once its member's
    /// way out runs. The shim looks its caller up and then checks the
    /// notification is still pending ([`Listener::id_valid`]), in that
    /// order, as `serve_one` does.
    Socket(Notification),
}

/// A step of a fork's descriptor hand-over (docs/architecture.md#processes-and-namespaces). The server
/// gives the shim each fork child's descriptors; the forking REPL forks,
/// then names each child by its pid (`Give`, from its main thread); each
/// child, single-threaded right after `fork(2)`, asks for its own (`Take`),
/// and the shim answers with a socket holding them, copied straight into
/// the child with [`Listener::answer_with_fd`]. The forking REPL never
/// holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandOver {
    /// `ioctl(slot, HANDOVER_TAKE, 0)`: a fork child asks for the
    /// descriptors of fork child `slot`; answered with a socket from which
    /// it receives them, in one message.
    Take { slot: usize },
    /// `ioctl(slot, HANDOVER_GIVE, pid)`: the forking REPL says its child
    /// `pid` (family pid namespace) is fork child `slot`.
    Give { slot: usize, pid: i32 },
}

impl HandOver {
    /// The hand-over step `n` asks for, if it is one (a negative slot is
    /// none: [`vet`](fn@super::vet) refuses it).
    pub fn of(n: &Notification) -> Option<HandOver> {
        if n.nr != libc::SYS_ioctl {
            return None;
        }
        let slot = usize::try_from(int(n.args[0])).ok()?;
        match n.args[1] as u32 {
            HANDOVER_TAKE => Some(HandOver::Take { slot }),
            HANDOVER_GIVE => Some(HandOver::Give { slot, pid: int(n.args[2]) }),
            _ => None,
        }
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for Listener {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // --- ioctl numbers -----------------------------------------------------

    #[test]
    fn ioctl_numbers_match_the_kernel_headers() {
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!(NOTIF_RECV, 0xc050_2100);
            assert_eq!(NOTIF_SEND, 0xc018_2101);
            assert_eq!(NOTIF_ID_VALID, 0x4008_2102);
        }
        assert_eq!(NOTIF_RECV, libc::SECCOMP_IOCTL_NOTIF_RECV);
        assert_eq!(NOTIF_SEND, libc::SECCOMP_IOCTL_NOTIF_SEND);
        assert_eq!(NOTIF_ID_VALID, libc::SECCOMP_IOCTL_NOTIF_ID_VALID);
        assert_eq!(NOTIF_ADDFD, libc::SECCOMP_IOCTL_NOTIF_ADDFD);
        assert_eq!(std::mem::size_of::<libc::seccomp_notif>(), 0x50);
        assert_eq!(std::mem::size_of::<libc::seccomp_notif_resp>(), 0x18);
    }
}
