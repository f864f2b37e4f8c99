//! The filter: the REPL's notify filter, a classic BPF seccomp program, and
//! its installation with a listener.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use super::{F_SETOWN, F_SETOWN_EX, HANDOVER_GIVE, HANDOVER_TAKE, IOPRIO_WHO_PROCESS, PID_FIRST, PRIO_PROCESS};

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
const AUDIT_ARCH_AARCH64: u32 = 0xc000_00b7;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH_NATIVE: u32 = AUDIT_ARCH_X86_64;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH_NATIVE: u32 = AUDIT_ARCH_AARCH64;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("the REPL's notify filter knows only x86_64 and aarch64");

/// x32 system calls come in on `AUDIT_ARCH_X86_64` with this bit set in `nr`.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// `ioctl` requests that do what `F_SETOWN` does (asm-generic/sockios.h;
/// the same numbers on x86_64 and aarch64).
const FIOSETOWN: u32 = 0x8901;
const SIOCSPGRP: u32 = 0x8902;

/// Offsets into `struct seccomp_data`: `nr` (u32), `arch` (u32),
/// `instruction_pointer` (u64), `args[6]` (u64 each, native byte order).
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;
const fn arg_low(i: u32) -> u32 {
    16 + 8 * i + if cfg!(target_endian = "big") { 4 } else { 0 }
}
const fn arg_high(i: u32) -> u32 {
    16 + 8 * i + if cfg!(target_endian = "big") { 0 } else { 4 }
}

/// Calls that signal a pid, a tid or a process group: always vetted.
const SIGNALLERS: [libc::c_long; 5] = [libc::SYS_kill, libc::SYS_tkill, libc::SYS_tgkill, libc::SYS_rt_sigqueueinfo, libc::SYS_rt_tgsigqueueinfo];

/// A tiny classic-BPF assembler with named forward jump targets, so the
/// program below reads as a list of rules.
mod asm {
    /// Where a conditional jump goes.
    #[derive(Clone, Copy)]
    pub enum To {
        /// The next instruction.
        Next,
        /// A label placed later in the program.
        L(Label),
    }

    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    pub enum Label {
        Allow,
        Notify,
        Eperm,
        #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
        Enosys,
        Fcntl,
        Ioctl,
        Socket,
        SetPriority,
        IoprioSet,
        PidFirst,
    }

    enum Op {
        Here(Label),
        Load(u32),
        Jump(u32, u32, To, To),
        Ret(u32),
    }

    #[derive(Default)]
    pub struct Asm {
        ops: Vec<Op>,
    }

    const LD_W_ABS: u32 = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    const JEQ_K: u32 = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
    const JGE_K: u32 = libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K;
    const RET_K: u32 = libc::BPF_RET | libc::BPF_K;

    impl Asm {
        /// Put `label` at the next instruction.
        pub fn label(&mut self, label: Label) {
            self.ops.push(Op::Here(label));
        }
        /// `A = seccomp_data[offset..offset + 4]`.
        pub fn load(&mut self, offset: u32) {
            self.ops.push(Op::Load(offset));
        }
        /// `if A == k goto yes else goto no`.
        pub fn jeq(&mut self, k: u32, yes: To, no: To) {
            self.ops.push(Op::Jump(JEQ_K, k, yes, no));
        }
        /// `if A >= k goto yes else goto no` (unsigned).
        #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
        pub fn jge(&mut self, k: u32, yes: To, no: To) {
            self.ops.push(Op::Jump(JGE_K, k, yes, no));
        }
        /// `return k`.
        pub fn ret(&mut self, k: u32) {
            self.ops.push(Op::Ret(k));
        }

        /// Resolve the labels. Panics on a label that is missing, placed
        /// twice, behind its jump (BPF only jumps forward) or out of reach
        /// of an 8-bit offset: all mistakes in the program text, caught by
        /// its unit test.
        pub fn finish(self) -> Vec<libc::sock_filter> {
            let mut at: Vec<(Label, usize)> = Vec::new();
            let mut n = 0;
            for op in &self.ops {
                match op {
                    Op::Here(l) => {
                        assert!(at.iter().all(|(m, _)| m != l), "label {l:?} placed twice");
                        at.push((*l, n));
                    }
                    _ => n += 1,
                }
            }
            let offset = |from: usize, to: To| -> u8 {
                let target = match to {
                    To::Next => return 0,
                    To::L(l) => at.iter().find(|(m, _)| *m == l).unwrap_or_else(|| panic!("label {l:?} not placed")).1,
                };
                assert!(target > from, "jump from {from} to {target} is not forward");
                u8::try_from(target - from - 1).expect("jump within 255 instructions")
            };
            let mut out = Vec::with_capacity(n);
            for op in &self.ops {
                let i = out.len();
                let insn = match *op {
                    Op::Here(_) => continue,
                    Op::Load(k) => libc::sock_filter { code: LD_W_ABS as u16, jt: 0, jf: 0, k },
                    Op::Jump(code, k, yes, no) => libc::sock_filter { code: code as u16, jt: offset(i, yes), jf: offset(i, no), k },
                    Op::Ret(k) => libc::sock_filter { code: RET_K as u16, jt: 0, jf: 0, k },
                };
                out.push(insn);
            }
            out
        }
    }
}

/// `(which, who, ...)` calls (setpriority, ioprio_set) pass as they are
/// only when they name the caller itself (`which`, 0); the rest go to the
/// shim.
fn only_on_self(a: &mut asm::Asm, which: u32) {
    use asm::Label::{Allow, Notify};
    use asm::To::{Next, L};
    a.load(arg_low(0));
    a.jeq(which, Next, L(Notify));
    a.load(arg_high(0));
    a.jeq(0, Next, L(Notify));
    a.load(arg_low(1));
    a.jeq(0, Next, L(Notify));
    a.load(arg_high(1));
    a.jeq(0, L(Allow), L(Notify));
}

/// The REPL's notify filter, a classic BPF seccomp program:
///
/// * a call of another architecture: allowed here (the REPL's other
///   filters kill those); on x86_64, an x32 call (`nr` with bit 30 set,
///   same `arch`) fails with `ENOSYS`;
/// * `kill`, `tkill`, `tgkill`, `rt_sigqueueinfo`, `rt_tgsigqueueinfo`:
///   notify;
/// * `fcntl(fd, F_SETOWN | F_SETOWN_EX, ..)` (the low 32 bits of `cmd`, all
///   the kernel reads): notify;
/// * `ioctl(fd, FIOSETOWN | SIOCSPGRP, ..)` (low 32 bits of the request):
///   `EPERM`, as the owner lives in the caller's memory;
/// * `ioctl(slot, HANDOVER_TAKE | HANDOVER_GIVE, ..)`: notify (a fork's
///   descriptor hand-over, see [`HandOver`](super::HandOver));
/// * `setpriority` unless `(PRIO_PROCESS, 0)`, `ioprio_set` unless
///   `(IOPRIO_WHO_PROCESS, 0)`: notify;
/// * `prlimit64`, `sched_setaffinity`, `sched_setscheduler`,
///   `sched_setparam`, `sched_setattr`, `migrate_pages`, `move_pages` with a
///   pid other than 0: notify;
/// * `socket` of any domain but `AF_UNIX`: notify (the member's way out
///   starts on its first, see [`socket_filter`]);
/// * anything else: allowed.
///
/// "Is 0" compares all 64 bits of an argument, although the kernel reads
/// only the low 32 of these `int`/`pid_t` arguments: a value with junk in
/// the high half is notified, and [`vet`](fn@super::vet), which reads the low half as the
/// kernel does, lets it through if it means the caller. Comparing the low
/// half alone would be as exact; comparing both cannot let anything through
/// that one half would stop.
///
/// The program must be installed with [`install_with_listener`], which
/// also makes a waiting caller immune to non-fatal signals once the shim
/// has read its notification; [`vet`](fn@super::vet) relies on that.
pub fn repl_filter() -> Vec<libc::sock_filter> {
    use asm::Label::*;
    use asm::To::{Next, L};

    let notify = libc::SECCOMP_RET_USER_NOTIF;
    let errno = |e: i32| libc::SECCOMP_RET_ERRNO | (e as u32 & libc::SECCOMP_RET_DATA);
    let mut a = asm::Asm::default();

    a.load(DATA_ARCH);
    a.jeq(AUDIT_ARCH_NATIVE, Next, L(Allow));
    a.load(DATA_NR);
    #[cfg(target_arch = "x86_64")]
    a.jge(X32_SYSCALL_BIT, L(Enosys), Next);
    for nr in SIGNALLERS {
        a.jeq(nr as u32, L(Notify), Next);
    }
    a.jeq(libc::SYS_fcntl as u32, L(Fcntl), Next);
    a.jeq(libc::SYS_ioctl as u32, L(Ioctl), Next);
    a.jeq(libc::SYS_socket as u32, L(Socket), Next);
    a.jeq(libc::SYS_setpriority as u32, L(SetPriority), Next);
    a.jeq(libc::SYS_ioprio_set as u32, L(IoprioSet), Next);
    for nr in PID_FIRST {
        a.jeq(nr as u32, L(PidFirst), Next);
    }
    a.ret(libc::SECCOMP_RET_ALLOW);

    // fcntl(fd, cmd, arg): cmd is an unsigned int.
    a.label(Fcntl);
    a.load(arg_low(1));
    a.jeq(F_SETOWN as u32, L(Notify), Next);
    a.jeq(F_SETOWN_EX as u32, L(Notify), L(Allow));

    // ioctl(fd, request, arg): the kernel reads request as an unsigned int.
    a.label(Ioctl);
    a.load(arg_low(1));
    a.jeq(FIOSETOWN, L(Eperm), Next);
    a.jeq(SIOCSPGRP, L(Eperm), Next);
    a.jeq(HANDOVER_TAKE, L(Notify), Next);
    a.jeq(HANDOVER_GIVE, L(Notify), L(Allow));

    a.label(Socket);
    network_sockets(&mut a);

    // setpriority(which, who, prio): allowed as is only for (PRIO_PROCESS, 0).
    a.label(SetPriority);
    only_on_self(&mut a, PRIO_PROCESS as u32);

    // ioprio_set(which, who, ioprio): allowed as is only for (IOPRIO_WHO_PROCESS, 0).
    a.label(IoprioSet);
    only_on_self(&mut a, IOPRIO_WHO_PROCESS as u32);

    // prlimit64(pid, ..), sched_set*(pid, ..), migrate_pages(pid, ..),
    // move_pages(pid, ..): allowed as is only for pid 0, the caller.
    a.label(PidFirst);
    a.load(arg_low(0));
    a.jeq(0, Next, L(Notify));
    a.load(arg_high(0));
    a.jeq(0, L(Allow), L(Notify));

    a.label(Allow);
    a.ret(libc::SECCOMP_RET_ALLOW);
    a.label(Notify);
    a.ret(notify);
    a.label(Eperm);
    a.ret(errno(libc::EPERM));
    #[cfg(target_arch = "x86_64")]
    {
        a.label(Enosys);
        a.ret(errno(libc::ENOSYS));
    }
    a.finish()
}

/// `socket(domain, ..)`: notify unless `domain` is `AF_UNIX`. The kernel
/// reads `domain` as an int, so only its low half is compared.
fn network_sockets(a: &mut asm::Asm) {
    use asm::Label::{Allow, Notify};
    use asm::To::L;
    a.load(arg_low(0));
    a.jeq(libc::AF_UNIX as u32, L(Allow), L(Notify));
}

/// The filter of a member's init, inherited by every command it runs
/// (their own filters come on top, without a listener): `socket` of any
/// domain but `AF_UNIX` goes to the shim, everything else is allowed.
///
/// A sandbox's way out (pasta, its firewall and DNS proxy) costs about
/// 20 ms of CPU to start and as much to stop, and most sandboxes never use
/// the network; so it starts when a process of the member first asks for
/// a network socket (`AF_INET`, `AF_INET6`, also `AF_NETLINK`, by which
/// glibc and `ip` look at the interfaces, and the rest): the shim parks
/// the call until the server says the way out runs
/// (docs/network.md#the-way-out-starts-on-first-use). Calls of another
/// architecture and x32 calls are left to the member's other filters,
/// which kill them.
pub fn socket_filter() -> Vec<libc::sock_filter> {
    use asm::Label::*;
    use asm::To::{Next, L};
    let mut a = asm::Asm::default();
    a.load(DATA_ARCH);
    a.jeq(AUDIT_ARCH_NATIVE, Next, L(Allow));
    a.load(DATA_NR);
    a.jeq(libc::SYS_socket as u32, L(Socket), L(Allow));
    a.label(Socket);
    network_sockets(&mut a);
    a.label(Allow);
    a.ret(libc::SECCOMP_RET_ALLOW);
    a.label(Notify);
    a.ret(libc::SECCOMP_RET_USER_NOTIF);
    a.finish()
}

/// Install `prog` as a seccomp filter of the calling thread and return the
/// listener of its notifications:
/// `seccomp(SECCOMP_SET_MODE_FILTER, NEW_LISTENER | WAIT_KILLABLE_RECV, prog)`.
///
/// The caller must have set no_new_privs (or hold `CAP_SYS_ADMIN`). Only one
/// filter with a listener may be installed in a task's chain (`EBUSY`
/// otherwise); processes forked later inherit it and its listener.
///
/// `SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV` (Linux 5.19): once the shim has
/// received a notification, the waiting caller is woken only by a reply or a
/// fatal signal. Without it, a signal the shim sends to the caller itself
/// while emulating `kill(getpid(), sig)` or `kill(0, sig)` would interrupt
/// the wait: the call would fail with `EINTR` or be restarted (and signal
/// everyone again) instead of returning 0 with the signal pending, as the
/// kernel's `kill` does.
///
/// Allocates nothing and calls only `seccomp(2)`, so it may run between
/// `fork` and `exec`.
pub fn install_with_listener(prog: &[libc::sock_filter]) -> io::Result<OwnedFd> {
    let Ok(len) = u16::try_from(prog.len()) else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    let fprog = libc::sock_fprog { len, filter: prog.as_ptr().cast_mut() };
    let flags = libc::SECCOMP_FILTER_FLAG_NEW_LISTENER | libc::SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV;
    // SAFETY: `fprog` points at `prog`, which outlives the call; the kernel
    // copies the program and only reads it.
    let fd = unsafe { libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, flags, &fprog as *const libc::sock_fprog) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor (close-on-exec) that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notify::{HandOver, Notification};

    // --- the filter, through a small BPF interpreter -------------------------

    /// Run a classic BPF seccomp program on `data` (a `struct seccomp_data`).
    /// Knows the instructions the filter uses; anything else is a failure.
    fn run(prog: &[libc::sock_filter], data: &[u8; 64]) -> u32 {
        let mut a: u32 = 0;
        let mut pc = 0usize;
        for _ in 0..=prog.len() {
            let i = prog.get(pc).unwrap_or_else(|| panic!("fell off the program at {pc}"));
            let code = u32::from(i.code);
            pc += 1;
            match code {
                c if c == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS => {
                    let k = i.k as usize;
                    assert!(k.is_multiple_of(4) && k + 4 <= data.len(), "load at {k}");
                    a = u32::from_ne_bytes(data[k..k + 4].try_into().unwrap());
                }
                c if c == libc::BPF_ALU | libc::BPF_AND | libc::BPF_K => a &= i.k,
                c if c == libc::BPF_JMP | libc::BPF_JA => pc += i.k as usize,
                c if c == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K => {
                    pc += usize::from(if a == i.k { i.jt } else { i.jf });
                }
                c if c == libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K => {
                    pc += usize::from(if a >= i.k { i.jt } else { i.jf });
                }
                c if c == libc::BPF_RET | libc::BPF_K => return i.k,
                other => panic!("unknown instruction {other:#x} at {}", pc - 1),
            }
        }
        panic!("program did not return");
    }

    fn data(arch: u32, nr: libc::c_long, args: [u64; 6]) -> [u8; 64] {
        let mut d = [0u8; 64];
        d[0..4].copy_from_slice(&(nr as u32).to_ne_bytes());
        d[4..8].copy_from_slice(&arch.to_ne_bytes());
        d[8..16].copy_from_slice(&0x7fff_1234_5678u64.to_ne_bytes());
        for (i, a) in args.iter().enumerate() {
            d[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_ne_bytes());
        }
        d
    }

    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
    const NOTIFY: u32 = libc::SECCOMP_RET_USER_NOTIF;
    const EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;

    fn check(nr: libc::c_long, args: [u64; 6]) -> u32 {
        run(&repl_filter(), &data(AUDIT_ARCH_NATIVE, nr, args))
    }

    fn neg(v: i32) -> u64 {
        v as i64 as u64
    }

    #[test]
    fn filter_notifies_every_signal_call() {
        for nr in SIGNALLERS {
            assert_eq!(check(nr, [0; 6]), NOTIFY, "nr {nr}");
            assert_eq!(check(nr, [5, 9, 0, 0, 0, 0]), NOTIFY, "nr {nr}");
            assert_eq!(check(nr, [neg(-1), 9, 0, 0, 0, 0]), NOTIFY, "nr {nr}");
        }
    }

    #[test]
    fn filter_notifies_only_the_owner_setting_fcntls() {
        let fcntl = libc::SYS_fcntl;
        assert_eq!(check(fcntl, [3, F_SETOWN as u64, 42, 0, 0, 0]), NOTIFY);
        assert_eq!(check(fcntl, [3, F_SETOWN_EX as u64, 0x1000, 0, 0, 0]), NOTIFY);
        // cmd is an unsigned int: the high half is ignored, as by the kernel.
        assert_eq!(check(fcntl, [3, (1 << 32) | F_SETOWN as u64, 42, 0, 0, 0]), NOTIFY);
        for cmd in [libc::F_GETFL, libc::F_SETFL, libc::F_GETOWN, libc::F_DUPFD_CLOEXEC, 10 /* F_SETSIG */] {
            assert_eq!(check(fcntl, [3, cmd as u64, 42, 0, 0, 0]), ALLOW, "cmd {cmd}");
        }
    }

    #[test]
    fn filter_notifies_hand_over_ioctls_and_only_those() {
        let ioctl = libc::SYS_ioctl;
        let take = u64::from(HANDOVER_TAKE);
        let give = u64::from(HANDOVER_GIVE);
        assert_eq!(check(ioctl, [0, take, 0, 0, 0, 0]), NOTIFY);
        assert_eq!(check(ioctl, [31, give, 4242, 0, 0, 0]), NOTIFY);
        assert_eq!(check(ioctl, [0, (1 << 32) | take, 0, 0, 0, 0]), NOTIFY);
        assert_eq!(check(ioctl, [0, take + 2, 0, 0, 0, 0]), ALLOW);
        let n = |args: [u64; 6]| Notification { id: 1, pid: 9, nr: ioctl, args };
        assert_eq!(HandOver::of(&n([3, take, 0, 0, 0, 0])), Some(HandOver::Take { slot: 3 }));
        assert_eq!(HandOver::of(&n([0, give, 77, 0, 0, 0])), Some(HandOver::Give { slot: 0, pid: 77 }));
        assert_eq!(HandOver::of(&n([neg(-1), take, 0, 0, 0, 0])), None);
        assert_eq!(HandOver::of(&n([0, 0x541b, 0, 0, 0, 0])), None);
    }

    #[test]
    fn filter_denies_owner_setting_ioctls() {
        let ioctl = libc::SYS_ioctl;
        assert_eq!(check(ioctl, [3, 0x8901, 0, 0, 0, 0]), EPERM);
        assert_eq!(check(ioctl, [3, 0x8902, 0, 0, 0, 0]), EPERM);
        assert_eq!(check(ioctl, [3, (7 << 32) | 0x8901, 0, 0, 0, 0]), EPERM);
        assert_eq!(check(ioctl, [3, 0x541b /* FIONREAD */, 0, 0, 0, 0]), ALLOW);
        assert_eq!(check(ioctl, [3, 0x5413 /* TIOCGWINSZ */, 0, 0, 0, 0]), ALLOW);
    }

    #[test]
    fn filter_lets_own_priority_through_and_notifies_the_rest() {
        let sp = libc::SYS_setpriority;
        assert_eq!(check(sp, [0, 0, 5, 0, 0, 0]), ALLOW);
        assert_eq!(check(sp, [0, 7, 5, 0, 0, 0]), NOTIFY);
        assert_eq!(check(sp, [1, 0, 5, 0, 0, 0]), NOTIFY);
        assert_eq!(check(sp, [2, 0, 5, 0, 0, 0]), NOTIFY);
        assert_eq!(check(sp, [1 << 32, 0, 5, 0, 0, 0]), NOTIFY);
        assert_eq!(check(sp, [0, 1 << 32, 5, 0, 0, 0]), NOTIFY);
        let io = libc::SYS_ioprio_set;
        assert_eq!(check(io, [1, 0, 0x4004, 0, 0, 0]), ALLOW);
        assert_eq!(check(io, [1, 9, 0x4004, 0, 0, 0]), NOTIFY);
        assert_eq!(check(io, [2, 0, 0x4004, 0, 0, 0]), NOTIFY);
        assert_eq!(check(io, [3, 0, 0x4004, 0, 0, 0]), NOTIFY);
        assert_eq!(check(io, [0, 0, 0x4004, 0, 0, 0]), NOTIFY);
        assert_eq!(check(io, [1 | (1 << 32), 0, 0x4004, 0, 0, 0]), NOTIFY);
    }

    #[test]
    fn filter_notifies_pid_calls_unless_pid_is_zero() {
        for nr in PID_FIRST {
            assert_eq!(check(nr, [0, 7, 0, 0, 0, 0]), ALLOW, "nr {nr}");
            assert_eq!(check(nr, [12, 7, 0, 0, 0, 0]), NOTIFY, "nr {nr}");
            assert_eq!(check(nr, [1 << 32, 7, 0, 0, 0, 0]), NOTIFY, "nr {nr}");
            assert_eq!(check(nr, [neg(-3), 7, 0, 0, 0, 0]), NOTIFY, "nr {nr}");
        }
    }

    #[test]
    fn filters_notify_network_sockets_and_not_unix_ones() {
        let socket = libc::SYS_socket;
        for prog in [repl_filter(), socket_filter()] {
            let on = |args: [u64; 6]| run(&prog, &data(AUDIT_ARCH_NATIVE, socket, args));
            for domain in [libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK, libc::AF_PACKET, 0, 200] {
                assert_eq!(on([domain as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0]), NOTIFY, "domain {domain}");
            }
            assert_eq!(on([libc::AF_UNIX as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0]), ALLOW);
            // domain is an int: junk in the high half still means AF_UNIX, as for the kernel.
            assert_eq!(on([(7 << 32) | libc::AF_UNIX as u64, 1, 0, 0, 0, 0]), ALLOW);
            assert_eq!(on([(7 << 32) | libc::AF_INET as u64, 1, 0, 0, 0, 0]), NOTIFY);
        }
    }

    #[test]
    fn the_socket_filter_lets_everything_else_through() {
        let prog = socket_filter();
        for nr in [libc::SYS_kill, libc::SYS_socketpair, libc::SYS_connect, libc::SYS_ioctl, libc::SYS_write] {
            assert_eq!(run(&prog, &data(AUDIT_ARCH_NATIVE, nr, [libc::AF_INET as u64, 0, 0, 0, 0, 0])), ALLOW, "nr {nr}");
        }
        let foreign = if AUDIT_ARCH_NATIVE == AUDIT_ARCH_X86_64 { AUDIT_ARCH_AARCH64 } else { AUDIT_ARCH_X86_64 };
        assert_eq!(run(&prog, &data(foreign, libc::SYS_socket, [libc::AF_INET as u64, 0, 0, 0, 0, 0])), ALLOW);
    }

    #[test]
    fn filter_allows_everything_else() {
        for nr in [
            libc::SYS_getpid,
            libc::SYS_write,
            libc::SYS_read,
            libc::SYS_openat,
            libc::SYS_getpriority,
            libc::SYS_sched_getaffinity,
            libc::SYS_pidfd_send_signal,
            libc::SYS_setpgid,
        ] {
            assert_eq!(check(nr, [1, 2, 3, 4, 5, 6]), ALLOW, "nr {nr}");
        }
    }

    #[test]
    fn filter_leaves_foreign_architectures_to_the_other_filters() {
        let foreign = if AUDIT_ARCH_NATIVE == AUDIT_ARCH_X86_64 { AUDIT_ARCH_AARCH64 } else { AUDIT_ARCH_X86_64 };
        let prog = repl_filter();
        assert_eq!(run(&prog, &data(foreign, libc::SYS_kill, [5, 9, 0, 0, 0, 0])), ALLOW);
        assert_eq!(run(&prog, &data(0x4000_0003, libc::SYS_kill, [5, 9, 0, 0, 0, 0])), ALLOW);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn filter_refuses_x32_calls() {
        let x32_kill = libc::SYS_kill | X32_SYSCALL_BIT as libc::c_long;
        assert_eq!(check(x32_kill, [5, 9, 0, 0, 0, 0]), libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32);
    }

    #[test]
    fn filter_is_small_and_well_formed() {
        let prog = repl_filter();
        assert!(prog.len() < 64, "{} instructions", prog.len());
        for (i, insn) in prog.iter().enumerate() {
            let class = u32::from(insn.code) & 0x07;
            if class == libc::BPF_JMP {
                assert!(i + 1 + usize::from(insn.jt.max(insn.jf)) < prog.len(), "jump out of program at {i}");
            }
        }
        assert_eq!(u32::from(prog.last().unwrap().code), libc::BPF_RET | libc::BPF_K);
    }
}
