//! The REPL's notify filter against a real family (docs/architecture.md#processes-and-namespaces): a
//! supervisor vets, with `ProcFamilyView` on a procfs of the family's pid
//! namespace, every call a REPL could use to reach another member's
//! processes, and the REPL tries each of them.
//!
//! Layout (no user namespace: the test's processes are host root, which
//! only makes the kernel more permissive than a real family's):
//!
//! ```text
//! test ── S supervisor (private mount ns; mounts the family procfs; serves the listener)
//!         └─ R reaper, pid 1 of the family pid ns P_F (S's mount ns: no member)
//!            ├─ B  member M2 (own mount ns), in A's process group
//!            └─ A  the "REPL", member M1 (own mount ns), group leader
//!               ├─ I1  M1's init: pid 1 of a leaf pid ns
//!               └─ A2, A3, A4  other M1 processes (A2, A3 in A's group)
//! ```
//!
//! A reports one line per check to the test through a pipe ("ok NAME" or
//! "FAIL NAME: ..."); S adds its own and "END". Everything is bounded by
//! deadlines, so a bug fails the test rather than hanging it.

use std::fs;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use forkbox_jail::channel;
use forkbox_jail::notify::{self, Listener, ProcFamilyView};
use forkbox_jail::sys::{self, Forked};
use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// The whole test.
const TEST_DEADLINE: Duration = Duration::from_secs(60);
/// The supervisor's serving loop.
const SERVE_DEADLINE: Duration = Duration::from_secs(30);
/// One step (a process starting, one dying).
const STEP: Duration = Duration::from_secs(10);

/// What A and S must report as passed.
const CHECKS: &[&str] = &[
    "getpid-and-write-unaffected",
    "kill-other-member-is-esrch",
    "probe-other-member-is-esrch",
    "probe-family-init-is-esrch",
    "tgkill-other-member-is-esrch",
    "rt-sigqueueinfo-other-member-is-esrch",
    "kill-own-member",
    "probe-own-member",
    "kill-self-delivered-on-return",
    "tgkill-self",
    "kill-own-group-stays-in-member",
    "kill-missing-group-is-esrch",
    "kill-all-spares-self-and-init",
    "setown-self",
    "setown-other-member-is-esrch",
    "setown-straddling-group-is-eperm",
    "setown-ex-is-eperm",
    "getfl-unaffected",
    "fiosetown-is-eperm",
    "siocspgrp-is-eperm",
    "setpriority-user-is-eperm",
    "setpriority-self",
    "setpriority-other-member-is-esrch",
    "ioprio-user-is-eperm",
    "prlimit-other-member-is-esrch",
    "prlimit-own-pid",
    "sched-setaffinity-other-member-is-esrch",
    "a-done",
    "supervisor-answered",
    "other-member-survived",
    "family-init-survived",
];

#[test]
fn a_repl_reaches_only_its_own_member() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test needs root");
    let dir = tempfile::tempdir().expect("temp dir");
    let proc_dir = dir.path().join("proc");
    fs::create_dir(&proc_dir).expect("mount point");
    let (report_r, report_w) = nix::unistd::pipe().expect("pipe");

    // SAFETY: this binary has one test; the harness's other thread only waits
    // for it, and the child leaves with _exit.
    match unsafe { nix::unistd::fork() }.expect("fork") {
        nix::unistd::ForkResult::Child => {
            drop(report_r);
            let w = report_w.as_raw_fd();
            let code = match std::panic::catch_unwind(|| supervisor(&proc_dir, w)) {
                Ok(Ok(())) => 0,
                Ok(Err(e)) => {
                    say(w, &format!("FAIL supervisor: {e}"));
                    1
                }
                Err(_) => {
                    say(w, "FAIL supervisor: panicked");
                    1
                }
            };
            say(w, "END");
            // SAFETY: leaving the forked child without running the harness's code.
            unsafe { libc::_exit(code) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(report_w);
            let (text, timed_out) = read_all(report_r.as_fd(), TEST_DEADLINE);
            if timed_out {
                let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
            }
            let status = waitpid(child, None).expect("wait for supervisor");
            let lines: Vec<&str> = text.lines().collect();
            let failed: Vec<&&str> = lines.iter().filter(|l| !l.starts_with("ok ") && **l != "END").collect();
            assert!(!timed_out, "timed out; report so far:\n{text}");
            assert!(failed.is_empty(), "failures: {failed:#?}\nfull report:\n{text}");
            for name in CHECKS {
                assert!(lines.iter().any(|l| l.strip_prefix("ok ") == Some(name)), "check {name} missing:\n{text}");
            }
            assert_eq!(lines.last(), Some(&"END"), "{text}");
            assert_eq!(status, WaitStatus::Exited(child, 0), "{text}");
        }
    }
}

// ---------------------------------------------------------------------------
// The supervisor
// ---------------------------------------------------------------------------

fn supervisor(proc_dir: &Path, report: RawFd) -> Result<(), String> {
    use nix::mount::{mount, umount2, MntFlags, MsFlags};
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).map_err(|e| format!("unshare mount ns: {e}"))?;
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>).map_err(|e| format!("make / private: {e}"))?;
    let (ctl_s, ctl_a) = channel::pair().map_err(|e| e.to_string())?;
    let (info_r, info_w) = nix::unistd::pipe().map_err(|e| e.to_string())?;

    // SAFETY: this process is single-threaded (a fork of the test).
    let reaper_pid = match unsafe { sys::fork_with(libc::CLONE_NEWPID) }.map_err(|e| format!("clone family: {e}"))? {
        Forked::Child => {
            drop(ctl_s);
            drop(info_r);
            reaper(ctl_a, info_w, report)
        }
        Forked::Parent(pid) => pid,
    };
    drop(ctl_a);
    drop(info_w);
    let result = serve(proc_dir, reaper_pid, &ctl_s, &info_r, report);
    let _ = nix::sys::signal::kill(reaper_pid, Signal::SIGKILL);
    let _ = waitpid(reaper_pid, None);
    let _ = umount2(proc_dir, MntFlags::MNT_DETACH);
    result
}

fn serve(proc_dir: &Path, reaper: Pid, ctl: &OwnedFd, info: &OwnedFd, report: RawFd) -> Result<(), String> {
    let pidns = fs::File::open(format!("/proc/{reaper}/ns/pid")).map_err(|e| format!("open family pid ns: {e}"))?;
    notify::mount_family_proc(pidns.as_fd(), proc_dir).map_err(|e| format!("mount family proc: {e}"))?;
    let view = ProcFamilyView::for_reaper(proc_dir, reaper.as_raw()).map_err(|e| format!("family view: {e}"))?;

    // The family pids of B and A, from the reaper.
    if !readable(info.as_fd(), STEP) {
        return Err("no word from the reaper".into());
    }
    let mut buf = [0u8; 64];
    let n = nix::unistd::read(info, &mut buf).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&buf[..n]).to_string();
    let b: i32 = text.split_whitespace().next().and_then(|s| s.parse().ok()).ok_or(format!("bad info {text:?}"))?;

    // The listener, from A.
    if !readable(ctl.as_fd(), STEP) {
        return Err("no listener from A".into());
    }
    let got = channel::recv::<String>(ctl.as_fd()).map_err(|e| e.to_string())?.ok_or("A closed the channel")?;
    let fd = got.fds.into_iter().next().ok_or("no listener fd attached")?;
    let listener = Listener::new(fd).map_err(|e| format!("listener: {e}"))?;

    // Serve until nobody uses the filter any more (A has exited and been reaped).
    let start = Instant::now();
    let mut answered = 0;
    loop {
        if start.elapsed() > SERVE_DEADLINE {
            return Err(format!("A did not finish within {SERVE_DEADLINE:?} ({answered} calls answered)"));
        }
        let mut pfd = libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, 200) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(format!("poll listener: {e}"));
        }
        if pfd.revents & libc::POLLIN != 0 {
            match listener.serve_one(&view) {
                Ok(Some(_)) => answered += 1,
                Ok(None) => {}
                Err(e) => return Err(format!("serve: {e}")),
            }
        } else if pfd.revents & (libc::POLLHUP | libc::POLLERR) != 0 {
            break;
        }
    }
    say(report, "ok supervisor-answered");
    if answered < 20 {
        say(report, &format!("FAIL supervisor-answered only {answered} calls"));
    }
    check(report, "other-member-survived", alive(proc_dir, b), format!("B ({b}) is gone"));
    check(report, "family-init-survived", alive(proc_dir, 1), "the reaper is gone");
    Ok(())
}

/// Whether family pid `pid` is a live (not zombie) process.
fn alive(proc_dir: &Path, pid: i32) -> bool {
    match fs::read_to_string(proc_dir.join(pid.to_string()).join("stat")) {
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

// ---------------------------------------------------------------------------
// The family
// ---------------------------------------------------------------------------

fn reaper(ctl_a: OwnedFd, info: OwnedFd, report: RawFd) -> ! {
    let _ = sys::set_parent_death_signal(Signal::SIGKILL);
    // SAFETY: single-threaded.
    let b = match unsafe { sys::fork_with(0) } {
        Ok(Forked::Child) => member_b(),
        Ok(Forked::Parent(p)) => p,
        Err(e) => fatal(report, &format!("fork B: {e}")),
    };
    let (go_r, go_w) = nix::unistd::pipe().unwrap_or_else(|e| fatal(report, &format!("pipe: {e}")));
    // SAFETY: single-threaded.
    let a = match unsafe { sys::fork_with(0) } {
        Ok(Forked::Child) => {
            drop(go_w);
            drop(info);
            let code = repl_a(b.as_raw(), &ctl_a, &go_r, report);
            // SAFETY: leaving the forked child.
            unsafe { libc::_exit(code) }
        }
        Ok(Forked::Parent(p)) => p,
        Err(e) => fatal(report, &format!("fork A: {e}")),
    };
    drop(go_r);
    // A leads its own group, which B joins (the reaper is B's parent, so
    // it may move it): a group that straddles two members.
    let _ = nix::unistd::setpgid(a, a);
    if let Err(e) = nix::unistd::setpgid(b, a) {
        say(report, &format!("FAIL setpgid B: {e}"));
    }
    let _ = nix::unistd::write(&info, format!("{b} {a}\n").as_bytes());
    let _ = nix::unistd::write(&go_w, b"g");
    loop {
        match waitpid(Pid::from_raw(-1), None) {
            Ok(status) if status.pid() == Some(b) => say(report, &format!("FAIL B ended: {status:?}")),
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

fn member_b() -> ! {
    let _ = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS);
    loop {
        // SAFETY: pause has no preconditions.
        unsafe { libc::pause() };
    }
}

fn idle() -> ! {
    loop {
        // SAFETY: pause has no preconditions.
        unsafe { libc::pause() };
    }
}

fn fatal(report: RawFd, msg: &str) -> ! {
    say(report, &format!("FAIL {msg}"));
    // SAFETY: leaving a forked child.
    unsafe { libc::_exit(1) }
}

// ---------------------------------------------------------------------------
// A, the REPL
// ---------------------------------------------------------------------------

static USR1: AtomicUsize = AtomicUsize::new(0);
static USR2: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_usr1(_: libc::c_int) {
    USR1.fetch_add(1, Ordering::SeqCst);
}
extern "C" fn on_usr2(_: libc::c_int) {
    USR2.fetch_add(1, Ordering::SeqCst);
}

/// A raw system call with up to four arguments: its value, or its errno.
/// The tests pass only integers and pointers to live locals.
fn call(nr: libc::c_long, args: &[libc::c_long]) -> Result<libc::c_long, i32> {
    let mut a = [0 as libc::c_long; 4];
    a[..args.len()].copy_from_slice(args);
    // SAFETY: every argument is an integer or a pointer to a local of the
    // caller that outlives the call, of the type the call expects.
    let r = unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3]) };
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(r)
    }
}

fn ptr<T>(v: &T) -> libc::c_long {
    v as *const T as libc::c_long
}

/// A child of A that waits for signals; `own_group`: in a process group of
/// its own rather than A's.
fn spawn_idle(report: RawFd, flags: libc::c_int, own_group: bool, what: &str) -> i32 {
    // SAFETY: A is single-threaded.
    match unsafe { sys::fork_with(flags) } {
        Ok(Forked::Child) => {
            if own_group {
                let _ = nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0));
            }
            idle()
        }
        Ok(Forked::Parent(p)) => p.as_raw(),
        Err(e) => fatal(report, &format!("fork {what}: {e}")),
    }
}

/// How child `pid` ended, waiting at most `within`; `None` if still running.
fn ended(pid: i32, within: Duration) -> Option<WaitStatus> {
    let start = Instant::now();
    loop {
        match waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) if start.elapsed() < within => std::thread::sleep(Duration::from_millis(10)),
            Ok(WaitStatus::StillAlive) => return None,
            Ok(s) => return Some(s),
            Err(_) => return None,
        }
    }
}

fn repl_a(b: i32, ctl: &OwnedFd, go: &OwnedFd, report: RawFd) -> i32 {
    let _ = nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0));
    if let Err(e) = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS) {
        fatal(report, &format!("A: unshare mount ns: {e}"));
    }
    let i1 = spawn_idle(report, libc::CLONE_NEWPID, false, "I1");
    let a2 = spawn_idle(report, 0, false, "A2");
    let a3 = spawn_idle(report, 0, false, "A3");
    let a4 = spawn_idle(report, 0, true, "A4");
    if !readable(go.as_fd(), STEP) {
        fatal(report, "A: no go from the reaper");
    }
    for (sig, handler) in [(Signal::SIGUSR1, on_usr1 as extern "C" fn(libc::c_int)), (Signal::SIGUSR2, on_usr2)] {
        let act = SigAction::new(SigHandler::Handler(handler), SaFlags::empty(), SigSet::empty());
        // SAFETY: the handlers only touch atomics.
        if let Err(e) = unsafe { sigaction(sig, &act) } {
            fatal(report, &format!("A: sigaction: {e}"));
        }
    }
    if let Err(e) = sys::set_no_new_privs() {
        fatal(report, &format!("A: no_new_privs: {e}"));
    }
    let listener = notify::install_with_listener(&notify::repl_filter()).unwrap_or_else(|e| fatal(report, &format!("A: install filter: {e}")));
    if let Err(e) = channel::send(ctl.as_fd(), &"listener".to_string(), &[listener.as_raw_fd()]) {
        fatal(report, &format!("A: send listener: {e}"));
    }
    drop(listener);

    // From here on, every vetted call waits for the supervisor.
    type L = libc::c_long;
    let me = call(libc::SYS_getpid, &[]).unwrap_or(0) as i32;
    let tid = call(libc::SYS_gettid, &[]).unwrap_or(0) as i32;
    let k = |pid: i32, sig: i32| call(libc::SYS_kill, &[pid as L, sig as L]);

    let devnull = fs::OpenOptions::new().write(true).open("/dev/null");
    let wrote = devnull.as_ref().map_err(|_| -1).and_then(|f| call(libc::SYS_write, &[f.as_raw_fd() as L, ptr(&0u8), 1]));
    check(report, "getpid-and-write-unaffected", me > 1 && tid == me && wrote == Ok(1), format!("{me} {tid} {wrote:?}"));

    // Another member is out of reach, and looks nonexistent.
    let r = k(b, libc::SIGKILL);
    check(report, "kill-other-member-is-esrch", r == Err(libc::ESRCH), format!("{r:?}"));
    let r = k(b, 0);
    check(report, "probe-other-member-is-esrch", r == Err(libc::ESRCH), format!("{r:?}"));
    let r = k(1, 0);
    check(report, "probe-family-init-is-esrch", r == Err(libc::ESRCH), format!("{r:?}"));
    let r = call(libc::SYS_tgkill, &[b as L, b as L, libc::SIGKILL as L]);
    check(report, "tgkill-other-member-is-esrch", r == Err(libc::ESRCH), format!("{r:?}"));
    // SAFETY: siginfo_t is plain data; all zeroes is a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    info.si_signo = libc::SIGUSR1;
    info.si_code = -1; // SI_QUEUE
    let r = call(libc::SYS_rt_sigqueueinfo, &[b as L, libc::SIGUSR1 as L, ptr(&info)]);
    check(report, "rt-sigqueueinfo-other-member-is-esrch", r == Err(libc::ESRCH), format!("{r:?}"));

    // Its own member is in reach.
    let r = k(a2, libc::SIGTERM);
    let end = ended(a2, STEP);
    check(report, "kill-own-member", r == Ok(0) && end == Some(WaitStatus::Signaled(Pid::from_raw(a2), Signal::SIGTERM, false)), format!("{r:?} {end:?}"));
    let r = k(a3, 0);
    check(report, "probe-own-member", r == Ok(0), format!("{r:?}"));

    // A signal to itself arrives as the call returns, as with the kernel's kill.
    let before = USR1.load(Ordering::SeqCst);
    let r = k(me, libc::SIGUSR1);
    let after = USR1.load(Ordering::SeqCst);
    check(report, "kill-self-delivered-on-return", r == Ok(0) && after == before + 1, format!("{r:?} {before}->{after}"));
    let before = USR2.load(Ordering::SeqCst);
    let r = call(libc::SYS_tgkill, &[me as L, tid as L, libc::SIGUSR2 as L]);
    let after = USR2.load(Ordering::SeqCst);
    check(report, "tgkill-self", r == Ok(0) && after == before + 1, format!("{r:?} {before}->{after}"));

    // kill(0): its group holds A, A3, I1 (M1) and B (M2): B must survive
    // (SIGUSR1 would end it; the supervisor checks), A3 must not; A4, in
    // another group, is not touched.
    let before = USR1.load(Ordering::SeqCst);
    let r = k(0, libc::SIGUSR1);
    let after = USR1.load(Ordering::SeqCst);
    let end = ended(a3, STEP);
    let a4_now = ended(a4, Duration::ZERO);
    check(
        report,
        "kill-own-group-stays-in-member",
        r == Ok(0) && after == before + 1 && end == Some(WaitStatus::Signaled(Pid::from_raw(a3), Signal::SIGUSR1, false)) && a4_now.is_none(),
        format!("{r:?} {before}->{after} A3 {end:?} A4 {a4_now:?}"),
    );
    let r = k(-99_999, 0);
    check(report, "kill-missing-group-is-esrch", r == Err(libc::ESRCH), format!("{r:?}"));

    // SIGIO ownership.
    let (s1, _s2) = std::os::unix::net::UnixStream::pair().unwrap_or_else(|e| fatal(report, &format!("A: socketpair: {e}")));
    let fd = s1.as_raw_fd();
    let f = |cmd: libc::c_int, arg: L| call(libc::SYS_fcntl, &[fd as L, cmd as L, arg]);
    let r = f(libc::F_SETOWN, me as L);
    check(report, "setown-self", r == Ok(0), format!("{r:?}"));
    let r = f(libc::F_SETOWN, b as L);
    check(report, "setown-other-member-is-esrch", r == Err(libc::ESRCH), format!("{r:?}"));
    let r = f(libc::F_SETOWN, -(me as L));
    check(report, "setown-straddling-group-is-eperm", r == Err(libc::EPERM), format!("{r:?}"));
    let owner: [libc::c_int; 2] = [1 /* F_OWNER_PID */, me]; // struct f_owner_ex
    let r = f(15 /* F_SETOWN_EX */, ptr(&owner));
    check(report, "setown-ex-is-eperm", r == Err(libc::EPERM), format!("{r:?}"));
    let r = f(libc::F_GETFL, 0);
    check(report, "getfl-unaffected", r.is_ok(), format!("{r:?}"));
    let pid_arg: libc::c_int = me;
    let r = call(libc::SYS_ioctl, &[fd as L, 0x8901, ptr(&pid_arg)]);
    check(report, "fiosetown-is-eperm", r == Err(libc::EPERM), format!("{r:?}"));
    let r = call(libc::SYS_ioctl, &[fd as L, 0x8902, ptr(&pid_arg)]);
    check(report, "siocspgrp-is-eperm", r == Err(libc::EPERM), format!("{r:?}"));

    // Priorities, limits, affinity.
    let r = call(libc::SYS_setpriority, &[2 /* PRIO_USER */, 0, 5]);
    check(report, "setpriority-user-is-eperm", r == Err(libc::EPERM), format!("{r:?}"));
    let r = call(libc::SYS_setpriority, &[0 /* PRIO_PROCESS */, 0, 1]);
    check(report, "setpriority-self", r == Ok(0), format!("{r:?}"));
    let r = call(libc::SYS_setpriority, &[0, b as L, 5]);
    check(report, "setpriority-other-member-is-esrch", r == Err(libc::ESRCH), format!("{r:?}"));
    let r = call(libc::SYS_ioprio_set, &[3 /* IOPRIO_WHO_USER */, 0, (2 << 13) | 4]);
    check(report, "ioprio-user-is-eperm", r == Err(libc::EPERM), format!("{r:?}"));
    let mut old = libc::rlimit64 { rlim_cur: 0, rlim_max: 0 };
    let nofile = libc::RLIMIT_NOFILE as L;
    let r = call(libc::SYS_prlimit64, &[b as L, nofile, 0, &mut old as *mut libc::rlimit64 as L]);
    check(report, "prlimit-other-member-is-esrch", r == Err(libc::ESRCH), format!("{r:?}"));
    let r = call(libc::SYS_prlimit64, &[me as L, nofile, 0, &mut old as *mut libc::rlimit64 as L]);
    check(report, "prlimit-own-pid", r == Ok(0) && old.rlim_cur > 0, format!("{r:?}"));
    let mut mask = [0u64; 16];
    let size = std::mem::size_of_val(&mask);
    let got = call(libc::SYS_sched_getaffinity, &[0, size as L, mask.as_mut_ptr() as L]);
    let r = call(libc::SYS_sched_setaffinity, &[b as L, size as L, ptr(&mask)]);
    check(report, "sched-setaffinity-other-member-is-esrch", got.is_ok() && r == Err(libc::ESRCH), format!("get {got:?} set {r:?}"));

    // kill(-1): A4 dies; A, its member's init I1, B and the reaper do not.
    let r = k(-1, libc::SIGKILL);
    let end = ended(a4, STEP);
    std::thread::sleep(Duration::from_millis(100));
    let init = ended(i1, Duration::ZERO);
    check(
        report,
        "kill-all-spares-self-and-init",
        r == Ok(0) && end == Some(WaitStatus::Signaled(Pid::from_raw(a4), Signal::SIGKILL, false)) && init.is_none(),
        format!("{r:?} A4 {end:?} I1 {init:?}"),
    );

    say(report, "ok a-done");
    0
}

// ---------------------------------------------------------------------------
// Plumbing
// ---------------------------------------------------------------------------

/// Write one line to the report (one write: lines from several processes
/// do not interleave).
fn say(fd: RawFd, line: &str) {
    let text = format!("{line}\n");
    // SAFETY: write from a live buffer.
    unsafe { libc::write(fd, text.as_ptr().cast(), text.len()) };
}

fn check(fd: RawFd, name: &str, ok: bool, detail: impl std::fmt::Display) {
    if ok {
        say(fd, &format!("ok {name}"));
    } else {
        say(fd, &format!("FAIL {name}: {detail}"));
    }
}

/// Whether `fd` becomes readable (or hung up) within `within`.
fn readable(fd: BorrowedFd<'_>, within: Duration) -> bool {
    let start = Instant::now();
    loop {
        let left = within.saturating_sub(start.elapsed());
        let mut pfd = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, left.as_millis() as libc::c_int) };
        if r > 0 {
            return true;
        }
        if r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return false;
        }
    }
}

/// Everything readable from `fd` until end of file, or until `within` has
/// passed (then `true`).
fn read_all(fd: BorrowedFd<'_>, within: Duration) -> (String, bool) {
    let start = Instant::now();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if !readable(fd, within.saturating_sub(start.elapsed())) {
            return (String::from_utf8_lossy(&out).into_owned(), true);
        }
        match nix::unistd::read(fd, &mut buf) {
            Ok(0) => return (String::from_utf8_lossy(&out).into_owned(), false),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return (String::from_utf8_lossy(&out).into_owned(), false),
        }
    }
}
