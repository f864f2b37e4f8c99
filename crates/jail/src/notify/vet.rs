//! The decision: whether and how a notified call may reach its target, by
//! the caller's member.

use std::io;

use super::listener::{Notification, Verdict};
use super::{F_SETOWN, F_SETOWN_EX, IOPRIO_WHO_PROCESS, PID_FIRST, PRIO_PROCESS};

/// Largest signal number (`_NSIG`).
const MAX_SIGNAL: i32 = 64;
/// The family pid namespace's own init, the reaper: in no member, and never
/// signalled by the shim (see [`vet`]).
const FAMILY_INIT: i32 = 1;

/// The process making a vetted call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    /// Its member: the inode of its mount namespace.
    pub member: u64,
    /// Its thread-group id in the family pid namespace.
    pub tgid: i32,
    /// Its process group, in the family pid namespace.
    pub pgid: i32,
    /// Its own pid namespace is below the family's (a member's leaf
    /// namespace or deeper): the pids it names are resolved there and can
    /// only reach processes of that namespace, so its calls are let through.
    pub in_leaf: bool,
}

/// A process (thread-group leader) of the family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FamilyProcess {
    /// Its pid in the family pid namespace.
    pub pid: i32,
    pub member: u64,
    pub pgid: i32,
    /// It is a member's init: pid 1 of its leaf pid namespace.
    pub is_init: bool,
}

/// What vetting needs to know about the family's processes. Pids are in the
/// family pid namespace P_F unless named host.
pub trait FamilyView {
    /// The member (its mount-namespace inode) and family pid of the calling
    /// process, from its host pid (a thread id).
    fn caller(&self, host_pid: i32) -> Option<Caller>;
    /// Member of a process or thread id.
    fn member_of(&self, pid: i32) -> Option<u64>;
    /// Every process (thread-group leader) of the family with its member,
    /// pgid and whether it is a member's init (pid 1 of its leaf pid ns).
    fn processes(&self) -> Vec<FamilyProcess>;
    /// Send `sig` to process `pid`, race-free (the implementation re-checks
    /// membership on an open handle). `ESRCH` if `pid` is not in `member`.
    fn signal(&self, pid: i32, member: u64, sig: i32) -> io::Result<()>;
}

/// An argument that the kernel reads as a C `int`: its low 32 bits,
/// sign-extended.
pub(super) fn int(arg: u64) -> i32 {
    arg as u32 as i32
}

fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EPERM)
}

/// Decide a notified call. Looks the caller up with `view.caller(n.pid)`;
/// see [`vet_caller`] for the rules.
pub fn vet(n: &Notification, view: &dyn FamilyView) -> Verdict {
    vet_caller(n, view.caller(n.pid).as_ref(), view)
}

/// Decide a notified call of `caller` (`None`: not a process of the family,
/// or gone; everything fails with `EPERM`). A target "in the member" is a
/// process or thread whose mount namespace is the caller's; one that is not
/// must look nonexistent (`ESRCH`), as a pid guessed in another member would
/// be. Arguments are read as the kernel reads them (a C `int`: the low 32
/// bits, sign-extended).
///
/// * `kill(pid > 0, sig)`: in the member, the shim signals it itself
///   (`view.signal`) and the call returns 0 or that signal's errno; else
///   `ESRCH`. `sig` must be 0..=64 (`EINVAL`); 0 probes the same way.
/// * `kill(0, sig)`, `kill(-pgid, sig)`: the shim signals every process of
///   the caller's (or that) process group that is in the member, the caller
///   included; `kill(-1, sig)`: every process of the member except the
///   caller's own thread group and the member's init. None: `ESRCH`; else 0
///   if one signal went through, or the last errno.
/// * `tkill(tid)`, `tgkill(tgid, tid)`, `rt_sigqueueinfo(pid)`,
///   `rt_tgsigqueueinfo(tgid, tid)`: `Continue` if the target is in the
///   member, else `ESRCH`; a nonpositive target gets the kernel's own answer.
/// * `fcntl(F_SETOWN, 0)`: `Continue`; `F_SETOWN, pid > 0`: `Continue` if in
///   the member, else `ESRCH`; `F_SETOWN, -pgid`: `Continue` if the group is
///   all in the member, `ESRCH` if none of it is (or it is empty), `EPERM`
///   if it straddles members. `F_SETOWN_EX`: `EPERM` (rare, and its target
///   lives in the caller's memory, which the caller can change after we
///   read it).
/// * `setpriority`, `ioprio_set`: process scope with a target in the member
///   (or 0): `Continue`; another target: `ESRCH`; user or process-group
///   scope: `EPERM`.
/// * `prlimit64`, `sched_set*`, `migrate_pages`, `move_pages`: a pid in the
///   member (or 0): `Continue`; else `ESRCH` (a negative pid gets the
///   kernel's own answer).
/// * `ioctl` (only hand-over requests are notified; [`Listener::serve_one`](super::Listener::serve_one)
///   leaves those of family processes to the shim): `EPERM`.
/// * anything else (not notified by [`repl_filter`](super::repl_filter)): `Continue`.
///
/// Why `kill` is emulated rather than let through: `Continue` makes the
/// kernel resolve the pid again, so a target that exits in between and
/// whose pid is reused would be hit instead. For the thread-directed calls
/// the same window is accepted: pids of P_F are handed out in increasing
/// order and reused only after they wrap around at `pid_max` (32768 by
/// default, 4194304 where systemd raises it), so hitting the window takes
/// the family a whole wrap of forks while the shim decides one call, and
/// the target must be the caller's own and have exited; `F_SETOWN` pins
/// the target's `struct pid` once it returns.
///
/// Emulation differs from the kernel's `kill` in what the receiver's
/// `siginfo` says: the signal comes from the shim, outside the family, so
/// `si_pid` is 0 and `si_uid` the overflow uid. The family's init (pid 1)
/// is never signalled: the kernel does not let a REPL kill it (it is its
/// pid namespace's init), but it would let the shim, an ancestor namespace.
/// A signal to the caller itself stays pending until the reply, thanks to
/// `SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV` (see [`install_with_listener`](super::install_with_listener)),
/// and is delivered as the call returns, as with the kernel's `kill`.
pub fn vet_caller(n: &Notification, caller: Option<&Caller>, view: &dyn FamilyView) -> Verdict {
    let Some(caller) = caller else {
        return Verdict::Errno(libc::EPERM);
    };
    if caller.in_leaf {
        return Verdict::Continue;
    }
    let arg = |i: usize| int(n.args[i]);
    match n.nr {
        libc::SYS_kill => kill(caller, arg(0), arg(1), view),
        libc::SYS_tkill => directed(caller, arg(0), 1, libc::EINVAL, view),
        libc::SYS_tgkill => directed(caller, arg(1), arg(0), libc::EINVAL, view),
        libc::SYS_rt_sigqueueinfo => directed(caller, arg(0), 1, libc::ESRCH, view),
        libc::SYS_rt_tgsigqueueinfo => directed(caller, arg(1), arg(0), libc::EINVAL, view),
        libc::SYS_fcntl => match arg(1) {
            F_SETOWN => set_owner(caller, arg(2), view),
            F_SETOWN_EX => Verdict::Errno(libc::EPERM),
            _ => Verdict::Continue,
        },
        libc::SYS_setpriority => scoped(caller, arg(0), arg(1), PRIO_PROCESS, view),
        // A hand-over step the shim did not take up (see `serve_one`).
        libc::SYS_ioctl => Verdict::Errno(libc::EPERM),
        libc::SYS_ioprio_set => scoped(caller, arg(0), arg(1), IOPRIO_WHO_PROCESS, view),
        nr if PID_FIRST.contains(&nr) => {
            let pid = arg(0);
            if pid < 0 {
                // The kernel finds no process for a negative pid: the
                // sched_set* calls reject it, the others do not find it.
                let einval = [libc::SYS_sched_setscheduler, libc::SYS_sched_setparam, libc::SYS_sched_setattr];
                return Verdict::Errno(if einval.contains(&nr) { libc::EINVAL } else { libc::ESRCH });
            }
            in_member_or(caller, pid, libc::ESRCH, view)
        }
        _ => Verdict::Continue,
    }
}

/// `Continue` if `pid` is 0 (the caller) or in the caller's member, else `errno`.
fn in_member_or(caller: &Caller, pid: i32, errno: i32, view: &dyn FamilyView) -> Verdict {
    if pid == 0 || view.member_of(pid) == Some(caller.member) {
        Verdict::Continue
    } else {
        Verdict::Errno(errno)
    }
}

/// A signal to one thread (`tid`) or process; `other` is a second id the
/// kernel insists be positive (tgid) or 1 when there is none.
fn directed(caller: &Caller, target: i32, other: i32, nonpositive: i32, view: &dyn FamilyView) -> Verdict {
    if target <= 0 || other <= 0 {
        return Verdict::Errno(nonpositive);
    }
    in_member_or(caller, target, libc::ESRCH, view)
}

fn kill(caller: &Caller, pid: i32, sig: i32, view: &dyn FamilyView) -> Verdict {
    if !(0..=MAX_SIGNAL).contains(&sig) {
        return Verdict::Errno(libc::EINVAL);
    }
    if pid > 0 {
        if pid == FAMILY_INIT || view.member_of(pid) != Some(caller.member) {
            return Verdict::Errno(libc::ESRCH);
        }
        return match view.signal(pid, caller.member, sig) {
            Ok(()) => Verdict::Return(0),
            Err(e) => Verdict::Errno(errno_of(&e)),
        };
    }
    if pid == i32::MIN {
        // -pid would overflow; the kernel answers ESRCH too.
        return Verdict::Errno(libc::ESRCH);
    }
    let targets = view.processes().into_iter().filter(|p| {
        p.member == caller.member
            && p.pid != FAMILY_INIT
            && match pid {
                0 => p.pgid == caller.pgid,
                -1 => p.pid != caller.tgid && !p.is_init,
                _ => p.pgid == -pid,
            }
    });
    let (mut found, mut delivered, mut last) = (false, false, libc::ESRCH);
    for p in targets {
        found = true;
        match view.signal(p.pid, caller.member, sig) {
            Ok(()) => delivered = true,
            Err(e) => last = errno_of(&e),
        }
    }
    match (found, delivered) {
        (_, true) => Verdict::Return(0),
        (true, false) => Verdict::Errno(last),
        (false, _) => Verdict::Errno(libc::ESRCH),
    }
}

fn set_owner(caller: &Caller, owner: i32, view: &dyn FamilyView) -> Verdict {
    match owner {
        0 => Verdict::Continue,
        pid if pid > 0 => in_member_or(caller, pid, libc::ESRCH, view),
        i32::MIN => Verdict::Errno(libc::EINVAL),
        negative => {
            let pgid = -negative;
            let (mut ours, mut theirs) = (0, 0);
            for p in view.processes().into_iter().filter(|p| p.pgid == pgid) {
                if p.member == caller.member {
                    ours += 1;
                } else {
                    theirs += 1;
                }
            }
            match (ours, theirs) {
                (0, _) => Verdict::Errno(libc::ESRCH),
                (_, 0) => Verdict::Continue,
                _ => Verdict::Errno(libc::EPERM),
            }
        }
    }
}

/// `setpriority`/`ioprio_set(which, who)`: only the process scope may pass.
fn scoped(caller: &Caller, which: i32, who: i32, process: i32, view: &dyn FamilyView) -> Verdict {
    if which != process {
        return Verdict::Errno(libc::EPERM);
    }
    if who < 0 {
        return Verdict::Errno(libc::ESRCH);
    }
    in_member_or(caller, who, libc::ESRCH, view)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::HashMap;

    // --- vet, against a fake family ------------------------------------------

    fn neg(v: i32) -> u64 {
        v as i64 as u64
    }

    const M1: u64 = 4_026_531_001;
    const M2: u64 = 4_026_531_002;
    const SHIM_NS: u64 = 4_026_531_840;

    /// A family: the reaper (1, in the shim's namespace); member M1 with the
    /// caller REPL 10 (host pid 1010, group 10), its forked sibling 11 (M2,
    /// same group), 12 (M1, group 10), 13 (M1, group 13), M1's init 20 and
    /// a process 21 in M1's leaf; member M2 with 30 (group 10) and its init
    /// 40 (group 40). Thread 14 belongs to 10.
    struct Fake {
        procs: Vec<FamilyProcess>,
        threads: HashMap<i32, u64>,
        callers: HashMap<i32, Caller>,
        signalled: RefCell<Vec<(i32, i32)>>,
        failing: HashMap<i32, i32>,
    }

    fn p(pid: i32, member: u64, pgid: i32, is_init: bool) -> FamilyProcess {
        FamilyProcess { pid, member, pgid, is_init }
    }

    impl Fake {
        fn new() -> Fake {
            let procs = vec![
                p(1, SHIM_NS, 1, false),
                p(10, M1, 10, false),
                p(11, M2, 10, false),
                p(12, M1, 10, false),
                p(13, M1, 13, false),
                p(20, M1, 10, true),
                p(21, M1, 21, false),
                p(30, M2, 10, false),
                p(40, M2, 40, true),
            ];
            let mut callers = HashMap::new();
            callers.insert(1010, Caller { member: M1, tgid: 10, pgid: 10, in_leaf: false });
            callers.insert(1021, Caller { member: M1, tgid: 21, pgid: 21, in_leaf: true });
            Fake { procs, threads: HashMap::from([(14, M1)]), callers, signalled: RefCell::new(Vec::new()), failing: HashMap::new() }
        }
        fn sent(&self) -> Vec<(i32, i32)> {
            let mut v = self.signalled.borrow().clone();
            v.sort();
            v
        }
    }

    impl FamilyView for Fake {
        fn caller(&self, host_pid: i32) -> Option<Caller> {
            self.callers.get(&host_pid).copied()
        }
        fn member_of(&self, pid: i32) -> Option<u64> {
            self.procs.iter().find(|p| p.pid == pid).map(|p| p.member).or_else(|| self.threads.get(&pid).copied())
        }
        fn processes(&self) -> Vec<FamilyProcess> {
            self.procs.clone()
        }
        fn signal(&self, pid: i32, member: u64, sig: i32) -> io::Result<()> {
            if self.member_of(pid) != Some(member) {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            if let Some(e) = self.failing.get(&pid) {
                return Err(io::Error::from_raw_os_error(*e));
            }
            self.signalled.borrow_mut().push((pid, sig));
            Ok(())
        }
    }

    fn call(nr: libc::c_long, args: &[u64]) -> Notification {
        let mut a = [0u64; 6];
        a[..args.len()].copy_from_slice(args);
        Notification { id: 7, pid: 1010, nr, args: a }
    }

    use Verdict::{Continue, Errno, Return};

    #[test]
    fn unknown_caller_fails_closed() {
        let f = Fake::new();
        for n in [call(libc::SYS_kill, &[12, 9]), call(libc::SYS_tkill, &[12, 9]), call(libc::SYS_getpid, &[])] {
            let n = Notification { pid: 999, ..n };
            assert_eq!(vet(&n, &f), Errno(libc::EPERM));
            assert_eq!(vet(&Notification { pid: 0, ..n }, &f), Errno(libc::EPERM));
        }
        assert!(f.sent().is_empty());
    }

    #[test]
    fn kill_reaches_only_the_callers_member() {
        let f = Fake::new();
        assert_eq!(vet(&call(libc::SYS_kill, &[12, 15]), &f), Return(0));
        assert_eq!(f.sent(), vec![(12, 15)]);
        for other in [11, 30, 40, 1, 99] {
            assert_eq!(vet(&call(libc::SYS_kill, &[other, 9]), &f), Errno(libc::ESRCH), "pid {other}");
            assert_eq!(vet(&call(libc::SYS_kill, &[other, 0]), &f), Errno(libc::ESRCH), "probe {other}");
        }
        assert_eq!(f.sent(), vec![(12, 15)]);
        // A probe of its own member, its own init and itself.
        assert_eq!(vet(&call(libc::SYS_kill, &[13, 0]), &f), Return(0));
        assert_eq!(vet(&call(libc::SYS_kill, &[20, 9]), &f), Return(0));
        assert_eq!(vet(&call(libc::SYS_kill, &[10, 10]), &f), Return(0));
        assert_eq!(f.sent(), vec![(10, 10), (12, 15), (13, 0), (20, 9)]);
    }

    #[test]
    fn kill_checks_the_signal_number_first() {
        let f = Fake::new();
        for sig in [-1i32, 65, 1000] {
            for pid in [12i32, 30, 0, -1, -10] {
                assert_eq!(vet(&call(libc::SYS_kill, &[neg(pid), neg(sig)]), &f), Errno(libc::EINVAL));
            }
        }
        assert_eq!(vet(&call(libc::SYS_kill, &[12, 64]), &f), Return(0));
        assert_eq!(f.sent(), vec![(12, 64)]);
    }

    #[test]
    fn kill_reports_the_errno_of_a_failed_signal() {
        let mut f = Fake::new();
        f.failing.insert(12, libc::EPERM);
        assert_eq!(vet(&call(libc::SYS_kill, &[12, 9]), &f), Errno(libc::EPERM));
    }

    #[test]
    fn kill_zero_signals_the_group_in_the_member_only() {
        let f = Fake::new();
        assert_eq!(vet(&call(libc::SYS_kill, &[0, 1]), &f), Return(0));
        // 11 and 30 share the group but are in M2; 1 is the family init.
        assert_eq!(f.sent(), vec![(10, 1), (12, 1), (20, 1)]);
    }

    #[test]
    fn kill_of_a_group_signals_its_part_in_the_member() {
        let f = Fake::new();
        assert_eq!(vet(&call(libc::SYS_kill, &[neg(-10), 2]), &f), Return(0));
        assert_eq!(f.sent(), vec![(10, 2), (12, 2), (20, 2)]);
        let f = Fake::new();
        assert_eq!(vet(&call(libc::SYS_kill, &[neg(-13), 0]), &f), Return(0));
        assert_eq!(f.sent(), vec![(13, 0)]);
        // Another member's group, an empty group, the family init's group.
        let f = Fake::new();
        for pg in [-40, -77, -1 + -1, i32::MIN] {
            assert_eq!(vet(&call(libc::SYS_kill, &[neg(pg), 9]), &f), Errno(libc::ESRCH), "group {pg}");
        }
        assert!(f.sent().is_empty());
    }

    #[test]
    fn kill_all_spares_the_caller_the_inits_and_other_members() {
        let f = Fake::new();
        assert_eq!(vet(&call(libc::SYS_kill, &[neg(-1), 9]), &f), Return(0));
        assert_eq!(f.sent(), vec![(12, 9), (13, 9), (21, 9)]);
    }

    #[test]
    fn kill_all_with_nobody_else_is_esrch() {
        let mut f = Fake::new();
        f.procs.retain(|p| p.member != M1 || p.pid == 10 || p.is_init);
        assert_eq!(vet(&call(libc::SYS_kill, &[neg(-1), 9]), &f), Errno(libc::ESRCH));
        assert!(f.sent().is_empty());
    }

    #[test]
    fn arguments_are_read_as_c_ints() {
        let f = Fake::new();
        // -1 as a zero-extended 32-bit value is still -1.
        assert_eq!(vet(&call(libc::SYS_kill, &[0xffff_ffff, 9]), &f), Return(0));
        assert_eq!(f.sent(), vec![(12, 9), (13, 9), (21, 9)]);
        // Junk in the high half does not change the pid.
        let f = Fake::new();
        assert_eq!(vet(&call(libc::SYS_kill, &[(5 << 32) | 12, (1 << 40) | 15]), &f), Return(0));
        assert_eq!(f.sent(), vec![(12, 15)]);
        let f = Fake::new();
        assert_eq!(vet(&call(libc::SYS_kill, &[(5 << 32) | 30, 15]), &f), Errno(libc::ESRCH));
        assert_eq!(vet(&call(libc::SYS_prlimit64, &[1 << 32, 7]), &f), Continue);
    }

    #[test]
    fn thread_directed_signals_continue_only_inside_the_member() {
        let f = Fake::new();
        assert_eq!(vet(&call(libc::SYS_tkill, &[14, 10]), &f), Continue);
        assert_eq!(vet(&call(libc::SYS_tkill, &[12, 10]), &f), Continue);
        assert_eq!(vet(&call(libc::SYS_tkill, &[30, 10]), &f), Errno(libc::ESRCH));
        assert_eq!(vet(&call(libc::SYS_tkill, &[0, 10]), &f), Errno(libc::EINVAL));
        assert_eq!(vet(&call(libc::SYS_tgkill, &[10, 14, 10]), &f), Continue);
        assert_eq!(vet(&call(libc::SYS_tgkill, &[30, 30, 9]), &f), Errno(libc::ESRCH));
        // The thread decides, the kernel checks it belongs to the tgid.
        assert_eq!(vet(&call(libc::SYS_tgkill, &[30, 12, 9]), &f), Continue);
        assert_eq!(vet(&call(libc::SYS_tgkill, &[neg(-1), 12, 9]), &f), Errno(libc::EINVAL));
        assert_eq!(vet(&call(libc::SYS_rt_sigqueueinfo, &[12, 10, 0x1000]), &f), Continue);
        assert_eq!(vet(&call(libc::SYS_rt_sigqueueinfo, &[11, 10, 0x1000]), &f), Errno(libc::ESRCH));
        assert_eq!(vet(&call(libc::SYS_rt_sigqueueinfo, &[neg(-12), 10, 0x1000]), &f), Errno(libc::ESRCH));
        assert_eq!(vet(&call(libc::SYS_rt_tgsigqueueinfo, &[10, 14, 10, 0x1000]), &f), Continue);
        assert_eq!(vet(&call(libc::SYS_rt_tgsigqueueinfo, &[40, 40, 10, 0x1000]), &f), Errno(libc::ESRCH));
        assert!(f.sent().is_empty());
    }

    #[test]
    fn set_owner_is_vetted() {
        let f = Fake::new();
        let own = |arg: i32| vet(&call(libc::SYS_fcntl, &[3, F_SETOWN as u64, neg(arg)]), &f);
        assert_eq!(own(0), Continue);
        assert_eq!(own(12), Continue);
        assert_eq!(own(14), Continue);
        assert_eq!(own(30), Errno(libc::ESRCH));
        assert_eq!(own(1), Errno(libc::ESRCH));
        assert_eq!(own(-13), Continue);
        assert_eq!(own(-10), Errno(libc::EPERM), "group 10 straddles M1 and M2");
        assert_eq!(own(-40), Errno(libc::ESRCH));
        assert_eq!(own(-77), Errno(libc::ESRCH));
        assert_eq!(own(i32::MIN), Errno(libc::EINVAL));
        assert_eq!(vet(&call(libc::SYS_fcntl, &[3, F_SETOWN_EX as u64, 0x7ff0_0000]), &f), Errno(libc::EPERM));
        assert_eq!(vet(&call(libc::SYS_fcntl, &[3, libc::F_GETFL as u64]), &f), Continue);
    }

    #[test]
    fn priorities_only_in_process_scope_inside_the_member() {
        let f = Fake::new();
        let sp = |which: i32, who: i32| vet(&call(libc::SYS_setpriority, &[neg(which), neg(who), 5]), &f);
        assert_eq!(sp(0, 0), Continue);
        assert_eq!(sp(0, 12), Continue);
        assert_eq!(sp(0, 14), Continue);
        assert_eq!(sp(0, 30), Errno(libc::ESRCH));
        assert_eq!(sp(0, -5), Errno(libc::ESRCH));
        assert_eq!(sp(1, 0), Errno(libc::EPERM));
        assert_eq!(sp(1, 10), Errno(libc::EPERM));
        assert_eq!(sp(2, 0), Errno(libc::EPERM));
        assert_eq!(sp(9, 0), Errno(libc::EPERM));
        let io = |which: i32, who: i32| vet(&call(libc::SYS_ioprio_set, &[neg(which), neg(who), 0x4004]), &f);
        assert_eq!(io(1, 12), Continue);
        assert_eq!(io(1, 40), Errno(libc::ESRCH));
        assert_eq!(io(2, 10), Errno(libc::EPERM));
        assert_eq!(io(3, 0), Errno(libc::EPERM));
    }

    #[test]
    fn pid_calls_only_inside_the_member() {
        let f = Fake::new();
        for nr in PID_FIRST {
            assert_eq!(vet(&call(nr, &[12, 7]), &f), Continue, "nr {nr}");
            assert_eq!(vet(&call(nr, &[14, 7]), &f), Continue, "nr {nr}");
            assert_eq!(vet(&call(nr, &[0, 7]), &f), Continue, "nr {nr}");
            assert_eq!(vet(&call(nr, &[30, 7]), &f), Errno(libc::ESRCH), "nr {nr}");
            assert_eq!(vet(&call(nr, &[40, 7]), &f), Errno(libc::ESRCH), "nr {nr}");
            assert_eq!(vet(&call(nr, &[1, 7]), &f), Errno(libc::ESRCH), "nr {nr}");
            let negative = vet(&call(nr, &[neg(-4), 7]), &f);
            assert!(negative == Errno(libc::ESRCH) || negative == Errno(libc::EINVAL), "nr {nr}: {negative:?}");
        }
        assert_eq!(vet(&call(libc::SYS_sched_setscheduler, &[neg(-4), 0, 0]), &f), Errno(libc::EINVAL));
        assert_eq!(vet(&call(libc::SYS_prlimit64, &[neg(-4), 7]), &f), Errno(libc::ESRCH));
    }

    #[test]
    fn leaf_callers_and_other_calls_continue() {
        let f = Fake::new();
        let leaf = |n: Notification| Notification { pid: 1021, ..n };
        assert_eq!(vet(&leaf(call(libc::SYS_kill, &[neg(-1), 9])), &f), Continue);
        assert_eq!(vet(&leaf(call(libc::SYS_kill, &[3, 9])), &f), Continue);
        assert_eq!(vet(&leaf(call(libc::SYS_setpriority, &[2, 0, 5])), &f), Continue);
        assert_eq!(vet(&call(libc::SYS_getpid, &[]), &f), Continue);
        assert!(f.sent().is_empty());
    }
}
