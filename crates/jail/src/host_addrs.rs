//! The host's own addresses, kept current (docs/network.md#the-host-is-never-reached).
//!
//! A sandbox's firewall blocks every address of the host. Those change
//! while sandboxes run (a bridge or a VPN comes up, DHCP renews), and a
//! firewall written before an address appeared would let the sandbox reach
//! whatever listens there. One thread listens to the kernel's address
//! notifications (rtnetlink) and, when the set changes, publishes a new
//! generation; the server rewrites the blocked sets of every firewall older
//! than it. A poll every few seconds covers notifications the kernel
//! dropped (a full socket buffer).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ipnet::IpNet;
use nix::sys::socket::{self, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType};
use tokio::sync::watch;

/// The networks sandboxes never reach, as of one generation.
#[derive(Debug, PartialEq, Eq)]
pub struct Blocked {
    /// Grows by one with each change; a firewall written from generation
    /// `g` is current while `g` is the latest.
    pub generation: u64,
    pub nets: Vec<IpNet>,
    /// Refused even to allow-lists (`deny`).
    pub denied: Vec<IpNet>,
}

/// How often the addresses are read without a notification.
const POLL: Duration = Duration::from_secs(3);
/// Changes come in bursts (an interface with several addresses): wait this
/// long after a notification for the rest before reading the addresses.
const SETTLE: Duration = Duration::from_millis(10);

fn sender() -> &'static watch::Sender<Arc<Blocked>> {
    static WATCH: OnceLock<watch::Sender<Arc<Blocked>>> = OnceLock::new();
    WATCH.get_or_init(|| {
        // Subscribed before the first read, so no change falls between.
        let sock = subscribe_to_kernel().map_err(|e| tracing::warn!(error = %e, "no address notifications; the host's addresses are polled")).ok();
        let (tx, _) = watch::channel(Arc::new(Blocked { generation: 0, nets: crate::net::always_blocked(), denied: crate::net::denied() }));
        let publish = tx.clone();
        let spawned = std::thread::Builder::new().name("forkbox-host-addrs".into()).spawn(move || watch_loop(sock, &publish));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "the host's addresses are not watched");
        }
        tx
    })
}

/// Deny `nets` to every sandbox, allow-lists included (replacing the last
/// call's): every firewall follows at once, as for a host address that
/// appeared (a cluster node's etcd, object store and peers;
/// docs/cluster.md#security).
pub fn deny(nets: Vec<IpNet>) {
    crate::net::set_denied(nets);
    publish(sender());
}

/// The blocked networks now.
pub fn current() -> Arc<Blocked> {
    Arc::clone(&sender().borrow())
}

/// Told of each new generation.
pub fn subscribe() -> watch::Receiver<Arc<Blocked>> {
    sender().subscribe()
}

fn subscribe_to_kernel() -> nix::Result<OwnedFd> {
    let fd = socket::socket(AddressFamily::Netlink, SockType::Raw, SockFlag::SOCK_CLOEXEC, SockProtocol::NetlinkRoute)?;
    let groups = (libc::RTMGRP_IPV4_IFADDR | libc::RTMGRP_IPV6_IFADDR) as u32;
    socket::bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &NetlinkAddr::new(0, groups))?;
    Ok(fd)
}

fn watch_loop(sock: Option<OwnedFd>, publish_to: &watch::Sender<Arc<Blocked>>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match &sock {
            Some(fd) if readable(fd, POLL) => {
                std::thread::sleep(SETTLE);
                // What the messages say does not matter: the addresses are read again.
                while readable(fd, Duration::ZERO) {
                    if socket::recv(std::os::fd::AsRawFd::as_raw_fd(fd), &mut buf, MsgFlags::MSG_DONTWAIT).is_err() {
                        break;
                    }
                }
            }
            Some(_) => {}
            None => std::thread::sleep(POLL),
        }
        publish(publish_to);
    }
}

/// Read the blocked networks again; a new generation if they changed.
fn publish(to: &watch::Sender<Arc<Blocked>>) {
    let (nets, denied) = (crate::net::always_blocked(), crate::net::denied());
    to.send_if_modified(|cur| {
        if cur.nets == nets && cur.denied == denied {
            return false;
        }
        tracing::info!(generation = cur.generation + 1, "the blocked addresses changed: sandboxes' firewalls follow");
        *cur = Arc::new(Blocked { generation: cur.generation + 1, nets, denied });
        true
    });
}

fn readable(fd: &OwnedFd, wait: Duration) -> bool {
    let mut fds = [nix::poll::PollFd::new(fd.as_fd(), nix::poll::PollFlags::POLLIN)];
    let ms = nix::poll::PollTimeout::try_from(wait).unwrap_or(nix::poll::PollTimeout::MAX);
    matches!(nix::poll::poll(&mut fds, ms), Ok(n) if n > 0)
}
