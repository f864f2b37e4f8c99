//! A sandbox's way out (docs/network.md): user-mode networking by `pasta`
//! attached to the member's network namespace, and an nftables firewall
//! inside that namespace that the sandbox cannot change (its processes have
//! no `CAP_NET_ADMIN`).
//!
//! Nothing here touches the host's own network configuration: pasta turns
//! the sandbox's packets into ordinary sockets of a host process, and the
//! rules live in the sandbox's namespace.

use std::io::Write;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use ipnet::IpNet;

use crate::error::{Error, Result};

/// The address the sandbox's resolver is told to use; the server answers
/// there, inside the sandbox's namespace.
pub const DNS_ADDR: std::net::Ipv4Addr = std::net::Ipv4Addr::new(127, 0, 0, 53);

/// What the firewall lets out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rules {
    /// Everything but the host and link-local / metadata addresses.
    Open,
    /// Only these networks, and addresses the DNS proxy learnt for allowed
    /// names (`allow_learned`). Explicit networks may include addresses
    /// that are otherwise always blocked.
    AllowList(Vec<IpNet>),
}

/// Networks a sandbox never reaches unless an allow-list names them: the
/// host's own addresses, loopback, link-local (cloud metadata lives at
/// 169.254.169.254), and "this network".
pub fn always_blocked() -> Vec<IpNet> {
    let mut nets: Vec<IpNet> =
        ["127.0.0.0/8", "169.254.0.0/16", "0.0.0.0/8", "::1/128", "fe80::/10", "::ffff:0:0/96"].iter().filter_map(|s| s.parse().ok()).collect();
    if let Ok(addrs) = nix::ifaddrs::getifaddrs() {
        for a in addrs {
            let ip =
                a.address.as_ref().and_then(|s| s.as_sockaddr_in().map(|v4| IpAddr::V4(v4.ip())).or_else(|| s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))));
            if let Some(ip) = ip {
                nets.push(IpNet::from(ip));
            }
        }
    }
    nets.sort();
    nets.dedup();
    nets
}

/// Networks no sandbox reaches, not even by naming them in an allow-list:
/// a cluster node's etcd, object store and peers, and what its operator
/// names (`host_addrs::deny`).
static DENIED: std::sync::RwLock<Vec<IpNet>> = std::sync::RwLock::new(Vec::new());

pub(crate) fn set_denied(nets: Vec<IpNet>) {
    if let Ok(mut n) = DENIED.write() {
        *n = nets;
    }
}

/// The networks no sandbox reaches (`DENIED`).
pub fn denied() -> Vec<IpNet> {
    DENIED.read().map(|n| n.clone()).unwrap_or_default()
}

fn elements(nets: &[IpNet], v4: bool) -> String {
    nets.iter().filter(|n| matches!(n, IpNet::V4(_)) == v4).map(|n| n.trunc().to_string()).collect::<Vec<_>>().join(", ")
}

fn set(name: &str, v4: bool, nets: &[IpNet]) -> String {
    let ty = if v4 { "ipv4_addr" } else { "ipv6_addr" };
    let els = elements(nets, v4);
    let els = if els.is_empty() { String::new() } else { format!(" elements = {{ {els} }};") };
    format!("  set {name} {{ type {ty}; flags interval; auto-merge;{els} }}\n")
}

/// The nftables program for `rules` (replaces any earlier one): `denied`
/// refused first, then what an allow-list names let through, then
/// `blocked` refused.
pub fn ruleset(rules: &Rules, blocked: &[IpNet], denied: &[IpNet]) -> String {
    let explicit: &[IpNet] = match rules {
        Rules::AllowList(nets) => nets,
        Rules::Open => &[],
    };
    let mut out = String::from("table inet forkbox\ndelete table inet forkbox\ntable inet forkbox {\n");
    for (name, nets) in [("denied", denied), ("explicit", explicit), ("blocked", blocked), ("learned", &[][..])] {
        out += &set(&format!("{name}4"), true, nets);
        out += &set(&format!("{name}6"), false, nets);
    }
    // Refusals are immediate: a TCP reset or an ICMP error, never a timeout.
    let refuse = "meta l4proto tcp reject with tcp reset\n    reject with icmpx type admin-prohibited";
    out += "  chain out {\n    type filter hook output priority 0; policy accept;\n    oifname \"lo\" accept\n    \
         ip daddr @denied4 goto refuse\n    ip6 daddr @denied6 goto refuse\n    \
         ip daddr @explicit4 accept\n    ip6 daddr @explicit6 accept\n    \
         ip daddr @blocked4 goto refuse\n    ip6 daddr @blocked6 goto refuse\n";
    if matches!(rules, Rules::AllowList(_)) {
        out += "    ip daddr @learned4 accept\n    ip6 daddr @learned6 accept\n    goto refuse\n";
    }
    out += &format!("  }}\n  chain refuse {{\n    {refuse}\n  }}\n}}\n");
    out
}

/// Run `nft -f -` with `program` inside the namespace `netns`.
pub fn nft(netns: BorrowedFd<'_>, program: &str) -> Result<()> {
    let raw = netns.as_raw_fd();
    let mut cmd = Command::new(crate::tools::find_tool("nft").unwrap_or_else(|| "nft".into()));
    cmd.arg("-f").arg("-").stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::piped());
    // SAFETY: setns(2) in the forked child before exec; async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(raw, libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| Error::io("run nft (apt-get install nftables)", e))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(program.as_bytes()).map_err(|e| Error::io("feed nft", e))?;
    }
    let out = child.wait_with_output().map_err(|e| Error::io("wait for nft", e))?;
    if !out.status.success() {
        return Err(Error::Command { what: "nft".into(), stderr: String::from_utf8_lossy(&out.stderr).into_owned() });
    }
    Ok(())
}

/// The nftables program that replaces the blocked and denied sets of a
/// firewall `ruleset` wrote (one transaction: the sandbox never sees them
/// empty).
pub fn blocked_update(blocked: &[IpNet], denied: &[IpNet]) -> String {
    let mut program = String::new();
    for (name, nets, v4) in [("blocked4", blocked, true), ("blocked6", blocked, false), ("denied4", denied, true), ("denied6", denied, false)] {
        program += &format!("flush set inet forkbox {name}\n");
        let els = elements(nets, v4);
        if !els.is_empty() {
            program += &format!("add element inet forkbox {name} {{ {els} }}\n");
        }
    }
    program
}

/// Let the sandbox reach `addrs` (answers of allowed names; allow-lists only).
pub fn allow_learned(netns: BorrowedFd<'_>, addrs: &[IpAddr]) -> Result<()> {
    let (v4, v6): (Vec<IpNet>, Vec<IpNet>) = addrs.iter().map(|a| IpNet::from(*a)).partition(|n| matches!(n, IpNet::V4(_)));
    let mut program = String::new();
    for (set, nets) in [("learned4", v4), ("learned6", v6)] {
        if !nets.is_empty() {
            program += &format!("add element inet forkbox {set} {{ {} }}\n", elements(&nets, set == "learned4"));
        }
    }
    if program.is_empty() {
        return Ok(());
    }
    nft(netns, &program)
}

/// Run `f` on a new thread that has entered `netns`: sockets it opens live
/// in the sandbox's namespace (a thread may change its own network
/// namespace; the process keeps its own). The thread hands the result over
/// and exits, so there is nothing to restore and no runtime worker waits.
pub async fn in_netns<T: Send + 'static>(netns: &OwnedFd, f: impl FnOnce() -> std::io::Result<T> + Send + 'static) -> Result<T> {
    let fd = netns.try_clone().map_err(|e| Error::io("dup netns", e))?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("forkbox-netns".into())
        .spawn(move || {
            let made = nix::sched::setns(fd.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from).and_then(|()| f());
            let _ = tx.send(made);
        })
        .map_err(|e| Error::io("spawn netns thread", e))?;
    rx.await.map_err(|_| Error::Invalid("the netns thread died".into()))?.map_err(|e| Error::io("in the sandbox's network namespace", e))
}

/// A running `pasta` serving one sandbox's namespace: a child of the
/// server, killed and reaped by `stop` (or on drop).
pub struct Pasta {
    child: std::sync::Mutex<Option<std::process::Child>>,
    pidfile: std::path::PathBuf,
}

/// How long pasta may take to configure the namespace.
const PASTA_START: Duration = Duration::from_secs(10);

/// The descriptor pasta finds the sandbox's network namespace on.
const PASTA_NETNS_FD: i32 = 3;

/// Whether the namespace that `/proc/<pid>/net/route` shows has a default
/// route yet (pasta adds it last when it configures the namespace).
fn has_default_route(route: &Path) -> bool {
    std::fs::read_to_string(route).map(|t| t.lines().skip(1).any(|l| l.split_whitespace().nth(1) == Some("00000000"))).unwrap_or(false)
}

impl Pasta {
    /// Start pasta for the network namespace of the process `ns_pid` (it
    /// configures a tap interface there with the host's addresses and
    /// routes) and wait until the namespace has its default route. Its pid
    /// goes to `pidfile`, so a server that crashed can find it
    /// (`kill_stale`). Blocking.
    pub fn start(ns_pid: i32, pidfile: &Path) -> Result<Pasta> {
        let pasta = crate::tools::find_tool("pasta").ok_or_else(|| Error::MissingTool { tool: "pasta".into(), package: "passt".into() })?;
        // pasta gets the namespace as an open descriptor (fd 3): it drops
        // its capabilities before it opens a path, and a family's
        // namespaces belong to the family's own host uid, not to root
        // (shim/family.rs), so it could no longer open /proc/<pid>/ns/net.
        let netns = std::fs::File::open(format!("/proc/{ns_pid}/ns/net")).map_err(|e| Error::io("open the sandbox's network namespace", e))?;
        let netns_fd = std::os::fd::AsRawFd::as_raw_fd(&netns);
        let mut command = Command::new(pasta);
        // SAFETY: dup2 is async-signal-safe; it runs in the forked child
        // before exec and touches no memory of the parent.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
                if libc::dup2(netns_fd, PASTA_NETNS_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command
            .args(["--runas", "0", "--netns-only", "--config-net", "--no-map-gw", "--quiet", "--foreground"])
            // No port forwarding either way: by default pasta would offer the
            // host's listening ports on the sandbox's loopback (`-T auto`),
            // and the sandbox's on the host's (`-t auto`).
            .args(["--tcp-ports", "none", "--udp-ports", "none", "--tcp-ns", "none", "--udp-ns", "none"])
            .arg("--netns")
            .arg(format!("/proc/self/fd/{PASTA_NETNS_FD}"))
            .arg("--pid")
            .arg(pidfile)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| Error::io("start pasta", e))?;
        let route = std::path::PathBuf::from(format!("/proc/{ns_pid}/net/route"));
        let deadline = std::time::Instant::now() + PASTA_START;
        while !has_default_route(&route) {
            let exited = child.try_wait().map_err(|e| Error::io("wait for pasta", e))?;
            if exited.is_some() || std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::Invalid(format!("pasta did not configure the sandbox's network ({exited:?})")));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(Pasta { child: std::sync::Mutex::new(Some(child)), pidfile: pidfile.to_path_buf() })
    }

    /// Stop it (the sandbox's tap interface goes with it) and reap it.
    pub fn stop(&self) {
        if let Some(mut child) = self.child.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_file(&self.pidfile);
        }
    }

    pub fn alive(&self) -> bool {
        self.child.lock().unwrap_or_else(|e| e.into_inner()).as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for Pasta {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Kill the pastas a crashed server left: every pasta whose pid file lies
/// under `dir` (read from its command line, so one killed before it wrote
/// the file is found too).
pub fn kill_stale(dir: &Path) {
    let Ok(procs) = std::fs::read_dir("/proc") else { return };
    let dir = dir.as_os_str().as_encoded_bytes();
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        // Debian's /usr/bin/pasta execs `pasta.avx2` (comm `passt.avx2`).
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if !(comm.starts_with("pasta") || comm.starts_with("passt")) {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let mut args = cmdline.split(|b| *b == 0);
        let ours = args.any(|a| a == b"--pid") && args.next().is_some_and(|file| file.starts_with(dir) && file.get(dir.len()) == Some(&b'/'));
        if ours {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rulesets_block_the_host_and_refuse_at_once() {
        let blocked: Vec<IpNet> = vec!["127.0.0.0/8".parse().unwrap(), "192.0.2.2/32".parse().unwrap(), "fe80::/10".parse().unwrap()];
        let open = ruleset(&Rules::Open, &blocked, &[]);
        assert!(open.contains("set blocked4 { type ipv4_addr; flags interval; auto-merge; elements = { 127.0.0.0/8, 192.0.2.2/32 }; }"), "{open}");
        assert!(open.contains("elements = { fe80::/10 }"));
        assert!(open.contains("ip daddr @blocked4 goto refuse") && !open.contains("@learned4 accept"));
        assert!(open.contains("reject with tcp reset"));
        let denied: Vec<IpNet> = vec!["10.96.0.0/12".parse().unwrap()];
        let allow = ruleset(
            &Rules::AllowList(vec!["203.0.113.0/24".parse().unwrap(), "169.254.169.254/32".parse().unwrap(), "10.96.0.1/32".parse().unwrap()]),
            &blocked,
            &denied,
        );
        assert!(
            allow.contains("set explicit4 { type ipv4_addr; flags interval; auto-merge; elements = { 203.0.113.0/24, 169.254.169.254/32, 10.96.0.1/32 }; }"),
            "{allow}"
        );
        // explicit before blocked: an allow-list may name a blocked address,
        // but never a denied one.
        let (d, e, b) = (allow.find("@denied4 goto").unwrap(), allow.find("@explicit4 accept").unwrap(), allow.find("@blocked4 goto").unwrap());
        assert!(d < e && e < b);
        assert!(allow.contains("set denied4 { type ipv4_addr; flags interval; auto-merge; elements = { 10.96.0.0/12 }; }"), "{allow}");
        assert!(allow.trim_end().contains("@learned6 accept\n    goto refuse"));
    }

    #[test]
    fn blocked_sets_are_replaced_in_one_program() {
        let blocked: Vec<IpNet> = vec!["127.0.0.0/8".parse().unwrap(), "10.9.8.7/32".parse().unwrap()];
        let program = blocked_update(&blocked, &["10.96.0.0/12".parse().unwrap()]);
        assert_eq!(
            program,
            "flush set inet forkbox blocked4\nadd element inet forkbox blocked4 { 127.0.0.0/8, 10.9.8.7/32 }\nflush set inet forkbox blocked6\n\
             flush set inet forkbox denied4\nadd element inet forkbox denied4 { 10.96.0.0/12 }\nflush set inet forkbox denied6\n"
        );
    }

    #[test]
    fn the_host_is_always_blocked() {
        let nets = always_blocked();
        assert!(nets.contains(&"169.254.0.0/16".parse().unwrap()));
        assert!(nets.iter().any(|n| n.contains(&"127.0.0.1".parse::<IpAddr>().unwrap())));
    }
}
