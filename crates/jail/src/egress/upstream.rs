//! A sandbox's way out through the operator's proxy (`--egress-proxy`,
//! docs/network.md#upstream-proxies): a TCP listener at 127.0.0.53:3128
//! *inside* the sandbox's network namespace (opened there by the server,
//! which serves it), handed to the egress-proxy crate with this sandbox's
//! policy. The namespace has no other way out: no interface but `lo`.
//!
//! What the policy lets through: names it allows, and addresses it lists;
//! never the host's own addresses, loopback or link-local (the operator's
//! proxy may run on this host) unless listed, and never `localhost`. A
//! name the host can resolve to one of those is refused too.

use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::sync::{Arc, RwLock};

use egress_proxy::{Host, Limits, Target};
use ipnet::IpNet;

use super::Allowed;

/// The proxy serving one sandbox; stops when dropped.
pub struct ProxyTask {
    _task: tokio_util::task::AbortOnDropHandle<()>,
}

struct SandboxPolicy {
    allowed: Arc<RwLock<Option<Allowed>>>,
    /// Networks never reached unless an allow-list names them (those never
    /// reached at all are `net::denied`'s, read at each check: a cluster
    /// node's change as its peers do).
    blocked: Vec<IpNet>,
}

impl SandboxPolicy {
    fn explicit(&self) -> Vec<IpNet> {
        match self.allowed.read().unwrap_or_else(|e| e.into_inner()).as_ref().map(|a| a.rules.clone()) {
            Some(crate::net::Rules::AllowList(nets)) => nets,
            _ => Vec::new(),
        }
    }

    fn address_allowed(&self, ip: IpAddr, explicit: &[IpNet]) -> bool {
        let Some(allowed) = self.allowed.read().unwrap_or_else(|e| e.into_inner()).clone() else { return false };
        if crate::net::denied().iter().any(|n| n.contains(&ip)) {
            return false;
        }
        if explicit.iter().any(|n| n.contains(&ip)) {
            return true;
        }
        matches!(allowed.rules, crate::net::Rules::Open) && !self.blocked.iter().any(|n| n.contains(&ip))
    }

    async fn check(&self, target: &Target) -> bool {
        let explicit = self.explicit();
        match &target.host {
            Host::Ip(ip) => self.address_allowed(*ip, &explicit),
            Host::Name(name) => {
                let by_name = self.allowed.read().unwrap_or_else(|e| e.into_inner()).as_ref().is_some_and(|a| a.names.allows(name));
                if !by_name || name == "localhost" || name.ends_with(".localhost") {
                    return false;
                }
                // Where the host resolves it: never to an address that is
                // itself refused. (A name the host cannot resolve is left
                // to the operator's proxy.)
                match tokio::net::lookup_host((name.as_str(), target.port)).await {
                    Ok(addrs) => {
                        let denied = crate::net::denied();
                        addrs.map(|a| a.ip()).all(|ip| {
                            !denied.iter().any(|n| n.contains(&ip))
                                && (explicit.iter().any(|n| n.contains(&ip)) || !self.blocked.iter().any(|n| n.contains(&ip)))
                        })
                    }
                    Err(_) => true,
                }
            }
        }
    }
}

impl egress_proxy::Policy for SandboxPolicy {
    fn allows<'a>(&'a self, target: &'a Target) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + 'a>> {
        Box::pin(self.check(target))
    }
}

/// Listen at `PROXY_ADDR` in `netns` and serve sandbox `id`'s
/// requests through `upstream` with the policy `allowed` says, until dropped.
pub async fn start(netns: &OwnedFd, id: &str, allowed: Arc<RwLock<Option<Allowed>>>, upstream: Arc<egress_proxy::Upstream>) -> crate::Result<ProxyTask> {
    let listener = crate::net::in_netns(netns, || {
        let l = std::net::TcpListener::bind(super::PROXY_ADDR)?;
        l.set_nonblocking(true)?;
        Ok(l)
    })
    .await?;
    let listener = tokio::net::TcpListener::from_std(listener).map_err(|e| crate::Error::io("register the egress proxy's socket", e))?;
    let policy = SandboxPolicy { allowed, blocked: crate::net::always_blocked() };
    let task = tokio::spawn(egress_proxy::serve(listener, upstream, Arc::new(policy), Limits::default(), id.to_string()));
    Ok(ProxyTask { _task: tokio_util::task::AbortOnDropHandle::new(task) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::{plan, Plan};

    fn policy(egress: protocol::Egress) -> SandboxPolicy {
        let Plan::On { rules, names } = plan(&egress).unwrap() else { panic!("off") };
        SandboxPolicy { allowed: Arc::new(RwLock::new(Some(Allowed { rules, names }))), blocked: crate::net::always_blocked() }
    }

    fn target(s: &str) -> Target {
        Target::from_authority(&s.parse().unwrap(), None).unwrap()
    }

    #[tokio::test]
    async fn the_host_is_refused_by_address_and_by_name() {
        let open = policy(protocol::Egress::On(true));
        assert!(open.check(&target("203.0.113.9:443")).await);
        for t in ["127.0.0.1:22", "[::1]:22", "169.254.169.254:80", "localhost:8080", "a.localhost:80"] {
            assert!(!open.check(&target(t)).await, "{t}");
        }
        // A host name that resolves to loopback (from /etc/hosts).
        let me = std::fs::read_to_string("/etc/hostname").unwrap_or_default().trim().to_string();
        if !me.is_empty() && tokio::net::lookup_host((me.as_str(), 1)).await.is_ok_and(|mut a| a.any(|a| a.ip().is_loopback())) {
            assert!(!open.check(&target(&format!("{me}:80"))).await);
        }
    }

    #[tokio::test]
    async fn allow_lists_pass_their_names_and_networks_only() {
        let list =
            policy(protocol::Egress::Allow(protocol::EgressAllow { allow: vec!["pypi.org".into(), "*.pythonhosted.org".into(), "127.0.0.1/32".into()] }));
        assert!(list.check(&target("files.pythonhosted.org:443")).await || tokio::net::lookup_host(("files.pythonhosted.org", 443)).await.is_err());
        assert!(!list.check(&target("crates.io:443")).await);
        assert!(!list.check(&target("203.0.113.9:443")).await);
        // Listed explicitly: an address otherwise refused.
        assert!(list.check(&target("127.0.0.1:8080")).await);
        let off = SandboxPolicy { allowed: Arc::new(RwLock::new(None)), blocked: Vec::new() };
        assert!(!off.check(&target("203.0.113.9:443")).await);
    }
}
