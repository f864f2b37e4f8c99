//! The DNS proxy of a sandbox with egress (docs/network.md#dns): a UDP
//! socket at 127.0.0.53:53 *inside* the sandbox's network namespace, owned
//! and served by the server (the sandbox cannot replace or reconfigure it).
//!
//! A query for an allowed name goes to the host's resolver; for an
//! allow-list, the addresses in the answer are added to the sandbox's
//! firewall before the answer is passed on, so the connection that follows
//! is let out. Any other name is answered `REFUSED` at once, so a lookup
//! fails fast and nothing leaves the host for it (no DNS tunnelling either).

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::RData;
use tokio::net::UdpSocket;
use tokio::sync::Semaphore;

use super::{Allowed, Names};

/// Queries one sandbox may have in flight; more are dropped (the resolver retries).
pub const MAX_INFLIGHT: usize = 64;
/// How long the host's resolver may take.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(4);

/// Serves until dropped.
pub struct DnsProxy {
    _task: tokio_util::task::AbortOnDropHandle<()>,
}

impl DnsProxy {
    /// Listen at 127.0.0.53:53 in `netns` and serve until dropped;
    /// `firewall`: open the sandbox's firewall to the addresses of allowed
    /// names (an allow-list's).
    pub async fn start(netns: OwnedFd, allowed: Arc<RwLock<Option<Allowed>>>, upstream: SocketAddr, firewall: bool) -> crate::Result<DnsProxy> {
        let sock = crate::net::in_netns(&netns, || {
            let s = std::net::UdpSocket::bind((crate::net::DNS_ADDR, 53))?;
            s.set_nonblocking(true)?;
            Ok(s)
        })
        .await?;
        let sock = UdpSocket::from_std(sock).map_err(|e| crate::Error::io("register the DNS socket", e))?;
        let task = tokio::spawn(serve(Arc::new(sock), Arc::new(netns), allowed, upstream, firewall));
        Ok(DnsProxy { _task: tokio_util::task::AbortOnDropHandle::new(task) })
    }
}

async fn serve(sock: Arc<UdpSocket>, netns: Arc<OwnedFd>, allowed: Arc<RwLock<Option<Allowed>>>, upstream: SocketAddr, firewall: bool) {
    let inflight = Arc::new(Semaphore::new(MAX_INFLIGHT));
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((n, from)) = sock.recv_from(&mut buf).await else { return };
        let Ok(permit) = Arc::clone(&inflight).try_acquire_owned() else { continue };
        let query = buf[..n].to_vec();
        let (sock, netns, allowed) = (Arc::clone(&sock), Arc::clone(&netns), Arc::clone(&allowed));
        tokio::spawn(async move {
            if let Some(reply) = answer(&query, &allowed, upstream, &netns, firewall).await {
                let _ = sock.send_to(&reply, from).await;
            }
            drop(permit);
        });
    }
}

/// `REFUSED` for `query`, echoing its question.
fn refused(query: &Message) -> Option<Vec<u8>> {
    let mut reply = Message::error_msg(query.id(), query.op_code(), ResponseCode::Refused);
    reply.add_queries(query.queries().to_vec());
    reply.set_recursion_desired(query.recursion_desired());
    reply.to_vec().ok()
}

async fn answer(raw: &[u8], allowed: &RwLock<Option<Allowed>>, upstream: SocketAddr, netns: &Arc<OwnedFd>, firewall: bool) -> Option<Vec<u8>> {
    let query = Message::from_vec(raw).ok()?;
    if query.message_type() != MessageType::Query || query.queries().len() != 1 {
        return refused(&query);
    }
    let name = query.queries()[0].name().to_ascii();
    let (allowed, learn) = match allowed.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
        Some(a) => (a.names.allows(&name), firewall && !matches!(a.names, Names::All)),
        None => (false, false),
    };
    if !allowed {
        return refused(&query);
    }
    let reply = forward(raw, upstream).await?;
    if learn {
        let addrs: Vec<IpAddr> = Message::from_vec(&reply)
            .map(|m| {
                m.answers()
                    .iter()
                    .filter_map(|r| match r.data() {
                        RData::A(a) => Some(IpAddr::V4(a.0)),
                        RData::AAAA(a) => Some(IpAddr::V6(a.0)),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        if !addrs.is_empty() {
            let netns = Arc::clone(netns);
            // The firewall opens before the answer arrives, so the connect
            // that follows it is let out.
            let opened = tokio::task::spawn_blocking(move || crate::net::allow_learned(netns.as_fd(), &addrs)).await;
            if !matches!(opened, Ok(Ok(()))) {
                tracing::warn!(?opened, "could not open the firewall for an allowed name");
                return refused(&query);
            }
        }
    }
    Some(reply)
}

/// Ask the host's resolver (from the host's namespace).
async fn forward(raw: &[u8], upstream: SocketAddr) -> Option<Vec<u8>> {
    let local: SocketAddr = if upstream.is_ipv4() { "0.0.0.0:0".parse().ok()? } else { "[::]:0".parse().ok()? };
    let sock = UdpSocket::bind(local).await.ok()?;
    sock.connect(upstream).await.ok()?;
    sock.send(raw).await.ok()?;
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(UPSTREAM_TIMEOUT, sock.recv(&mut buf)).await.ok()?.ok()?;
    buf.truncate(n);
    Some(buf)
}
