//! Seccomp filter and capability set applied to every process inside a
//! sandbox.
//!
//! The policy itself is data, embedded at compile time:
//!
//! * `policy/seccomp.json` — two filters in the JSON format of the
//!   `seccompiler` crate:
//!   * `member`: an allow-list modelled on Docker's default seccomp profile
//!     (moby `profiles/seccomp/default.json`) for a container without
//!     `CAP_SYS_ADMIN`, and at least as strict. Anything not listed fails with
//!     `EPERM`. `clone` is allowed only without namespace flags, `socket` for
//!     every family but `AF_VSOCK`, `personality` only for Docker's safe
//!     values, `ioctl` for every request but `TIOCSTI`/`TIOCLINUX`.
//!   * `member_enosys`: allows everything except `clone3`, which fails with
//!     `ENOSYS`. The flags of `clone3` live in memory that a seccomp filter
//!     cannot read, so the only safe answer is "not implemented", which makes
//!     glibc fall back to `clone`, whose flags `member` checks.
//! * `policy/capabilities.toml` — the capabilities a sandbox process keeps:
//!   Docker's default set without `CAP_NET_RAW` and `CAP_MKNOD`.
//!
//! # Why two filters, and in which order
//!
//! `seccompiler` gives a filter a single match action and a single mismatch
//! action, so "allow these, `ENOSYS` for that one, `EPERM` for the rest" needs
//! two stacked filters. The kernel runs every installed filter, newest first
//! (`seccomp_run_filters` walks `current->seccomp.filter` → `prev`), and keeps
//! a result only if its action is strictly more restrictive than the one it
//! already has. For `clone3` both filters answer `SECCOMP_RET_ERRNO` — `member`
//! with `EPERM` (clone3 is not on its list), `member_enosys` with `ENOSYS` —
//! a tie, so the result of the filter run first, i.e. the one installed
//! *last*, wins. [`install`] therefore installs `member` first and
//! `member_enosys` second. For every other syscall `member_enosys` says
//! `ALLOW`, the least restrictive action, so `member` decides.
//!
//! Syscalls from a foreign ABI (32-bit `int 0x80` on x86_64) fail the
//! architecture check that `seccompiler` puts at the top of both filters and
//! kill the process; x32 syscall numbers (`nr | 0x40000000`) match nothing on
//! the allow-list and get `EPERM`.
//!
//! The JSON is written for x86_64. On aarch64 the legacy syscalls that do not
//! exist there (`open`, `stat`, `fork`, …; see `X86_64_ONLY`) are dropped
//! before compiling.

use std::collections::HashSet;

use seccompiler::{BpfProgram, TargetArch};
use serde::Deserialize;

/// The seccomp policy, in `seccompiler`'s JSON format.
pub const SECCOMP_JSON: &str = include_str!("../policy/seccomp.json");
/// The capability set, one `[[capability]]` table per capability.
pub const CAPABILITIES_TOML: &str = include_str!("../policy/capabilities.toml");

/// Name of the allow-list filter in [`SECCOMP_JSON`].
pub const MEMBER_FILTER: &str = "member";
/// Name of the `clone3` → `ENOSYS` filter in [`SECCOMP_JSON`].
pub const MEMBER_ENOSYS_FILTER: &str = "member_enosys";

/// Capabilities that must never be granted, whatever `capabilities.toml` says.
const FORBIDDEN_CAPABILITIES: &[caps::Capability] = &[
    caps::Capability::CAP_SYS_ADMIN,
    caps::Capability::CAP_SYS_PTRACE,
    caps::Capability::CAP_SYS_MODULE,
    caps::Capability::CAP_SYS_RAWIO,
    caps::Capability::CAP_SYS_BOOT,
    caps::Capability::CAP_SYS_TIME,
    caps::Capability::CAP_NET_RAW,
    caps::Capability::CAP_NET_ADMIN,
    caps::Capability::CAP_BPF,
    caps::Capability::CAP_PERFMON,
    caps::Capability::CAP_MAC_ADMIN,
    caps::Capability::CAP_MAC_OVERRIDE,
    caps::Capability::CAP_DAC_READ_SEARCH,
    caps::Capability::CAP_SYSLOG,
];

/// Syscalls in [`SECCOMP_JSON`] that exist on x86_64 but not on aarch64 (the
/// legacy, non-`at` forms); they are dropped when compiling for aarch64.
const X86_64_ONLY: &[&str] = &[
    "access",
    "alarm",
    "arch_prctl",
    "chmod",
    "chown",
    "creat",
    "dup2",
    "epoll_create",
    "epoll_wait",
    "eventfd",
    "fork",
    "futimesat",
    "get_thread_area",
    "getdents",
    "getpgrp",
    "inotify_init",
    "lchown",
    "link",
    "lstat",
    "mkdir",
    "mknod",
    "open",
    "pause",
    "pipe",
    "poll",
    "readlink",
    "rename",
    "rmdir",
    "select",
    "set_thread_area",
    "signalfd",
    "stat",
    "symlink",
    "time",
    "unlink",
    "utime",
    "utimes",
    "vfork",
];

/// Errors loading or applying the sandbox policy.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("seccomp policy is not supported on architecture {0}")]
    UnsupportedArch(&'static str),
    #[error("seccomp policy is not valid json: {0}")]
    Json(#[source] serde_json::Error),
    #[error("seccomp policy does not compile: {0}")]
    Compile(#[source] seccompiler::Error),
    #[error("seccomp policy has no filter named {0:?}")]
    MissingFilter(&'static str),
    #[error("failed to install seccomp filter {name:?}: {source}")]
    Install {
        name: &'static str,
        #[source]
        source: seccompiler::Error,
    },
    #[error("capability policy is not valid toml: {0}")]
    Toml(#[source] toml::de::Error),
    #[error("unknown capability {0:?}")]
    UnknownCapability(String),
    #[error("capability {0} is listed twice")]
    DuplicateCapability(String),
    #[error("capability {0} must never be granted to a sandbox")]
    ForbiddenCapability(String),
    #[error("capability {0} has no explanation")]
    MissingReason(String),
}

/// The two compiled BPF programs, ready for [`install`].
#[derive(Debug, Clone)]
pub struct SeccompPolicy {
    /// The allow-list; everything else fails with `EPERM`.
    pub member: BpfProgram,
    /// Makes `clone3` fail with `ENOSYS`; allows everything else.
    pub member_enosys: BpfProgram,
    /// The REPL's allow-list: `member`, plus `setns(fd, CLONE_NEWPID)` (the
    /// REPL moves its children into the sandbox's leaf pid namespace, see
    /// repl/repl.py) and setns of an explicit mount/net/uts/ipc type (a
    /// forked REPL enters its new member), minus `pidfd_open` (a pidfd would let it join another
    /// sandbox's namespaces with setns).
    pub repl: BpfProgram,
}

/// The name of the REPL's filter, derived from `member` at compile time.
pub const REPL_FILTER: &str = "repl";
const CLONE_NEWPID: u64 = 0x2000_0000;
/// Namespace types a forked REPL enters besides pid.
const FORK_NAMESPACES: [(u64, &str); 4] = [(0x0002_0000, "mount"), (0x4000_0000, "network"), (0x0400_0000, "uts"), (0x0800_0000, "ipc")];

/// Add the `repl` filter to a policy document: a copy of `member` with the
/// REPL's differences, so the two can never drift apart.
fn with_repl_filter(json: &str) -> Result<String, PolicyError> {
    let mut doc: serde_json::Value = serde_json::from_str(json).map_err(PolicyError::Json)?;
    let mut repl = doc.get(MEMBER_FILTER).cloned().ok_or(PolicyError::MissingFilter(MEMBER_FILTER))?;
    if let Some(rules) = repl.get_mut("filter").and_then(|r| r.as_array_mut()) {
        rules.retain(|rule| rule.get("syscall").and_then(|s| s.as_str()) != Some("pidfd_open"));
        rules.push(serde_json::json!({
            "syscall": "setns",
            "args": [{"index": 1, "type": "dword", "op": "eq", "val": CLONE_NEWPID,
                      "comment": "only pid namespaces: pid_for_children of the REPL's own threads"}],
            "comment": "the REPL switches between its family and leaf pid namespaces"
        }));
        // A forked REPL enters its new member's namespaces (docs/architecture.md#processes-and-namespaces).
        // It can only name namespaces it holds descriptors for: its own
        // (its /proc shows only its member) and, during a fork, the new
        // members' the server hands it.
        for (flag, what) in FORK_NAMESPACES {
            rules.push(serde_json::json!({
                "syscall": "setns",
                "args": [{"index": 1, "type": "dword", "op": "eq", "val": flag,
                          "comment": format!("only an explicit {what} namespace type")}],
                "comment": "a forked REPL enters its new member's namespaces"
            }));
        }
    }
    if let Some(map) = doc.as_object_mut() {
        map.insert(REPL_FILTER.to_string(), repl);
    }
    serde_json::to_string(&doc).map_err(PolicyError::Json)
}

/// Capabilities of the REPL process: the sandbox set plus CAP_SYS_ADMIN
/// (within the family's user namespace only), which `setns` needs. The REPL
/// drops it from its bounding set at start, so nothing it executes gets it.
pub fn repl_capabilities() -> Result<Vec<caps::Capability>, PolicyError> {
    let mut caps = capabilities()?;
    caps.push(caps::Capability::CAP_SYS_ADMIN);
    Ok(caps)
}

/// Install the REPL's filters (see [`install`] for the order).
pub fn install_repl(p: &SeccompPolicy) -> Result<(), PolicyError> {
    seccompiler::apply_filter(&p.repl).map_err(|source| PolicyError::Install { name: REPL_FILTER, source })?;
    seccompiler::apply_filter(&p.member_enosys).map_err(|source| PolicyError::Install { name: MEMBER_ENOSYS_FILTER, source })
}

/// Compiles [`SECCOMP_JSON`] for the architecture this binary runs on.
///
/// Allocates; call it before `fork`, then call [`install`] in the child.
pub fn seccomp() -> Result<SeccompPolicy, PolicyError> {
    compile_for(native_arch()?)
}

#[cfg(target_arch = "x86_64")]
fn native_arch() -> Result<TargetArch, PolicyError> {
    Ok(TargetArch::x86_64)
}

#[cfg(target_arch = "aarch64")]
fn native_arch() -> Result<TargetArch, PolicyError> {
    Ok(TargetArch::aarch64)
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn native_arch() -> Result<TargetArch, PolicyError> {
    Err(PolicyError::UnsupportedArch(std::env::consts::ARCH))
}

fn compile_for(arch: TargetArch) -> Result<SeccompPolicy, PolicyError> {
    let json = match arch {
        TargetArch::x86_64 => SECCOMP_JSON.to_owned(),
        TargetArch::aarch64 => without_syscalls(SECCOMP_JSON, X86_64_ONLY)?,
        TargetArch::riscv64 => return Err(PolicyError::UnsupportedArch("riscv64")),
    };
    let json = with_repl_filter(&json)?;
    let mut map = seccompiler::compile_from_json(json.as_bytes(), arch).map_err(PolicyError::Compile)?;
    let member = map.remove(MEMBER_FILTER).ok_or(PolicyError::MissingFilter(MEMBER_FILTER))?;
    let member_enosys = map.remove(MEMBER_ENOSYS_FILTER).ok_or(PolicyError::MissingFilter(MEMBER_ENOSYS_FILTER))?;
    let repl = map.remove(REPL_FILTER).ok_or(PolicyError::MissingFilter(REPL_FILTER))?;
    Ok(SeccompPolicy { member, member_enosys, repl })
}

/// Drops every rule naming one of `names` from every filter of a policy.
fn without_syscalls(json: &str, names: &[&str]) -> Result<String, PolicyError> {
    let mut doc: serde_json::Value = serde_json::from_str(json).map_err(PolicyError::Json)?;
    if let Some(filters) = doc.as_object_mut() {
        for filter in filters.values_mut() {
            if let Some(rules) = filter.get_mut("filter").and_then(|r| r.as_array_mut()) {
                rules.retain(|rule| rule.get("syscall").and_then(|s| s.as_str()).is_none_or(|s| !names.contains(&s)));
            }
        }
    }
    serde_json::to_string(&doc).map_err(PolicyError::Json)
}

/// Installs the policy on the calling thread: `member` first, then
/// `member_enosys` (see the module documentation for why the order matters).
///
/// Affects only the calling thread and the processes it creates afterwards;
/// call it in the single-threaded child before `execve`. It does not allocate
/// (`seccompiler::apply_filter` only builds a `sock_fprog` on the stack and
/// calls `prctl(PR_SET_NO_NEW_PRIVS)` and `seccomp(2)`), so it may run between
/// `fork` and `exec`, e.g. in a `pre_exec` hook. Both calls it makes are on
/// the `member` allow-list, so the second filter can be installed under the
/// first.
pub fn install(p: &SeccompPolicy) -> Result<(), PolicyError> {
    seccompiler::apply_filter(&p.member).map_err(|source| PolicyError::Install { name: MEMBER_FILTER, source })?;
    seccompiler::apply_filter(&p.member_enosys).map_err(|source| PolicyError::Install { name: MEMBER_ENOSYS_FILTER, source })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CapabilityFile {
    capability: Vec<CapabilityEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CapabilityEntry {
    name: String,
    why: String,
}

/// The capabilities a sandbox process keeps, parsed from
/// [`CAPABILITIES_TOML`]. Unknown, duplicated, unexplained or forbidden (e.g.
/// `CAP_SYS_ADMIN`) entries are errors.
pub fn capabilities() -> Result<Vec<caps::Capability>, PolicyError> {
    parse_capabilities(CAPABILITIES_TOML)
}

fn parse_capabilities(text: &str) -> Result<Vec<caps::Capability>, PolicyError> {
    let file: CapabilityFile = toml::from_str(text).map_err(PolicyError::Toml)?;
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(file.capability.len());
    for entry in file.capability {
        let cap: caps::Capability = entry.name.parse().map_err(|_| PolicyError::UnknownCapability(entry.name.clone()))?;
        if FORBIDDEN_CAPABILITIES.contains(&cap) {
            return Err(PolicyError::ForbiddenCapability(entry.name));
        }
        if entry.why.trim().is_empty() {
            return Err(PolicyError::MissingReason(entry.name));
        }
        if !seen.insert(cap) {
            return Err(PolicyError::DuplicateCapability(entry.name));
        }
        out.push(cap);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Syscalls that must fall to the mismatch action (`EPERM`) of `member`.
    /// `vm86`, `vm86old`, `open_tree_attr`, `lsm_*` … are not in
    /// seccompiler's x86_64 table at all (or not x86_64 syscalls), so they
    /// cannot be on the list either.
    const MUST_DENY: &[&str] = &[
        "mount",
        "umount2",
        "pivot_root",
        "move_mount",
        "open_tree",
        "fsopen",
        "fsconfig",
        "fsmount",
        "fspick",
        "mount_setattr",
        "unshare",
        "setns",
        "init_module",
        "finit_module",
        "delete_module",
        "kexec_load",
        "kexec_file_load",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "keyctl",
        "add_key",
        "request_key",
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "pidfd_getfd",
        "open_by_handle_at",
        "name_to_handle_at",
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "swapon",
        "swapoff",
        "reboot",
        "settimeofday",
        "clock_settime",
        "clock_adjtime",
        "adjtimex",
        "acct",
        "quotactl",
        "quotactl_fd",
        "lookup_dcookie",
        "iopl",
        "ioperm",
        "vhangup",
        "syslog",
        "nfsservctl",
        "uselib",
        "ustat",
        "sysfs",
        "_sysctl",
        "create_module",
        "get_kernel_syms",
        "query_module",
        "kcmp",
        "fanotify_init",
        "mbind",
        "set_mempolicy",
        "get_mempolicy",
        "set_mempolicy_home_node",
        "move_pages",
        "migrate_pages",
        "lsm_set_self_attr",
        "memfd_secret",
        "process_mrelease",
        "process_madvise",
        "modify_ldt",
        "clone3",
    ];

    fn rules(filter: &str) -> Vec<serde_json::Value> {
        let doc: serde_json::Value = serde_json::from_str(SECCOMP_JSON).unwrap();
        doc[filter]["filter"].as_array().unwrap().clone()
    }

    fn names(filter: &str) -> HashSet<String> {
        rules(filter).iter().map(|r| r["syscall"].as_str().unwrap().to_owned()).collect()
    }

    #[test]
    fn policy_json_compiles_for_native_arch() {
        let p = seccomp().expect("policy compiles");
        // seccompiler refuses programs of BPF_MAXINSNS (4096) or more.
        assert!(!p.member.is_empty() && p.member.len() < 4096);
        assert!(!p.member_enosys.is_empty());
    }

    #[test]
    fn policy_json_compiles_for_both_arches() {
        compile_for(TargetArch::x86_64).expect("x86_64");
        compile_for(TargetArch::aarch64).expect("aarch64");
    }

    #[test]
    fn x86_64_only_list_names_real_rules() {
        let member = names(MEMBER_FILTER);
        for name in X86_64_ONLY {
            assert!(member.contains(*name), "{name} is not in the policy");
        }
    }

    #[test]
    fn every_rule_and_condition_is_commented() {
        for filter in [MEMBER_FILTER, MEMBER_ENOSYS_FILTER] {
            for rule in rules(filter) {
                let c = rule["comment"].as_str().unwrap_or("");
                assert!(!c.trim().is_empty(), "uncommented rule {rule}");
                for arg in rule["args"].as_array().into_iter().flatten() {
                    let c = arg["comment"].as_str().unwrap_or("");
                    assert!(!c.trim().is_empty(), "uncommented condition in {rule}");
                }
            }
        }
    }

    #[test]
    fn dangerous_syscalls_are_not_allowed() {
        let member = names(MEMBER_FILTER);
        for name in MUST_DENY {
            assert!(!member.contains(*name), "{name} is on the allow-list");
        }
        assert_eq!(names(MEMBER_ENOSYS_FILTER), HashSet::from(["clone3".to_owned()]));
    }

    #[test]
    fn clone_mask_covers_every_namespace_flag() {
        let ns = libc::CLONE_NEWNS
            | libc::CLONE_NEWUTS
            | libc::CLONE_NEWIPC
            | libc::CLONE_NEWUSER
            | libc::CLONE_NEWPID
            | libc::CLONE_NEWNET
            | libc::CLONE_NEWCGROUP
            | 0x80; // CLONE_NEWTIME
        assert_eq!(ns, 0x7E02_0080);
        let clone: Vec<_> = rules(MEMBER_FILTER).into_iter().filter(|r| r["syscall"] == "clone").collect();
        assert_eq!(clone.len(), 1, "clone must have exactly one rule");
        let args = clone[0]["args"].as_array().expect("clone is conditional");
        assert_eq!(args.len(), 1);
        assert_eq!(args[0]["index"], 0);
        assert_eq!(args[0]["op"]["masked_eq"], ns as u64);
        assert_eq!(args[0]["val"], 0);
    }

    #[test]
    fn conditional_syscalls_have_no_unconditional_rule() {
        // seccompiler merges the rules of one syscall; an argument-less rule
        // next to conditional ones would be silently dropped, so forbid the mix.
        let mut conditional = HashSet::new();
        let mut plain = HashSet::new();
        for rule in rules(MEMBER_FILTER) {
            let name = rule["syscall"].as_str().unwrap().to_owned();
            if rule.get("args").is_some() {
                conditional.insert(name);
            } else {
                assert!(plain.insert(name.clone()), "{name} listed twice");
            }
        }
        assert!(conditional.is_disjoint(&plain));
    }

    #[test]
    fn capabilities_parse_and_exclude_dangerous_ones() {
        let caps = capabilities().expect("capabilities parse");
        assert_eq!(caps.len(), 12);
        for bad in [
            caps::Capability::CAP_SYS_ADMIN,
            caps::Capability::CAP_NET_RAW,
            caps::Capability::CAP_SYS_PTRACE,
            caps::Capability::CAP_SYS_MODULE,
            caps::Capability::CAP_MKNOD,
        ] {
            assert!(!caps.contains(&bad), "{bad} is granted");
        }
        assert!(caps.contains(&caps::Capability::CAP_CHOWN));
        assert!(caps.contains(&caps::Capability::CAP_SETUID));
    }

    #[test]
    fn capability_file_is_validated() {
        let one = |name: &str| format!("[[capability]]\nname = \"{name}\"\nwhy = \"x\"\n");
        assert!(matches!(parse_capabilities(&one("CAP_FLY")), Err(PolicyError::UnknownCapability(_))));
        assert!(matches!(parse_capabilities(&one("CAP_SYS_ADMIN")), Err(PolicyError::ForbiddenCapability(_))));
        assert!(matches!(parse_capabilities(&(one("CAP_KILL") + &one("CAP_KILL"))), Err(PolicyError::DuplicateCapability(_))));
        assert!(matches!(parse_capabilities("[[capability]]\nname = \"CAP_KILL\"\nwhy = \" \"\n"), Err(PolicyError::MissingReason(_))));
        assert!(matches!(parse_capabilities("[[capability]]\nname = \"CAP_KILL\"\n"), Err(PolicyError::Toml(_))));
    }

    const CHILD_ENV: &str = "FORKBOX_POLICY_ENFORCEMENT_CHILD";

    /// Runs [`enforcement_child`] in a fresh copy of this test binary, so the
    /// filters never touch the test runner's own threads.
    #[test]
    fn installed_policy_is_enforced() {
        let module = module_path!();
        let test = format!("{}::enforcement_child", module.split_once("::").map_or(module, |(_, rest)| rest));
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([test.as_str(), "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, "1")
            .output()
            .expect("re-exec the test binary");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "child failed ({}):\n{stdout}\n{stderr}", out.status);
        assert!(stdout.contains("1 passed"), "child did not run the test:\n{stdout}\n{stderr}");
        assert!(stdout.contains("policy enforcement checks done"), "child skipped the checks:\n{stdout}\n{stderr}");
    }

    fn errno() -> i32 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    /// Raw syscall with every argument passed as a full register.
    fn sys(nr: libc::c_long, args: &[libc::c_long]) -> libc::c_long {
        let a = |i: usize| args.get(i).copied().unwrap_or(0);
        // SAFETY: callers pass integers, null, or a deliberately bogus address
        // (1) that no allowed syscall here dereferences; calls that succeed
        // only touch the locals whose addresses the caller passes.
        unsafe { libc::syscall(nr, a(0), a(1), a(2), a(3), a(4), a(5)) }
    }

    /// Calls `nr` and records a failure unless it fails with `want`.
    fn expect_err(what: &str, nr: libc::c_long, args: &[libc::c_long], want: i32, failures: &mut Vec<String>) {
        let ret = sys(nr, args);
        let e = errno();
        if ret == 0 && nr == libc::SYS_clone {
            // A clone the filter should have refused went through: leave at
            // once in the child, report in the parent.
            // SAFETY: _exit is always safe to call.
            unsafe { libc::_exit(0) };
        }
        if ret != -1 || e != want {
            failures.push(format!("{what}: got ret={ret} errno={e}, want errno {want}"));
        }
    }

    /// Does nothing unless started by [`installed_policy_is_enforced`].
    #[test]
    fn enforcement_child() {
        use libc::c_long as L;
        if std::env::var_os(CHILD_ENV).is_none() {
            return;
        }
        let policy = seccomp().expect("policy compiles");
        // SAFETY: prctl with integer arguments only.
        let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
        assert_eq!(rc, 0, "no_new_privs");
        install(&policy).expect("install");

        let mut f = Vec::new();
        let f = &mut f;
        // A bogus address: without the filter the kernel fails with EFAULT
        // when it gets to reading it.
        let bad: L = 1;
        const EPERM: i32 = libc::EPERM;

        let pid = sys(libc::SYS_getpid, &[]);
        if pid <= 0 {
            f.push(format!("getpid: {pid}"));
        }
        // Unfiltered: EFAULT (the source string is copied before the
        // capability check).
        expect_err("mount", libc::SYS_mount, &[bad, bad, bad, 0, 0], EPERM, f);
        expect_err("umount2", libc::SYS_umount2, &[bad, 0], EPERM, f);
        expect_err("unshare(CLONE_NEWUSER)", libc::SYS_unshare, &[libc::CLONE_NEWUSER as L], EPERM, f);
        // Unfiltered: succeeds.
        expect_err("unshare(0)", libc::SYS_unshare, &[0], EPERM, f);
        expect_err("setns", libc::SYS_setns, &[-1, 0], EPERM, f);
        // Unfiltered: EINVAL (size 0 is below CLONE_ARGS_SIZE_VER0).
        expect_err("clone3", libc::SYS_clone3, &[0, 0], libc::ENOSYS, f);
        let ns_clone = (libc::CLONE_NEWUSER | libc::SIGCHLD) as L;
        expect_err("clone(CLONE_NEWUSER)", libc::SYS_clone, &[ns_clone, 0, 0, 0, 0], EPERM, f);
        let ns_clone = (libc::CLONE_NEWNET | libc::SIGCHLD) as L;
        expect_err("clone(CLONE_NEWNET)", libc::SYS_clone, &[ns_clone, 0, 0, 0, 0], EPERM, f);
        // Unfiltered: succeeds (we would become traced by our parent).
        expect_err("ptrace(PTRACE_TRACEME)", libc::SYS_ptrace, &[libc::PTRACE_TRACEME as L], EPERM, f);
        // Unfiltered: EOPNOTSUPP (unknown operation).
        expect_err("keyctl", libc::SYS_keyctl, &[0x7fff], EPERM, f);
        expect_err("add_key", libc::SYS_add_key, &[bad, bad, 0, 0, 0], EPERM, f);
        expect_err("bpf", libc::SYS_bpf, &[0x7fff, 0, 0], EPERM, f);
        expect_err("perf_event_open", libc::SYS_perf_event_open, &[0, 0, -1, -1, 0], EPERM, f);
        expect_err("userfaultfd", libc::SYS_userfaultfd, &[0], EPERM, f);
        expect_err("io_uring_setup", libc::SYS_io_uring_setup, &[0, 0], EPERM, f);
        expect_err("process_vm_readv", libc::SYS_process_vm_readv, &[1, 0, 0, 0, 0, 0], EPERM, f);
        expect_err("pidfd_getfd", libc::SYS_pidfd_getfd, &[-1, 0, 0], EPERM, f);
        expect_err("memfd_secret", libc::SYS_memfd_secret, &[0], EPERM, f);
        expect_err("fsopen", libc::SYS_fsopen, &[bad, 0], EPERM, f);
        expect_err("open_tree", libc::SYS_open_tree, &[-1, bad, 0], EPERM, f);
        expect_err("init_module", libc::SYS_init_module, &[0, 0, 0], EPERM, f);
        expect_err("set_mempolicy", libc::SYS_set_mempolicy, &[0, 0, 0], EPERM, f);
        expect_err("name_to_handle_at", libc::SYS_name_to_handle_at, &[-1, bad, bad, bad, 0], EPERM, f);

        // personality: queries and Docker's values pass, others do not.
        if sys(libc::SYS_personality, &[0xffff_ffff]) < 0 {
            f.push(format!("personality(query): errno {}", errno()));
        }
        let pers = libc::ADDR_NO_RANDOMIZE as L;
        expect_err("personality(ADDR_NO_RANDOMIZE)", libc::SYS_personality, &[pers], EPERM, f);

        // socket: AF_UNIX allowed, AF_VSOCK refused.
        let fd = sys(libc::SYS_socket, &[libc::AF_UNIX as L, libc::SOCK_STREAM as L, 0]);
        if fd < 0 {
            f.push(format!("socket(AF_UNIX): errno {}", errno()));
        } else {
            sys(libc::SYS_close, &[fd]);
        }
        let vsock = [libc::AF_VSOCK as L, libc::SOCK_STREAM as L, 0];
        expect_err("socket(AF_VSOCK)", libc::SYS_socket, &vsock, EPERM, f);

        // ioctl: TIOCSTI refused; ordinary requests reach the kernel, which
        // answers ENOTTY on a non-terminal.
        let fd = sys(libc::SYS_memfd_create, &[c"policy-test".as_ptr() as L, 0]);
        if fd < 0 {
            f.push(format!("memfd_create: errno {}", errno()));
        } else {
            let c = 0u8;
            let sti = [fd, libc::TIOCSTI as L, &c as *const u8 as L];
            expect_err("ioctl(TIOCSTI)", libc::SYS_ioctl, &sti, EPERM, f);
            let mut ws = libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
            let gwinsz = [fd, libc::TIOCGWINSZ as L, &mut ws as *mut libc::winsize as L];
            expect_err("ioctl(TIOCGWINSZ)", libc::SYS_ioctl, &gwinsz, libc::ENOTTY, f);
            sys(libc::SYS_close, &[fd]);
        }

        // glibc's fork() uses clone without namespace flags.
        // SAFETY: the child only calls _exit.
        let child = unsafe { libc::fork() };
        if child == 0 {
            // SAFETY: _exit is always safe to call.
            unsafe { libc::_exit(7) };
        }
        if child < 0 {
            f.push(format!("fork: errno {}", errno()));
        } else {
            let mut status = 0;
            // SAFETY: waits for our own child, writing into a local.
            let r = unsafe { libc::waitpid(child, &mut status, 0) };
            if r != child || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 7 {
                f.push(format!("fork child: waitpid={r} status={status:#x}"));
            }
        }

        // pthread_create tries clone3, gets ENOSYS and falls back to clone.
        match std::thread::Builder::new().spawn(|| 42) {
            Ok(h) => {
                if h.join().ok() != Some(42) {
                    f.push("thread did not return 42".to_owned());
                }
            }
            Err(e) => f.push(format!("thread spawn: {e}")),
        }
        // std::process::Command (posix_spawn: clone3 → ENOSYS → clone(CLONE_VM|CLONE_VFORK)).
        match std::process::Command::new("/bin/true").status() {
            Ok(s) if s.success() => {}
            other => f.push(format!("spawn /bin/true: {other:?}")),
        }

        assert!(f.is_empty(), "policy violations:\n{}", f.join("\n"));
        println!("policy enforcement checks done");
    }
}
