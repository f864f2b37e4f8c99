//! A sandbox's way out, as the engine puts it in force (docs/network.md):
//! the policy checked and turned into firewall rules and allowed names
//! (`plan`), `pasta`, the firewall in the sandbox's namespace and its
//! resolver (`set_up`), the DNS proxy inside the namespace (`dns`) and,
//! with an operator's upstream proxy, the sandbox's own proxy (`upstream`).
//! The server decides when; this module knows how.

use std::os::fd::OwnedFd;

use ipnet::IpNet;
use protocol::Egress;

use crate::error::{Error, Result};
use crate::net::Rules;

mod dns;
mod upstream;

pub use dns::{DnsProxy, MAX_INFLIGHT};
pub use egress_proxy::{Upstream, UpstreamError};
pub use upstream::{start as start_proxy, ProxyTask};

/// Where a sandbox's egress proxy listens inside its namespace
/// (`--egress-proxy`; `HTTP_PROXY` points there).
pub const PROXY_ADDR: (std::net::Ipv4Addr, u16) = (crate::net::DNS_ADDR, 3128);

/// A policy that is not valid; the message is for the client.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PolicyError(String);

/// Most entries in one allow-list.
pub const MAX_ALLOW_ENTRIES: usize = 256;

/// Which names the DNS proxy resolves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Names {
    All,
    /// Exact names, and suffixes (from `*.example.org`: any name below it).
    Only {
        exact: Vec<String>,
        suffixes: Vec<String>,
    },
}

impl Names {
    pub fn allows(&self, name: &str) -> bool {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        match self {
            Names::All => true,
            Names::Only { exact, suffixes } => {
                exact.contains(&name)
                    || suffixes.iter().any(|s| name.len() > s.len() && name.ends_with(s.as_str()) && name.as_bytes()[name.len() - s.len() - 1] == b'.')
            }
        }
    }
}

/// What the policy in force lets out: shared with the DNS proxy and the
/// egress proxy, so a change of policy applies to their next request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    pub rules: Rules,
    pub names: Names,
}

/// A validated policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    Off,
    On { rules: Rules, names: Names },
}

fn valid_domain(d: &str) -> bool {
    d.len() <= 253
        && d.split('.').count() >= 2
        && d.split('.')
            .all(|l| !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') && !l.starts_with('-') && !l.ends_with('-'))
}

/// Check a policy and turn it into what the engine and the DNS proxy need.
pub fn plan(egress: &Egress) -> std::result::Result<Plan, PolicyError> {
    let list = match egress {
        Egress::On(false) => return Ok(Plan::Off),
        Egress::On(true) => return Ok(Plan::On { rules: Rules::Open, names: Names::All }),
        Egress::Allow(a) => &a.allow,
    };
    if list.len() > MAX_ALLOW_ENTRIES {
        return Err(PolicyError(format!("an allow-list has at most {MAX_ALLOW_ENTRIES} entries, got {}", list.len())));
    }
    let (mut nets, mut exact, mut suffixes) = (Vec::new(), Vec::new(), Vec::new());
    for entry in list {
        let e = entry.trim().trim_end_matches('.').to_ascii_lowercase();
        if let Ok(net) = e.parse::<IpNet>() {
            nets.push(net.trunc());
        } else if let Ok(ip) = e.parse::<std::net::IpAddr>() {
            nets.push(IpNet::from(ip));
        } else if let Some(base) = e.strip_prefix("*.").filter(|b| valid_domain(b)) {
            suffixes.push(base.to_string());
        } else if valid_domain(&e) {
            exact.push(e);
        } else {
            return Err(PolicyError(format!("`{entry}` in the allow-list is neither a domain (`pypi.org`, `*.pythonhosted.org`) nor an IP address or CIDR")));
        }
    }
    Ok(Plan::On { rules: Rules::AllowList(nets), names: Names::Only { exact, suffixes } })
}

/// The blocking part of putting `rules` in force: the firewall (when
/// `need_rules`), pasta (when `need_pasta`), and the resolver pointing at
/// the DNS proxy. Answers the new pasta and the namespace.
pub fn set_up(engine: &crate::Sandbox, rules: &Rules, need_pasta: bool, need_rules: bool) -> Result<(Option<crate::net::Pasta>, OwnedFd)> {
    let netns = engine.netns()?;
    if need_rules {
        crate::net::nft(std::os::fd::AsFd::as_fd(&netns), &crate::net::ruleset(rules, &crate::net::always_blocked(), &crate::net::denied()))?;
    }
    let pasta = if need_pasta { Some(engine.start_pasta()?) } else { None };
    point_resolver(engine)?;
    Ok((pasta, netns))
}

/// Point the sandbox's resolver at the DNS proxy (written once; the
/// sandbox may change it, and then it is on its own). Blocking.
pub fn point_resolver(engine: &crate::Sandbox) -> Result<()> {
    let fs = engine.fs()?;
    let path = crate::fs::SandboxPath::parse("/etc/resolv.conf", "/").map_err(|e| Error::Invalid(e.message))?;
    let current = fs.open_read(&path).ok().map(|(mut f, _)| {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut f, &mut s);
        s
    });
    if current.as_deref() != Some(RESOLV_CONF) {
        let mut w = fs.write(&path, false, Some(0o644), true).map_err(|e| Error::Invalid(e.message))?;
        std::io::Write::write_all(w.file(), RESOLV_CONF.as_bytes()).map_err(|e| Error::io("write resolv.conf", e))?;
        w.commit().map_err(|e| Error::Invalid(e.message))?;
    }
    Ok(())
}

/// The sandbox's resolver: our DNS proxy inside its namespace.
const RESOLV_CONF: &str = "# forkbox: the server's DNS proxy in this sandbox's network namespace\nnameserver 127.0.0.53\noptions edns0\n";

/// The host's first nameserver (where the DNS proxy sends allowed queries).
pub fn host_resolver() -> Option<std::net::SocketAddr> {
    static UPSTREAM: std::sync::OnceLock<Option<std::net::SocketAddr>> = std::sync::OnceLock::new();
    *UPSTREAM.get_or_init(host_nameserver)
}

fn host_nameserver() -> Option<std::net::SocketAddr> {
    let conf = std::fs::read_to_string("/etc/resolv.conf").ok()?;
    conf.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| a.trim().parse::<std::net::IpAddr>().ok())
        .map(|ip| std::net::SocketAddr::new(ip, 53))
        .next()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(list: &[&str]) -> Egress {
        Egress::Allow(protocol::EgressAllow { allow: list.iter().map(|s| s.to_string()).collect() })
    }

    #[test]
    fn allow_lists_parse_into_names_and_networks() {
        let Plan::On { rules, names } = plan(&allow(&["PyPI.org.", "*.pythonhosted.org", "203.0.113.7/24", "198.51.100.1", "::1"])).unwrap() else { panic!() };
        assert_eq!(rules, Rules::AllowList(vec!["203.0.113.0/24".parse().unwrap(), "198.51.100.1/32".parse().unwrap(), "::1/128".parse().unwrap()]));
        assert!(names.allows("pypi.org") && names.allows("PYPI.ORG.") && names.allows("files.pythonhosted.org"));
        assert!(!names.allows("pythonhosted.org") && !names.allows("evilpythonhosted.org") && !names.allows("pypi.org.evil.com") && !names.allows("crates.io"));
        assert_eq!(plan(&Egress::On(false)).unwrap(), Plan::Off);
        assert!(matches!(plan(&Egress::On(true)).unwrap(), Plan::On { rules: Rules::Open, names: Names::All }));
    }

    #[test]
    fn bad_entries_and_long_lists_are_refused() {
        for bad in ["", "*", "*.com.", "no_underscores.org", "localhost", "a..b", "-a.org", "1.2.3.4/33", "http://pypi.org", "*.*.org"] {
            assert!(plan(&allow(&[bad])).is_err(), "{bad}");
        }
        let many: Vec<String> = (0..=MAX_ALLOW_ENTRIES).map(|i| format!("h{i}.example.org")).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(plan(&allow(&refs)).is_err());
        assert!(plan(&allow(&refs[..MAX_ALLOW_ENTRIES])).is_ok());
    }
}
