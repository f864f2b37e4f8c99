//! Typed messages between the server, the per-family supervisor ("shim") and
//! each sandbox's init, over `SOCK_SEQPACKET` sockets: one JSON document per
//! packet, with file descriptors attached as `SCM_RIGHTS`. A failure on the
//! far side comes back as data, never as a broken stream.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::cmsg_space;
use nix::sys::socket::{
    recvmsg, sendmsg, setsockopt, socketpair, sockopt, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixCredentials,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{Error, Result};

/// Largest message; bulky payloads (scripts, code) travel in memfds instead.
pub const MAX_MESSAGE: usize = 64 * 1024;
/// Most descriptors attached to one message (a fork's reply carries one
/// pidfd per child, up to 32).
pub const MAX_FDS: usize = 64;

/// A connected pair of seqpacket sockets (close-on-exec).
pub fn pair() -> Result<(OwnedFd, OwnedFd)> {
    socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC).map_err(|e| Error::sys("socketpair", e))
}

/// A seqpacket socket listening at `path` (close-on-exec, non-blocking,
/// mode 0600: only root on the host reaches it).
pub fn listen(path: &std::path::Path) -> Result<OwnedFd> {
    use nix::sys::socket::{bind, listen as listen_on, socket, Backlog, UnixAddr};
    let sock = socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK, None).map_err(|e| Error::sys("socket", e))?;
    let _ = std::fs::remove_file(path);
    let addr = UnixAddr::new(path).map_err(|e| Error::sys("socket path", e))?;
    bind(sock.as_raw_fd(), &addr).map_err(|e| Error::sys("bind", e))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|e| Error::io("chmod socket", e))?;
    listen_on(&sock, Backlog::new(4).map_err(|e| Error::sys("backlog", e))?).map_err(|e| Error::sys("listen", e))?;
    Ok(sock)
}

/// Accept one connection on a `listen` socket (blocking, close-on-exec).
pub fn accept(listener: BorrowedFd<'_>) -> Result<OwnedFd> {
    let fd = nix::sys::socket::accept4(listener.as_raw_fd(), SockFlag::SOCK_CLOEXEC).map_err(|e| Error::sys("accept", e))?;
    // SAFETY: accept4 returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Connect to a `listen` socket (close-on-exec, non-blocking).
pub fn connect(path: &std::path::Path) -> Result<OwnedFd> {
    use nix::sys::socket::{connect as connect_to, socket, UnixAddr};
    let sock = socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None).map_err(|e| Error::sys("socket", e))?;
    let addr = UnixAddr::new(path).map_err(|e| Error::sys("socket path", e))?;
    connect_to(sock.as_raw_fd(), &addr).map_err(|e| Error::sys("connect", e))?;
    nix::fcntl::fcntl(&sock, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK)).map_err(|e| Error::sys("nonblocking", e))?;
    Ok(sock)
}

/// Host pid of the peer of a connected unix socket.
pub fn peer_pid(sock: BorrowedFd<'_>) -> Option<i32> {
    nix::sys::socket::getsockopt(&sock, sockopt::PeerCredentials).ok().map(|c| c.pid())
}

/// Ask the kernel to attach the sender's credentials to what we receive.
pub fn pass_credentials(sock: BorrowedFd<'_>) -> Result<()> {
    setsockopt(&sock, sockopt::PassCred, &true).map_err(|e| Error::sys("SO_PASSCRED", e))
}

/// Send one message with `fds` attached.
pub fn send<T: Serialize>(sock: BorrowedFd<'_>, msg: &T, fds: &[RawFd]) -> Result<()> {
    send_inner(sock, msg, fds, false)
}

/// Send one message with our credentials attached (the receiver learns our
/// pid in its own pid namespace).
pub fn send_with_credentials<T: Serialize>(sock: BorrowedFd<'_>, msg: &T) -> Result<()> {
    send_inner(sock, msg, &[], true)
}

fn send_inner<T: Serialize>(sock: BorrowedFd<'_>, msg: &T, fds: &[RawFd], creds: bool) -> Result<()> {
    let body = serde_json::to_vec(msg).map_err(|e| Error::Protocol(format!("encode message: {e}")))?;
    if body.len() > MAX_MESSAGE {
        return Err(Error::Protocol(format!("message of {} bytes is too large", body.len())));
    }
    if fds.len() > MAX_FDS {
        return Err(Error::Protocol(format!("{} descriptors are more than a message carries", fds.len())));
    }
    let iov = [IoSlice::new(&body)];
    let ucred = UnixCredentials::new();
    let mut cmsgs = Vec::new();
    if !fds.is_empty() {
        cmsgs.push(ControlMessage::ScmRights(fds));
    }
    if creds {
        cmsgs.push(ControlMessage::ScmCredentials(&ucred));
    }
    loop {
        match sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(Error::sys("send message", e)),
        }
    }
}

/// A received message.
pub struct Received<T> {
    pub msg: T,
    pub fds: Vec<OwnedFd>,
    /// The sender's pid in our pid namespace, when it attached credentials.
    pub sender_pid: Option<i32>,
}

/// Receive one message; `Ok(None)` when the peer has closed the socket.
pub fn recv<T: DeserializeOwned>(sock: BorrowedFd<'_>) -> Result<Option<Received<T>>> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let mut space = cmsg_space!([RawFd; MAX_FDS], UnixCredentials);
    let (len, fds, sender_pid) = loop {
        let mut iov = [IoSliceMut::new(&mut buf)];
        match recvmsg::<()>(sock.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC) {
            Ok(m) => {
                let mut fds = Vec::new();
                let mut pid = None;
                for c in m.cmsgs().map_err(|e| Error::sys("read control messages", e))? {
                    match c {
                        // SAFETY: SCM_RIGHTS descriptors are new and ours to own.
                        ControlMessageOwned::ScmRights(raw) => fds.extend(raw.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })),
                        ControlMessageOwned::ScmCredentials(c) => pid = Some(c.pid()),
                        _ => {}
                    }
                }
                break (m.bytes, fds, pid);
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(Error::sys("receive message", e)),
        }
    };
    if len == 0 {
        return Ok(None);
    }
    let msg = serde_json::from_slice(&buf[..len]).map_err(|e| Error::Protocol(format!("decode message: {e}")))?;
    Ok(Some(Received { msg, fds, sender_pid }))
}
