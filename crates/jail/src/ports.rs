//! Reaching a TCP port inside a sandbox's network namespace from the host
//! (the server's port proxy, docs/network.md#ports).
//!
//! The server is multithreaded, so it cannot move itself into a sandbox's
//! network namespace, but one thread can: network namespaces belong to a
//! task, and `setns(CLONE_NEWNET)` does not need a single-threaded caller.
//! A short-lived thread enters the namespace and only *creates* the
//! socket; a socket stays in the namespace it was created in, so the
//! connect runs on tokio like any other, and the thread exits with nothing
//! to restore. (Not the blocking pool: its threads live on.)

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::socket::{AddressFamily, SockFlag, SockType};

/// Why a port could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum PortError {
    /// Nothing listens on the port (on 127.0.0.1 nor on ::1).
    #[error("connection refused")]
    Refused,
    /// The connect did not finish in time (say, a full accept queue).
    #[error("connect timed out")]
    TimedOut,
    /// The sandbox's network namespace cannot be entered right now.
    #[error("{0}")]
    Unreachable(String),
    #[error("{what}: {source}")]
    Io { what: &'static str, source: std::io::Error },
}

/// Connect to `port` on the loopback of the network namespace `netns`:
/// 127.0.0.1 first, then ::1 if that is refused. Answers the stream and
/// the address it reached; `timeout` bounds the whole attempt.
pub async fn connect(netns: OwnedFd, port: u16, timeout: Duration) -> Result<(tokio::net::TcpStream, SocketAddr), PortError> {
    let netns = Arc::new(netns);
    let attempt = async {
        let mut refused = false;
        for ip in [IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V6(Ipv6Addr::LOCALHOST)] {
            let addr = SocketAddr::new(ip, port);
            let fd = socket_in(Arc::clone(&netns), ip.is_ipv6()).await?;
            let socket = tokio::net::TcpSocket::from_std_stream(std::net::TcpStream::from(fd));
            match socket.connect(addr).await {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    return Ok((stream, addr));
                }
                // ::1 may not exist at all (IPv6 disabled): as good as refused.
                Err(e) if matches!(e.raw_os_error(), Some(libc::ECONNREFUSED | libc::EADDRNOTAVAIL | libc::ENETUNREACH)) => refused = true,
                Err(e) => return Err(PortError::Io { what: "connect", source: e }),
            }
        }
        debug_assert!(refused);
        Err(PortError::Refused)
    };
    tokio::time::timeout(timeout, attempt).await.unwrap_or(Err(PortError::TimedOut))
}

/// A non-blocking TCP socket created inside `netns` (see `net::in_netns`).
async fn socket_in(netns: Arc<OwnedFd>, v6: bool) -> Result<OwnedFd, PortError> {
    let family = if v6 { AddressFamily::Inet6 } else { AddressFamily::Inet };
    crate::net::in_netns(&netns, move || {
        nix::sys::socket::socket(family, SockType::Stream, SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC, None).map_err(std::io::Error::from)
    })
    .await
    .map_err(|e| PortError::Unreachable(format!("cannot make a socket in the sandbox's network namespace: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own_netns() -> OwnedFd {
        std::fs::File::open("/proc/thread-self/ns/net").expect("open own netns").into()
    }

    /// In the caller's own namespace (setns to it needs CAP_SYS_ADMIN, so
    /// only as root, as CI runs): a listener is reached, a closed port is
    /// refused, and the socket lives in the namespace it was made in.
    #[tokio::test]
    async fn connects_and_refuses_in_a_namespace() {
        if !nix::unistd::geteuid().is_root() {
            panic!("this test needs root (setns)");
        }
        // A port nothing else listens on, on ::1 either (connect tries both).
        let (listener, port) = loop {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port();
            match std::net::TcpListener::bind(("::1", port)) {
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
                _ => break (l, port), // free there, or no IPv6 at all
            }
        };
        let (stream, addr) = connect(own_netns(), port, Duration::from_secs(5)).await.unwrap();
        assert_eq!(addr, SocketAddr::from(([127, 0, 0, 1], port)));
        assert_eq!(stream.peer_addr().unwrap(), addr);
        drop(listener);
        // A closed port: bound but not listening, so it refuses, and no
        // other test can take it meanwhile (a freed port could be, and
        // once was, reused by a listener of a test running beside this).
        use nix::sys::socket::{bind, getsockname, socket, AddressFamily, SockFlag, SockType, SockaddrIn};
        use std::os::fd::AsRawFd;
        let (_held, closed_port) = loop {
            let s = socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).unwrap();
            bind(s.as_raw_fd(), &SockaddrIn::new(127, 0, 0, 1, 0)).unwrap();
            let p = getsockname::<SockaddrIn>(s.as_raw_fd()).unwrap().port();
            match std::net::TcpListener::bind(("::1", p)) {
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
                _ => break (s, p),
            }
        };
        let closed = connect(own_netns(), closed_port, Duration::from_secs(5)).await;
        assert!(matches!(closed, Err(PortError::Refused)), "{closed:?}");
    }
}
