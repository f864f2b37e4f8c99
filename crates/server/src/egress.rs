//! A sandbox's egress policy (docs/network.md): validating it, and putting
//! it in force with the engine's pieces: `pasta` for the way out, the
//! firewall in the sandbox's namespace, and the DNS proxy (src/dns.rs) that
//! answers only for allowed names and opens the firewall to their addresses.

use std::sync::{Arc, RwLock};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use ipnet::IpNet;
use jail::net::Rules;
use protocol::{Egress, EgressBody};

use crate::error::ApiError;
use crate::routes::Json;
use crate::sandbox::SandboxEntry;
use crate::state::AppState;

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
pub fn plan(egress: &Egress) -> Result<Plan, ApiError> {
    let list = match egress {
        Egress::On(false) => return Ok(Plan::Off),
        Egress::On(true) => return Ok(Plan::On { rules: Rules::Open, names: Names::All }),
        Egress::Allow(a) => &a.allow,
    };
    if list.len() > MAX_ALLOW_ENTRIES {
        return Err(ApiError::BadRequest(format!("an allow-list has at most {MAX_ALLOW_ENTRIES} entries, got {}", list.len())));
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
            return Err(ApiError::BadRequest(format!(
                "`{entry}` in the allow-list is neither a domain (`pypi.org`, `*.pythonhosted.org`) nor an IP address or CIDR"
            )));
        }
    }
    Ok(Plan::On { rules: Rules::AllowList(nets), names: Names::Only { exact, suffixes } })
}

/// What is running for one sandbox's network.
#[derive(Default)]
pub struct NetState {
    pasta: Option<jail::net::Pasta>,
    dns: Option<crate::dns::DnsProxy>,
    /// With `--egress-proxy`, the sandbox's proxy instead of pasta.
    proxy: Option<crate::upstream::ProxyTask>,
    /// What the policy lets out (None: off).
    allowed: Arc<RwLock<Option<Allowed>>>,
    /// Why the policy asked for at create or fork could not be put in force
    /// (told to the sandbox's next exec).
    pub failed: Option<String>,
    /// The firewall rules in force in the sandbox's namespace.
    rules: Option<Rules>,
}

/// The blocking part of putting `rules` in force: the firewall (when
/// `need_rules`), pasta (when `need_pasta`), and the resolver pointing at
/// the DNS proxy. Answers the new pasta and the namespace.
fn set_up(engine: &jail::Sandbox, rules: &Rules, need_pasta: bool, need_rules: bool) -> jail::Result<(Option<jail::net::Pasta>, std::os::fd::OwnedFd)> {
    let netns = engine.netns()?;
    if need_rules {
        jail::net::nft(std::os::fd::AsFd::as_fd(&netns), &jail::net::ruleset(rules, &jail::net::always_blocked()))?;
    }
    let pasta = if need_pasta { Some(engine.start_pasta()?) } else { None };
    point_resolver(engine)?;
    Ok((pasta, netns))
}

/// Point the sandbox's resolver at the DNS proxy (written once; the
/// sandbox may change it, and then it is on its own). Blocking.
fn point_resolver(engine: &jail::Sandbox) -> jail::Result<()> {
    let fs = engine.fs()?;
    let path = jail::fs::SandboxPath::parse("/etc/resolv.conf", "/").map_err(|e| jail::Error::Invalid(e.message))?;
    let current = fs.open_read(&path).ok().map(|(mut f, _)| {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut f, &mut s);
        s
    });
    if current.as_deref() != Some(RESOLV_CONF) {
        let mut w = fs.write(&path, false, Some(0o644), true).map_err(|e| jail::Error::Invalid(e.message))?;
        std::io::Write::write_all(w.file(), RESOLV_CONF.as_bytes()).map_err(|e| jail::Error::io("write resolv.conf", e))?;
        w.commit().map_err(|e| jail::Error::Invalid(e.message))?;
    }
    Ok(())
}

/// A warm-pool spare's way out, made ahead of time for the default policy
/// (`true`): pasta, the open firewall and the resolver. Blocking.
pub fn prepare_spare(engine: &jail::Sandbox) -> jail::Result<jail::net::Pasta> {
    let (pasta, _) = set_up(engine, &Rules::Open, true, true)?;
    pasta.ok_or_else(|| jail::Error::Invalid("no pasta".into()))
}

/// The sandbox's resolver: our DNS proxy inside its namespace.
const RESOLV_CONF: &str = "# forkbox: the server's DNS proxy in this sandbox's network namespace\nnameserver 127.0.0.53\noptions edns0\n";

/// Put `egress` in force for `entry` (the caller holds its network lock).
pub async fn apply(entry: &SandboxEntry, state: &mut NetState, egress: &Egress) -> Result<(), ApiError> {
    let plan = plan(egress)?;
    if let Some(upstream) = &entry.settings.setup.egress_proxy {
        apply_through_proxy(entry, state, plan, Arc::clone(upstream)).await?;
        *entry.egress.lock().unwrap_or_else(|e| e.into_inner()) = egress.clone();
        return Ok(());
    }
    let engine = Arc::clone(&entry.engine);
    match plan {
        Plan::Off => {
            state.dns = None;
            state.rules = None;
            *state.allowed.write().unwrap_or_else(|e| e.into_inner()) = None;
            if let Some(p) = state.pasta.take() {
                p.stop();
            }
            // Without pasta there is no interface and no route; the table
            // is dropped so a later `On` starts clean.
            let _ = tokio::task::spawn_blocking(move || {
                engine.netns().and_then(|ns| jail::net::nft(std::os::fd::AsFd::as_fd(&ns), "table inet forkbox\ndelete table inet forkbox\n"))
            })
            .await;
        }
        Plan::On { rules, names } => {
            let need_pasta = !state.pasta.as_ref().is_some_and(|p| p.alive());
            let need_rules = need_pasta || state.rules.as_ref() != Some(&rules);
            let in_force = rules.clone();
            let (pasta, netns) = tokio::task::spawn_blocking(move || set_up(&engine, &rules, need_pasta, need_rules))
                .await
                .map_err(|e| ApiError::engine("egress task failed", e))?
                .map_err(|e| ApiError::engine("could not set up the sandbox's network", e))?;
            state.rules = Some(in_force.clone());
            if let Some(p) = pasta {
                state.pasta = Some(p);
            }
            *state.allowed.write().unwrap_or_else(|e| e.into_inner()) = Some(Allowed { rules: in_force, names });
            start_dns(state, netns, true).await?;
        }
    }
    *entry.egress.lock().unwrap_or_else(|e| e.into_inner()) = egress.clone();
    Ok(())
}

/// The DNS proxy, if it is not running yet; `firewall`: addresses of
/// allowed names are let out through it (not with an upstream proxy, where
/// there is no way out to open).
async fn start_dns(state: &mut NetState, netns: std::os::fd::OwnedFd, firewall: bool) -> Result<(), ApiError> {
    if state.dns.is_none() {
        let upstream = upstream().ok_or_else(|| ApiError::Internal("the host has no nameserver in /etc/resolv.conf".into()))?;
        let dns = crate::dns::DnsProxy::start(netns, Arc::clone(&state.allowed), upstream, firewall).await;
        state.dns = Some(dns.map_err(|e| ApiError::engine("could not start the DNS proxy", e))?);
    }
    Ok(())
}

/// With `--egress-proxy`: no pasta and no firewall (the namespace has no
/// way out but its proxy), the sandbox's proxy serving the policy, and the
/// DNS proxy for code that looks names up itself.
async fn apply_through_proxy(entry: &SandboxEntry, state: &mut NetState, plan: Plan, upstream: Arc<egress_proxy::Upstream>) -> Result<(), ApiError> {
    match plan {
        Plan::Off => {
            *state.allowed.write().unwrap_or_else(|e| e.into_inner()) = None;
            state.proxy = None;
            state.dns = None;
        }
        Plan::On { rules, names } => {
            let engine = Arc::clone(&entry.engine);
            let netns = tokio::task::spawn_blocking(move || point_resolver(&engine).and_then(|()| engine.netns()))
                .await
                .map_err(|e| ApiError::engine("egress task failed", e))?
                .map_err(|e| ApiError::engine("could not set up the sandbox's network", e))?;
            if state.proxy.is_none() {
                let proxy = crate::upstream::start(&netns, &entry.id, Arc::clone(&state.allowed), upstream).await;
                state.proxy = Some(proxy.map_err(|e| match e.errno() {
                    // The sandbox's own process holds the address (its own loss).
                    Some(libc::EADDRINUSE) => ApiError::Conflict(format!(
                        "a process in the sandbox listens on {}:{}, where its egress proxy goes: stop it and try again",
                        crate::setup::PROXY_ADDR.0,
                        crate::setup::PROXY_ADDR.1
                    )),
                    _ => ApiError::engine("could not start the sandbox's egress proxy", e),
                })?);
            }
            *state.allowed.write().unwrap_or_else(|e| e.into_inner()) = Some(Allowed { rules, names });
            start_dns(state, netns, false).await?;
        }
    }
    Ok(())
}

/// Apply `egress` to a sandbox that was just made (create or fork), in the
/// background: the network lock is taken before this returns, so the
/// sandbox's first exec waits for the network, not its create.
pub async fn apply_soon(entry: &Arc<SandboxEntry>, egress: Egress) {
    *entry.egress.lock().unwrap_or_else(|e| e.into_inner()) = egress.clone();
    if egress.is_off() {
        return;
    }
    let mut guard = Arc::clone(&entry.network).lock_owned().await;
    let entry = Arc::clone(entry);
    tokio::spawn(async move {
        if let Err(e) = apply(&entry, &mut guard, &egress).await {
            tracing::warn!(sandbox = %entry.id, error = %e, "egress policy not applied");
            guard.failed = Some(format!("the sandbox's network could not be set up ({e}); it has loopback only"));
        }
    });
}

/// Give a new sandbox the way out the warm pool made for it ahead of time
/// (`prepare_spare`): with the default policy, `apply` then only starts the
/// DNS proxy.
pub fn adopt_pasta(entry: &SandboxEntry, pasta: jail::net::Pasta) {
    if let Ok(mut net) = entry.network.try_lock() {
        net.pasta = Some(pasta);
        net.rules = Some(Rules::Open);
    }
}

/// Put the sandbox's policy back in force after its namespaces were
/// rebuilt (the old network went with them).
pub async fn reapply(entry: &SandboxEntry) {
    let egress = entry.egress.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut net = entry.network.lock().await;
    *net = NetState::default();
    if let Err(e) = apply(entry, &mut net, &egress).await {
        tracing::warn!(sandbox = %entry.id, error = %e, "egress policy not restored after a rebuild");
    }
}

/// Stop a destroyed sandbox's network pieces now (not when the last
/// reference to it goes).
pub async fn teardown(entry: &SandboxEntry) {
    let mut net = entry.network.lock().await;
    net.dns = None;
    net.proxy = None;
    if let Some(p) = net.pasta.take() {
        p.stop();
    }
}

/// The host's first nameserver (where the DNS proxy sends allowed queries).
pub fn upstream() -> Option<std::net::SocketAddr> {
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

#[utoipa::path(get, path = "/v1/sandboxes/{id}/egress", params(("id" = String, Path)), responses((status = 200, body = EgressBody), (status = 404, body = protocol::ErrorBody)))]
pub async fn get(State(state): State<AppState>, caller: crate::keys::Caller, Path(id): Path<String>) -> Result<Response, ApiError> {
    let entry = state.get(&caller, &id).await?;
    let egress = entry.egress.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Ok((StatusCode::OK, axum::Json(EgressBody { egress })).into_response())
}

#[utoipa::path(patch, path = "/v1/sandboxes/{id}/egress", params(("id" = String, Path)), request_body = EgressBody,
    responses((status = 200, body = EgressBody), (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody)))]
pub async fn patch(
    State(state): State<AppState>,
    caller: crate::keys::Caller,
    Path(id): Path<String>,
    Json(body): Json<EgressBody>,
) -> Result<Response, ApiError> {
    let entry = state.get(&caller, &id).await?;
    plan(&body.egress)?;
    let mut net = entry.network.lock().await;
    apply(&entry, &mut net, &body.egress).await?;
    state.inner.records.save(&entry);
    Ok((StatusCode::OK, axum::Json(EgressBody { egress: body.egress })).into_response())
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
