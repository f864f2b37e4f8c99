//! Vetting, in the family's supervisor (the shim), the calls by which a REPL
//! could reach the processes of another member of its family (docs/architecture.md#processes-and-namespaces).
//!
//! A member's REPL lives in the family pid namespace P_F and holds
//! capabilities in the family user namespace U_F, like every other member's
//! processes, which all run as uid 0 of U_F. So the kernel would let a REPL
//! signal, renice, re-limit or re-pin any process it can name, and it can
//! name every pid of P_F. The REPL's seccomp filter ([`repl_filter`]) hands
//! those calls to the shim with `SECCOMP_RET_USER_NOTIF`; the shim asks
//! [`vet`] and answers through the [`Listener`]:
//!
//! * `kill` is emulated: the shim signals each allowed target itself, through
//!   a handle on which it has re-checked the target's member, so a pid that
//!   is reused in between cannot be hit;
//! * the calls that name one thread or process (`tkill`, `tgkill`,
//!   `rt_sigqueueinfo`, `rt_tgsigqueueinfo`, `F_SETOWN`, `setpriority`,
//!   `ioprio_set`, `prlimit64`, `sched_set*`, `migrate_pages`, `move_pages`)
//!   are let through (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`) when the target is
//!   in the caller's member, and fail as if it did not exist otherwise;
//! * the calls with a user or process-group scope fail with `EPERM`, except
//!   `kill(0)`/`kill(-pgid)`/`kill(-1)`, which the shim narrows to the
//!   caller's member.
//!
//! A member is known by the inode of its mount namespace. Processes inside a
//! member's leaf pid namespace only see that namespace, so the calls they
//! make are let through untouched.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use crate::error::{Error, Result};
use crate::sys::{self, Forked};

// ---------------------------------------------------------------------------
// The filter
// ---------------------------------------------------------------------------

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

/// `fcntl` commands that name the process to receive `SIGIO`/`SIGURG`.
const F_SETOWN: i32 = libc::F_SETOWN;
const F_SETOWN_EX: i32 = 15;
/// `ioctl` requests that do what `F_SETOWN` does (asm-generic/sockios.h;
/// the same numbers on x86_64 and aarch64).
const FIOSETOWN: u32 = 0x8901;
const SIOCSPGRP: u32 = 0x8902;
/// `ioctl` requests by which a fork child takes its descriptors and its
/// parent REPL names the child that may ([`HandOver`], docs/architecture.md#processes-and-namespaces).
/// Direction "none" with a nonzero size: an encoding the kernel's `_IO*`
/// macros never produce, so no driver's request is taken over.
pub const HANDOVER_TAKE: u32 = 0x0046_4201;
pub const HANDOVER_GIVE: u32 = 0x0046_4202;
/// `which` of `setpriority` and of `ioprio_set` for "one process or thread".
const PRIO_PROCESS: i32 = 0;
const IOPRIO_WHO_PROCESS: i32 = 1;
/// Largest signal number (`_NSIG`).
const MAX_SIGNAL: i32 = 64;
/// The family pid namespace's own init, the reaper: in no member, and never
/// signalled by the shim (see [`vet`]).
const FAMILY_INIT: i32 = 1;

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
/// Calls whose first argument is a pid, 0 meaning the caller: vetted unless 0.
const PID_FIRST: [libc::c_long; 7] = [
    libc::SYS_prlimit64,
    libc::SYS_sched_setaffinity,
    libc::SYS_sched_setscheduler,
    libc::SYS_sched_setparam,
    libc::SYS_sched_setattr,
    libc::SYS_migrate_pages,
    libc::SYS_move_pages,
];

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
///   descriptor hand-over, see [`HandOver`]);
/// * `setpriority` unless `(PRIO_PROCESS, 0)`, `ioprio_set` unless
///   `(IOPRIO_WHO_PROCESS, 0)`: notify;
/// * `prlimit64`, `sched_setaffinity`, `sched_setscheduler`,
///   `sched_setparam`, `sched_setattr`, `migrate_pages`, `move_pages` with a
///   pid other than 0: notify;
/// * anything else: allowed.
///
/// "Is 0" compares all 64 bits of an argument, although the kernel reads
/// only the low 32 of these `int`/`pid_t` arguments: a value with junk in
/// the high half is notified, and [`vet`], which reads the low half as the
/// kernel does, lets it through if it means the caller. Comparing the low
/// half alone would be as exact; comparing both cannot let anything through
/// that one half would stop.
///
/// The program must be installed with [`install_with_listener`], which
/// also makes a waiting caller immune to non-fatal signals once the shim
/// has read its notification; [`vet`] relies on that.
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

// ---------------------------------------------------------------------------
// The listener
// ---------------------------------------------------------------------------

const SECCOMP_IOC_MAGIC: u8 = b'!';
/// `_IOWR('!', 0, struct seccomp_notif)`.
const NOTIF_RECV: libc::c_ulong = nix::request_code_readwrite!(SECCOMP_IOC_MAGIC, 0, std::mem::size_of::<libc::seccomp_notif>()) as libc::c_ulong;
/// `_IOWR('!', 1, struct seccomp_notif_resp)`.
const NOTIF_SEND: libc::c_ulong = nix::request_code_readwrite!(SECCOMP_IOC_MAGIC, 1, std::mem::size_of::<libc::seccomp_notif_resp>()) as libc::c_ulong;
/// `_IOW('!', 2, __u64)`.
const NOTIF_ID_VALID: libc::c_ulong = nix::request_code_write!(SECCOMP_IOC_MAGIC, 2, std::mem::size_of::<u64>()) as libc::c_ulong;

/// `_IOW('!', 3, struct seccomp_notif_addfd)`.
const NOTIF_ADDFD: libc::c_ulong = nix::request_code_write!(SECCOMP_IOC_MAGIC, 3, std::mem::size_of::<libc::seccomp_notif_addfd>()) as libc::c_ulong;

/// Room for the kernel's `struct seccomp_notif` or `seccomp_notif_resp`,
/// should it be larger than ours (it may grow; we read our prefix).
const NOTIF_BUF_WORDS: usize = 64;

/// One vetted call, as the kernel describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Notification {
    /// The notification's cookie, for [`Listener::respond`].
    pub id: u64,
    /// The calling thread's id in the listener reader's pid namespace (the
    /// host's, for the shim); 0 if the caller is not visible there.
    pub pid: i32,
    /// The system call number (native architecture: the filter notifies no
    /// other).
    pub nr: libc::c_long,
    pub args: [u64; 6],
}

/// The answer to a [`Notification`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Let the kernel run the call as made (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`).
    Continue,
    /// Skip the call; it fails with this errno.
    Errno(i32),
    /// Skip the call; it returns this value.
    Return(i64),
}

/// The listening end of a notify filter, owned by the shim. Poll its fd for
/// `POLLIN` before [`Listener::recv`] (which blocks otherwise); `POLLHUP`
/// means no process uses the filter any more.
pub struct Listener {
    fd: OwnedFd,
}

/// `SECCOMP_GET_NOTIF_SIZES`, asked once per process.
fn notif_sizes() -> io::Result<libc::seccomp_notif_sizes> {
    static SIZES: OnceLock<std::result::Result<(u16, u16, u16), i32>> = OnceLock::new();
    let got = SIZES.get_or_init(|| {
        let mut s = libc::seccomp_notif_sizes { seccomp_notif: 0, seccomp_notif_resp: 0, seccomp_data: 0 };
        // SAFETY: the kernel writes a `struct seccomp_notif_sizes` into `s`.
        let r = unsafe { libc::syscall(libc::SYS_seccomp, libc::SECCOMP_GET_NOTIF_SIZES, 0, &mut s as *mut libc::seccomp_notif_sizes) };
        if r < 0 {
            Err(io::Error::last_os_error().raw_os_error().unwrap_or(libc::ENOSYS))
        } else {
            Ok((s.seccomp_notif, s.seccomp_notif_resp, s.seccomp_data))
        }
    });
    match *got {
        Ok((seccomp_notif, seccomp_notif_resp, seccomp_data)) => Ok(libc::seccomp_notif_sizes { seccomp_notif, seccomp_notif_resp, seccomp_data }),
        Err(e) => Err(io::Error::from_raw_os_error(e)),
    }
}

fn retry_eintr(mut f: impl FnMut() -> libc::c_int) -> io::Result<libc::c_int> {
    loop {
        let r = f();
        if r >= 0 {
            return Ok(r);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

impl Listener {
    /// Wrap a listener fd from [`install_with_listener`]. Fails if the
    /// kernel's notification structures are smaller than ours (we would
    /// read fields it does not fill) or larger than we leave room for.
    pub fn new(fd: OwnedFd) -> io::Result<Listener> {
        let sizes = notif_sizes()?;
        let room = NOTIF_BUF_WORDS * 8;
        let fits = |kernel: u16, ours: usize| (ours..=room).contains(&usize::from(kernel));
        if !fits(sizes.seccomp_notif, std::mem::size_of::<libc::seccomp_notif>())
            || !fits(sizes.seccomp_notif_resp, std::mem::size_of::<libc::seccomp_notif_resp>())
            || !fits(sizes.seccomp_data, std::mem::size_of::<libc::seccomp_data>())
        {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("kernel seccomp notification sizes {}/{}/{} do not fit ours", sizes.seccomp_notif, sizes.seccomp_notif_resp, sizes.seccomp_data),
            ));
        }
        Ok(Listener { fd })
    }

    /// Read the next notification (`SECCOMP_IOCTL_NOTIF_RECV`). Blocks if
    /// none is pending. `ENOENT`: the caller gave up (a signal interrupted
    /// it) between `poll` and now; there is nothing to answer.
    pub fn recv(&self) -> io::Result<Notification> {
        let mut buf = [0u64; NOTIF_BUF_WORDS];
        // SAFETY: `buf` is zeroed (the kernel insists), 8-byte aligned and
        // larger than the kernel's `struct seccomp_notif` (checked in `new`).
        retry_eintr(|| unsafe { libc::ioctl(self.fd.as_raw_fd(), NOTIF_RECV as _, buf.as_mut_ptr()) })?;
        // SAFETY: the buffer is aligned for and at least as large as
        // `seccomp_notif`, a plain-data struct the kernel has just filled.
        let n: libc::seccomp_notif = unsafe { std::ptr::read(buf.as_ptr().cast()) };
        Ok(Notification { id: n.id, pid: n.pid as i32, nr: n.data.nr as libc::c_long, args: n.data.args })
    }

    /// Answer notification `id` (`SECCOMP_IOCTL_NOTIF_SEND`). A caller that
    /// has died or been interrupted meanwhile (`ENOENT`) is not an error.
    pub fn respond(&self, id: u64, verdict: Verdict) -> io::Result<()> {
        let (val, error, flags) = match verdict {
            Verdict::Continue => (0, 0, libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32),
            Verdict::Errno(e) => (0, -e.abs(), 0),
            Verdict::Return(v) => (v, 0, 0),
        };
        let mut buf = [0u64; NOTIF_BUF_WORDS];
        // SAFETY: `buf` is aligned and large enough for `seccomp_notif_resp`.
        unsafe { std::ptr::write(buf.as_mut_ptr().cast(), libc::seccomp_notif_resp { id, val, error, flags }) };
        // SAFETY: the kernel reads its `struct seccomp_notif_resp` from the
        // buffer, which is at least that large and zero past our fields.
        match retry_eintr(|| unsafe { libc::ioctl(self.fd.as_raw_fd(), NOTIF_SEND as _, buf.as_ptr()) }) {
            Ok(_) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Whether notification `id` is still pending (its caller still waits),
    /// `SECCOMP_IOCTL_NOTIF_ID_VALID`.
    pub fn id_valid(&self, id: u64) -> io::Result<bool> {
        // SAFETY: the kernel reads one u64 from `&id`.
        match retry_eintr(|| unsafe { libc::ioctl(self.fd.as_raw_fd(), NOTIF_ID_VALID as _, &id as *const u64) }) {
            Ok(_) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Answer notification `id` with a copy of `src` in its caller: the
    /// call returns the new descriptor's number (close-on-exec, the lowest
    /// free one). `SECCOMP_IOCTL_NOTIF_ADDFD` with
    /// `SECCOMP_ADDFD_FLAG_SEND`: the caller's own thread installs it, so
    /// it lands in that process's table and in no other.
    pub fn answer_with_fd(&self, id: u64, src: BorrowedFd<'_>) -> io::Result<i32> {
        let add = libc::seccomp_notif_addfd {
            id,
            flags: libc::SECCOMP_ADDFD_FLAG_SEND as u32,
            srcfd: src.as_raw_fd() as u32,
            newfd: 0,
            newfd_flags: libc::O_CLOEXEC as u32,
        };
        // SAFETY: the kernel reads one `struct seccomp_notif_addfd`.
        retry_eintr(|| unsafe { libc::ioctl(self.fd.as_raw_fd(), NOTIF_ADDFD as _, &add as *const libc::seccomp_notif_addfd) })
    }

    /// A second handle on the same listener (to answer a notification
    /// later, whatever happens to this one).
    pub fn try_clone(&self) -> io::Result<Listener> {
        Ok(Listener { fd: self.fd.try_clone()? })
    }

    /// Receive, vet and answer one notification; call when the fd polls
    /// readable. `Ok(None)`: the caller went away before it could be
    /// answered. A step of a descriptor hand-over from a process of the
    /// family pid namespace is not answered: it comes back as
    /// [`Served::HandOver`] for the shim.
    ///
    /// The caller is looked up by its host pid and only then is the
    /// notification checked to be still pending: a pid is only reused after
    /// its process is gone, and a gone caller's notification is not
    /// pending, so what was read described the caller.
    pub fn serve_one(&self, view: &dyn FamilyView) -> io::Result<Option<Served>> {
        let n = match self.recv() {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(e),
        };
        let caller = view.caller(n.pid);
        if !self.id_valid(n.id)? {
            return Ok(None);
        }
        if let (Some(step), Some(c)) = (HandOver::of(&n), caller.as_ref()) {
            if !c.in_leaf {
                return Ok(Some(Served::HandOver(n, *c, step)));
            }
        }
        let verdict = vet_caller(&n, caller.as_ref(), view);
        self.respond(n.id, verdict)?;
        Ok(Some(Served::Answered(n, verdict)))
    }
}

/// What [`Listener::serve_one`] did with a notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    Answered(Notification, Verdict),
    /// Left pending: a hand-over step of `Caller`, which the shim answers
    /// (with [`Listener::respond`] or [`Listener::answer_with_fd`]).
    HandOver(Notification, Caller, HandOver),
}

/// A step of a fork's descriptor hand-over (docs/architecture.md#processes-and-namespaces). The server
/// gives the shim each fork child's descriptors; the forking REPL forks,
/// then names each child by its pid (`Give`, from its main thread); each
/// child, single-threaded right after `fork(2)`, asks for its own (`Take`),
/// and the shim answers with a socket holding them, copied straight into
/// the child with [`Listener::answer_with_fd`]. The forking REPL never
/// holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandOver {
    /// `ioctl(slot, HANDOVER_TAKE, 0)`: a fork child asks for the
    /// descriptors of fork child `slot`; answered with a socket from which
    /// it receives them, in one message.
    Take { slot: usize },
    /// `ioctl(slot, HANDOVER_GIVE, pid)`: the forking REPL says its child
    /// `pid` (family pid namespace) is fork child `slot`.
    Give { slot: usize, pid: i32 },
}

impl HandOver {
    /// The hand-over step `n` asks for, if it is one (a negative slot is
    /// none: [`vet`] refuses it).
    pub fn of(n: &Notification) -> Option<HandOver> {
        if n.nr != libc::SYS_ioctl {
            return None;
        }
        let slot = usize::try_from(int(n.args[0])).ok()?;
        match n.args[1] as u32 {
            HANDOVER_TAKE => Some(HandOver::Take { slot }),
            HANDOVER_GIVE => Some(HandOver::Give { slot, pid: int(n.args[2]) }),
            _ => None,
        }
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for Listener {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

// ---------------------------------------------------------------------------
// The decision
// ---------------------------------------------------------------------------

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
fn int(arg: u64) -> i32 {
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
/// * `ioctl` (only hand-over requests are notified; [`Listener::serve_one`]
///   leaves those of family processes to the shim): `EPERM`.
/// * anything else (not notified by [`repl_filter`]): `Continue`.
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
/// `SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV` (see [`install_with_listener`]),
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

// ---------------------------------------------------------------------------
// The real view: procfs
// ---------------------------------------------------------------------------

/// The [`FamilyView`] of a running family: targets are read from a procfs
/// mounted for the family pid namespace (see [`mount_family_proc`]), the
/// caller from the host's `/proc`.
///
/// The shim needs, over the family's processes, what reading
/// `/proc/<pid>/ns/mnt` needs (`PTRACE_MODE_READ`: host root with
/// `CAP_SYS_PTRACE`) and what signalling them needs (`CAP_KILL`).
///
/// A process of a member that has unshared its mount namespace
/// (`unshare -m` inside the sandbox) counts as no member's: its REPL can no
/// longer signal it (it fails closed).
#[derive(Debug, Clone)]
pub struct ProcFamilyView {
    family_proc: PathBuf,
    host_proc: PathBuf,
    family_level: usize,
}

impl ProcFamilyView {
    /// `family_proc`: a procfs of the family pid namespace; `family_level`:
    /// index of the family namespace in the `NSpid:` lines of the host
    /// `/proc` (1 when the shim is in the pid namespace that host `/proc`
    /// shows and the family's is its child).
    pub fn new(family_proc: impl Into<PathBuf>, family_level: usize) -> ProcFamilyView {
        ProcFamilyView { family_proc: family_proc.into(), host_proc: PathBuf::from("/proc"), family_level }
    }

    /// As [`ProcFamilyView::new`], with the family level read from the
    /// `NSpid:` line of the family's init (host pid `reaper`), whose last
    /// entry is 1.
    pub fn for_reaper(family_proc: impl Into<PathBuf>, reaper: i32) -> io::Result<ProcFamilyView> {
        let status = fs::read_to_string(format!("/proc/{reaper}/status"))?;
        let nspid = status_ids(&status, "NSpid:").unwrap_or_default();
        match nspid.last() {
            Some(1) if nspid.len() >= 2 => Ok(ProcFamilyView::new(family_proc, nspid.len() - 1)),
            _ => Err(io::Error::new(io::ErrorKind::InvalidInput, format!("process {reaper} is no pid namespace's init"))),
        }
    }

    /// The index of the family pid namespace in the host's `NSpid:` lines.
    pub fn family_level(&self) -> usize {
        self.family_level
    }

    fn open_family(&self, pid: i32) -> io::Result<OwnedFd> {
        nix::fcntl::open(&self.family_proc.join(pid.to_string()), OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(io::Error::from)
    }

    /// The member of the process whose family-procfs directory is `dir`.
    /// Its own `ns/mnt` if it has one; else (its leader has exited) that of
    /// any of its live threads; else, for a zombie, its parent's (the only
    /// process entitled to know about it; signalling a zombie does nothing).
    fn member_at(&self, dir: BorrowedFd<'_>) -> Option<u64> {
        if let Some(m) = ns_inode_at(dir, "ns/mnt") {
            return Some(m);
        }
        let tasks = read_dir_at(dir, "task")?;
        for tid in tasks.iter().filter_map(|n| pid_name(n)) {
            if let Some(m) = ns_inode_at(dir, &format!("task/{tid}/ns/mnt")) {
                return Some(m);
            }
        }
        let status = read_at(dir, "status")?;
        if status_field(&status, "State:").is_some_and(|s| s.starts_with('Z')) {
            let ppid = status_ids(&status, "PPid:")?.first().copied()?;
            if ppid > 0 {
                let parent = self.open_family(ppid).ok()?;
                return ns_inode_at(parent.as_fd(), "ns/mnt");
            }
        }
        None
    }
}

impl FamilyView for ProcFamilyView {
    fn caller(&self, host_pid: i32) -> Option<Caller> {
        if host_pid <= 0 {
            return None;
        }
        let host = self.host_proc.join(host_pid.to_string());
        let status = fs::read_to_string(host.join("status")).ok()?;
        let nspid = status_ids(&status, "NSpid:")?;
        let nstgid = status_ids(&status, "NStgid:")?;
        let tgid = *nstgid.get(self.family_level)?;
        if nspid.len() <= self.family_level {
            return None;
        }
        let member = parse_ns_inode(fs::read_link(host.join("ns/mnt")).ok()?.as_os_str())?;
        let stat = fs::read_to_string(self.family_proc.join(tgid.to_string()).join("stat")).ok()?;
        let pgid = stat_pgid(&stat)?;
        Some(Caller { member, tgid, pgid, in_leaf: nspid.len() > self.family_level + 1 })
    }

    fn member_of(&self, pid: i32) -> Option<u64> {
        if pid <= 0 {
            return None;
        }
        let dir = self.open_family(pid).ok()?;
        self.member_at(dir.as_fd())
    }

    fn processes(&self) -> Vec<FamilyProcess> {
        let Ok(entries) = fs::read_dir(&self.family_proc) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for pid in entries.flatten().filter_map(|e| pid_name(e.file_name().as_bytes())) {
            // A process that vanishes mid-scan is skipped.
            let Ok(dir) = self.open_family(pid) else {
                continue;
            };
            let Some(member) = self.member_at(dir.as_fd()) else {
                continue;
            };
            let Some(pgid) = read_at(dir.as_fd(), "stat").as_deref().and_then(stat_pgid) else {
                continue;
            };
            let Some(nspid) = read_at(dir.as_fd(), "status").as_deref().and_then(|s| status_ids(s, "NSpid:")) else {
                continue;
            };
            let is_init = nspid.len() >= 2 && nspid.last() == Some(&1);
            out.push(FamilyProcess { pid, member, pgid, is_init });
        }
        out
    }

    fn signal(&self, pid: i32, member: u64, sig: i32) -> io::Result<()> {
        let esrch = || io::Error::from_raw_os_error(libc::ESRCH);
        if pid <= 0 {
            return Err(esrch());
        }
        // The directory fd names this process, not its number: a process
        // that has taken the number since the caller's scan has another
        // directory, and this one then fails with ESRCH.
        let dir = self.open_family(pid).map_err(|_| esrch())?;
        if self.member_at(dir.as_fd()) != Some(member) {
            return Err(esrch());
        }
        // SAFETY: a /proc/<pid> directory fd is accepted as a pidfd; a null
        // siginfo means "as kill(2) would".
        let r = unsafe { libc::syscall(libc::SYS_pidfd_send_signal, dir.as_raw_fd(), sig, std::ptr::null::<libc::siginfo_t>(), 0) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

fn pid_name(name: &[u8]) -> Option<i32> {
    std::str::from_utf8(name).ok()?.parse().ok().filter(|p: &i32| *p > 0)
}

/// `mnt:[4026531841]` → 4026531841.
fn parse_ns_inode(link: &OsStr) -> Option<u64> {
    let s = std::str::from_utf8(link.as_bytes()).ok()?;
    let (_, rest) = s.split_once(":[")?;
    rest.strip_suffix(']')?.parse().ok()
}

/// The value of the `key` line of a `/proc/<pid>/status`.
fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status.lines().find_map(|l| l.strip_prefix(key)).map(str::trim)
}

/// The numbers of the `key` line of a `/proc/<pid>/status` (`NSpid:`,
/// `NStgid:`, `PPid:`).
pub(crate) fn status_ids(status: &str, key: &str) -> Option<Vec<i32>> {
    status_field(status, key)?.split_whitespace().map(|n| n.parse().ok()).collect()
}

/// Field 5 (pgrp) of a `/proc/<pid>/stat`. The command name (field 2) is in
/// parentheses and may contain spaces and parentheses, so count from the
/// last `)`: state, ppid, pgrp.
fn stat_pgid(stat: &str) -> Option<i32> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(2)?.parse().ok()
}

fn ns_inode_at(dir: BorrowedFd<'_>, path: &str) -> Option<u64> {
    let link = nix::fcntl::readlinkat(dir, path).ok()?;
    parse_ns_inode(&link)
}

fn read_at(dir: BorrowedFd<'_>, path: &str) -> Option<String> {
    let fd = nix::fcntl::openat(dir, path, OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty()).ok()?;
    io::read_to_string(fs::File::from(fd)).ok()
}

/// The names in directory `path` under `dir`, read through the descriptor
/// (`/proc/self/fd/N/...`) so that it is this process's directory.
fn read_dir_at(dir: BorrowedFd<'_>, path: &str) -> Option<Vec<Vec<u8>>> {
    let entries = fs::read_dir(format!("/proc/self/fd/{}/{path}", dir.as_raw_fd())).ok()?;
    Some(entries.flatten().map(|e| e.file_name().as_bytes().to_vec()).collect())
}

// ---------------------------------------------------------------------------
// The family's procfs
// ---------------------------------------------------------------------------

/// Mount, at `target` in the caller's mount namespace, a procfs whose pid
/// namespace is `pidns` (a procfs shows the pid namespace that is active
/// for the task that mounts it). The caller must be single-threaded, should
/// be in a private mount namespace, and needs `CAP_SYS_ADMIN` over the pid
/// namespace's owning user namespace.
///
/// A child joins `pidns` for its children (`setns(CLONE_NEWPID)`) and
/// forks; the grandchild, now in the namespace, mounts proc
/// (`nosuid,nodev,noexec`). A failure comes back over a pipe as the stage
/// and errno.
pub fn mount_family_proc(pidns: BorrowedFd<'_>, target: &Path) -> Result<()> {
    const SETNS: u8 = 1;
    const FORK: u8 = 2;
    const MOUNT: u8 = 3;

    let target_c =
        std::ffi::CString::new(target.as_os_str().as_bytes()).map_err(|_| Error::Invalid(format!("mount point {} contains a NUL byte", target.display())))?;
    let (err_r, err_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| Error::sys("pipe", e))?;

    /// Report a failure of `stage` from a child and end it. Only raw,
    /// async-signal-safe system calls in the children.
    fn fail(w: RawFd, stage: u8, errno: i32) -> ! {
        let mut msg = [0u8; 5];
        msg[0] = stage;
        msg[1..].copy_from_slice(&errno.to_ne_bytes());
        // SAFETY: write(2) from a local buffer, then _exit: both async-signal-safe.
        unsafe {
            libc::write(w, msg.as_ptr().cast(), msg.len());
            libc::_exit(1)
        }
    }

    // SAFETY: the caller is single-threaded (documented requirement).
    let child = match unsafe { sys::fork_with(0) }.map_err(|e| Error::sys("fork to mount family proc", e))? {
        Forked::Child => {
            let w = err_w.as_raw_fd();
            // SAFETY: setns on a descriptor we were given.
            if unsafe { libc::setns(pidns.as_raw_fd(), libc::CLONE_NEWPID) } != 0 {
                fail(w, SETNS, Errno::last_raw());
            }
            // SAFETY: this child is single-threaded.
            match unsafe { sys::fork_with(0) } {
                Err(e) => fail(w, FORK, e as i32),
                Ok(Forked::Child) => {
                    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
                    // SAFETY: all strings are NUL-terminated and outlive the call.
                    let r = unsafe { libc::mount(c"proc".as_ptr(), target_c.as_ptr(), c"proc".as_ptr(), flags, std::ptr::null()) };
                    if r != 0 {
                        fail(w, MOUNT, Errno::last_raw());
                    }
                    // SAFETY: _exit is async-signal-safe.
                    unsafe { libc::_exit(0) }
                }
                Ok(Forked::Parent(grandchild)) => {
                    let mut status = 0;
                    let code = loop {
                        // SAFETY: waitpid on our own child, writing into a local.
                        let r = unsafe { libc::waitpid(grandchild.as_raw(), &mut status, 0) };
                        if r >= 0 || Errno::last_raw() != libc::EINTR {
                            break if r > 0 && libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { 2 };
                        }
                    };
                    // SAFETY: _exit is async-signal-safe.
                    unsafe { libc::_exit(code) }
                }
            }
        }
        Forked::Parent(child) => child,
    };
    drop(err_w);
    let status = loop {
        match nix::sys::wait::waitpid(child, None) {
            Err(Errno::EINTR) => continue,
            other => break other.map_err(|e| Error::sys("wait for family proc mounter", e))?,
        }
    };
    let mut msg = [0u8; 5];
    let got = nix::unistd::read(&err_r, &mut msg).unwrap_or(0);
    if got == msg.len() {
        let errno = Errno::from_raw(i32::from_ne_bytes([msg[1], msg[2], msg[3], msg[4]]));
        let what = match msg[0] {
            SETNS => "join the family pid namespace",
            FORK => "fork into the family pid namespace",
            _ => "mount the family procfs",
        };
        return Err(Error::sys(what, errno));
    }
    match status {
        nix::sys::wait::WaitStatus::Exited(_, 0) => Ok(()),
        other => Err(Error::Shim(format!("family procfs mounter ended with {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::HashMap;

    // --- ioctl numbers -----------------------------------------------------

    #[test]
    fn ioctl_numbers_match_the_kernel_headers() {
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!(NOTIF_RECV, 0xc050_2100);
            assert_eq!(NOTIF_SEND, 0xc018_2101);
            assert_eq!(NOTIF_ID_VALID, 0x4008_2102);
        }
        assert_eq!(NOTIF_RECV, libc::SECCOMP_IOCTL_NOTIF_RECV);
        assert_eq!(NOTIF_SEND, libc::SECCOMP_IOCTL_NOTIF_SEND);
        assert_eq!(NOTIF_ID_VALID, libc::SECCOMP_IOCTL_NOTIF_ID_VALID);
        assert_eq!(NOTIF_ADDFD, libc::SECCOMP_IOCTL_NOTIF_ADDFD);
        assert_eq!(std::mem::size_of::<libc::seccomp_notif>(), 0x50);
        assert_eq!(std::mem::size_of::<libc::seccomp_notif_resp>(), 0x18);
    }

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

    // --- vet, against a fake family ------------------------------------------

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

    // --- procfs parsing -----------------------------------------------------

    #[test]
    fn parses_procfs() {
        assert_eq!(parse_ns_inode(OsStr::new("mnt:[4026531841]")), Some(4_026_531_841));
        assert_eq!(parse_ns_inode(OsStr::new("mnt:[]")), None);
        assert_eq!(parse_ns_inode(OsStr::new("/dev/null")), None);
        let stat = "1234 (a) b) (c 9) S 1 77 77 0 -1 4194560 100 0 0 0";
        assert_eq!(stat_pgid(stat), Some(77));
        assert_eq!(stat_pgid("12 (x) R 3"), None);
        let status = "Name:\tpython3\nState:\tS (sleeping)\nTgid:\t99\nPPid:\t7\nNStgid:\t99\t12\t1\nNSpid:\t100\t13\t2\n";
        assert_eq!(status_ids(status, "NSpid:"), Some(vec![100, 13, 2]));
        assert_eq!(status_ids(status, "NStgid:"), Some(vec![99, 12, 1]));
        assert_eq!(status_ids(status, "PPid:"), Some(vec![7]));
        assert_eq!(status_field(status, "State:"), Some("S (sleeping)"));
        assert_eq!(status_ids(status, "Nope:"), None);
        assert_eq!(pid_name(b"123"), Some(123));
        assert_eq!(pid_name(b"self"), None);
        assert_eq!(pid_name(b"0"), None);
    }

    #[test]
    fn proc_view_knows_this_process() {
        // Against the host /proc as if it were the family's, level 0.
        let view = ProcFamilyView::new("/proc", 0);
        let me = std::process::id() as i32;
        let mine = view.member_of(me).expect("own member");
        let link = fs::read_link("/proc/self/ns/mnt").unwrap();
        assert_eq!(Some(mine), parse_ns_inode(link.as_os_str()));
        let caller = view.caller(me).expect("caller");
        assert_eq!(caller.member, mine);
        assert_eq!(caller.tgid, me);
        // SAFETY: getpgrp has no preconditions.
        assert_eq!(caller.pgid, unsafe { libc::getpgrp() });
        assert!(view.processes().iter().any(|p| p.pid == me && p.member == mine));
        assert_eq!(view.signal(me, mine, 0).map_err(|e| e.raw_os_error()), Ok(()));
        assert_eq!(view.signal(me, mine + 1, 0).map_err(|e| e.raw_os_error()), Err(Some(libc::ESRCH)));
        assert_eq!(view.member_of(-3), None);
    }
}
