//! One sandbox's egress policy (docs/network.md): when to put it in force and
//! what runs for it. How is the engine's (`jail::egress`): the policy's
//! check (`plan`), `pasta`, the firewall in the sandbox's namespace, and the
//! DNS proxy that answers only for allowed names and opens the firewall to
//! their addresses.

use std::sync::{Arc, RwLock};

use jail::egress::{plan, Allowed, Plan};
use jail::net::Rules;
use protocol::Egress;

use crate::error::Error;
use crate::sandbox::SandboxEntry;

/// What is running for one sandbox's network.
#[derive(Default)]
pub struct NetState {
    pasta: Option<jail::net::Pasta>,
    dns: Option<jail::egress::DnsProxy>,
    /// With `--egress-proxy`, the sandbox's proxy instead of pasta.
    proxy: Option<jail::egress::ProxyTask>,
    /// What the policy lets out (None: off).
    allowed: Arc<RwLock<Option<Allowed>>>,
    /// Why the policy asked for at create or fork could not be put in force
    /// (told to the sandbox's next exec).
    pub failed: Option<String>,
    /// The firewall rules in force in the sandbox's namespace.
    rules: Option<Rules>,
    /// The generation of the host's addresses its firewall blocks
    /// (`jail::host_addrs`); older than the latest, its blocked sets are
    /// rewritten.
    blocked_gen: u64,
    /// The policy lets the sandbox out, but nothing runs for it yet: its
    /// network sockets wait at its gate, and the first one starts its way
    /// out (`start_on_first_use`). Whatever puts a policy in force opens
    /// the gate.
    held: bool,
}

/// Put `egress` in force for `entry` (the caller holds its network lock),
/// then let the sandbox's network sockets through if they were held.
pub async fn apply(entry: &SandboxEntry, state: &mut NetState, egress: &Egress) -> Result<(), Error> {
    let applied = put_in_force(entry, state, egress).await;
    if std::mem::take(&mut state.held) {
        if let Err(e) = entry.engine.open_network().await {
            tracing::warn!(sandbox = %entry.id, error = %e, "could not let the sandbox's network sockets through");
        }
    }
    applied
}

async fn put_in_force(entry: &SandboxEntry, state: &mut NetState, egress: &Egress) -> Result<(), Error> {
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
                stop_pasta(p).await;
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
            // Read before the firewall is written, which reads the addresses
            // again: a change in between leaves it marked stale, not current.
            let blocked_gen = jail::host_addrs::current().generation;
            let need_rules = need_pasta || state.rules.as_ref() != Some(&rules) || state.blocked_gen < blocked_gen;
            let in_force = rules.clone();
            let (pasta, netns) = tokio::task::spawn_blocking(move || engine.set_up_network(&rules, need_pasta, need_rules))
                .await
                .map_err(|e| Error::internal("egress task failed", e))?
                .map_err(|e| Error::internal("could not set up the sandbox's network", e))?;
            state.rules = Some(in_force.clone());
            if need_rules {
                state.blocked_gen = blocked_gen;
            }
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
async fn start_dns(state: &mut NetState, netns: std::os::fd::OwnedFd, firewall: bool) -> Result<(), Error> {
    if state.dns.is_none() {
        let upstream = jail::egress::host_resolver().ok_or_else(|| Error::Internal("the host has no nameserver in /etc/resolv.conf".into()))?;
        let dns = jail::egress::DnsProxy::start(netns, Arc::clone(&state.allowed), upstream, firewall).await;
        state.dns = Some(dns.map_err(|e| Error::internal("could not start the DNS proxy", e))?);
    }
    Ok(())
}

/// With `--egress-proxy`: no pasta and no firewall (the namespace has no
/// way out but its proxy), the sandbox's proxy serving the policy, and the
/// DNS proxy for code that looks names up itself.
async fn apply_through_proxy(entry: &SandboxEntry, state: &mut NetState, plan: Plan, upstream: Arc<jail::egress::Upstream>) -> Result<(), Error> {
    match plan {
        Plan::Off => {
            *state.allowed.write().unwrap_or_else(|e| e.into_inner()) = None;
            state.proxy = None;
            state.dns = None;
        }
        Plan::On { rules, names } => {
            let engine = Arc::clone(&entry.engine);
            let netns = tokio::task::spawn_blocking(move || engine.point_resolver().and_then(|()| engine.netns()))
                .await
                .map_err(|e| Error::internal("egress task failed", e))?
                .map_err(|e| Error::internal("could not set up the sandbox's network", e))?;
            if state.proxy.is_none() {
                let proxy = jail::egress::start_proxy(&netns, &entry.id, Arc::clone(&state.allowed), upstream).await;
                state.proxy = Some(proxy.map_err(|e| match e.errno() {
                    // The sandbox's own process holds the address (its own loss).
                    Some(libc::EADDRINUSE) => Error::Conflict(format!(
                        "a process in the sandbox listens on {}:{}, where its egress proxy goes: stop it and try again",
                        jail::egress::PROXY_ADDR.0,
                        jail::egress::PROXY_ADDR.1
                    )),
                    _ => Error::internal("could not start the sandbox's egress proxy", e),
                })?);
            }
            *state.allowed.write().unwrap_or_else(|e| e.into_inner()) = Some(Allowed { rules, names });
            start_dns(state, netns, false).await?;
        }
    }
    Ok(())
}

/// Apply `egress` to a sandbox that was just made (create, fork, restore,
/// adoption, a template build), in the background: the network lock is
/// taken before this returns, so the sandbox's first exec waits for it,
/// not its create.
///
/// A policy that lets the sandbox out is held until its first network
/// socket (docs/network.md#the-way-out-starts-on-first-use): pasta, the
/// firewall and the DNS proxy cost about 20 ms of CPU to start and as much
/// to stop, and most sandboxes never use the network. Only the resolver is
/// pointed at once: a program reads it before it opens the socket that
/// starts the rest.
pub async fn apply_soon(entry: &Arc<SandboxEntry>, egress: Egress) {
    *entry.egress.lock().unwrap_or_else(|e| e.into_inner()) = egress.clone();
    if egress.is_off() {
        return;
    }
    let mut guard = Arc::clone(&entry.network).lock_owned().await;
    let wanted = match entry.engine.hold_network().await {
        Ok(wanted) => wanted,
        Err(e) => {
            tracing::warn!(sandbox = %entry.id, error = %e, "could not hold the sandbox's network until its first use");
            None
        }
    };
    let entry = Arc::clone(entry);
    let Some(wanted) = wanted else {
        tokio::spawn(async move {
            apply_or_note(&entry, &mut guard, &egress).await;
        });
        return;
    };
    guard.held = true;
    tokio::spawn(async move {
        let engine = Arc::clone(&entry.engine);
        let pointed = tokio::task::spawn_blocking(move || engine.point_resolver()).await;
        if let Some(e) = pointed.map_err(|e| e.to_string()).and_then(|r| r.map_err(|e| e.to_string())).err() {
            tracing::warn!(sandbox = %entry.id, error = %e, "could not point the sandbox's resolver");
        }
        drop(guard);
        // Only a weak hold while it waits: a sandbox that never uses the
        // network is not kept alive by it (its gate's sender goes with it).
        let weak = Arc::downgrade(&entry);
        drop(entry);
        if wanted.await.is_ok() {
            if let Some(entry) = weak.upgrade() {
                start_on_first_use(&entry).await;
            }
        }
    });
}

/// A process of the sandbox asked for its first network socket and waits:
/// put its policy in force (unless something did meanwhile), which lets
/// it through.
async fn start_on_first_use(entry: &SandboxEntry) {
    let mut net = entry.network.lock().await;
    if !net.held {
        drop(net);
        // Put in force (and opened) meanwhile, or turned off: open, in
        // case the call came before the gate opened.
        let _ = entry.engine.open_network().await;
        return;
    }
    let egress = entry.egress.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let started = std::time::Instant::now();
    if apply_or_note(entry, &mut net, &egress).await {
        tracing::debug!(sandbox = %entry.id, ms = started.elapsed().as_millis() as u64, "way out started on first use");
    }
}

/// `apply` where no caller waits for the answer: a failure is logged and
/// kept for the sandbox's next exec to report. True if it was applied.
async fn apply_or_note(entry: &SandboxEntry, net: &mut NetState, egress: &Egress) -> bool {
    match apply(entry, net, egress).await {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(sandbox = %entry.id, error = %e, "egress policy not applied");
            net.failed = Some(format!("the sandbox's network could not be set up ({e}); it has loopback only"));
            false
        }
    }
}

/// Keep every sandbox's firewall blocking the host's addresses as they
/// change (docs/network.md#the-host-is-never-reached). Runs for the
/// server's life.
pub async fn follow_host_addrs(service: crate::Service) {
    if service.inner.config.egress_proxy.is_some() {
        // No firewall: the namespaces have no way out but their proxy.
        return;
    }
    let mut changes = jail::host_addrs::subscribe();
    while changes.changed().await.is_ok() {
        let blocked = Arc::clone(&changes.borrow_and_update());
        let entries: Vec<Arc<SandboxEntry>> = service.inner.sandboxes.read().await.values().cloned().collect();
        for entry in entries {
            refresh_blocked(&entry, &blocked).await;
        }
    }
}

async fn refresh_blocked(entry: &SandboxEntry, blocked: &Arc<jail::host_addrs::Blocked>) {
    let mut net = entry.network.lock().await;
    if net.rules.is_none() || net.blocked_gen >= blocked.generation {
        return;
    }
    let (engine, program) = (Arc::clone(&entry.engine), jail::net::blocked_update(&blocked.nets, &blocked.denied));
    let done = tokio::task::spawn_blocking(move || engine.netns().and_then(|ns| jail::net::nft(std::os::fd::AsFd::as_fd(&ns), &program))).await;
    match done {
        Ok(Ok(())) => net.blocked_gen = blocked.generation,
        // Gone or rebuilding: a rebuild writes the whole firewall again.
        Ok(Err(e)) => tracing::warn!(sandbox = %entry.id, error = %e, "could not block the host's new addresses"),
        Err(e) => tracing::warn!(sandbox = %entry.id, error = %e, "could not block the host's new addresses"),
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
        stop_pasta(p).await;
    }
}

/// Stop `pasta` on the blocking pool: `stop` waits for it to exit, and its
/// exit takes the sandbox's tap interface down, tens of milliseconds under
/// load. On a runtime worker that wait stalled every other request the
/// worker had (bench/churn.py: one delete in 20 clients' loops each 80 ms).
pub(crate) async fn stop_pasta(p: jail::net::Pasta) {
    let _ = tokio::task::spawn_blocking(move || p.stop()).await;
}
