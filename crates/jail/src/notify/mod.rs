//! Vetting, in the family's supervisor (the shim), the calls by which a REPL
//! could reach the processes of another member of its family (docs/architecture.md#processes-and-namespaces).
//!
//! A member's REPL lives in the family pid namespace P_F and holds
//! capabilities in the family user namespace U_F, like every other member's
//! processes, which all run as uid 0 of U_F. So the kernel would let a REPL
//! signal, renice, re-limit or re-pin any process it can name, and it can
//! name every pid of P_F. The REPL's seccomp filter ([`repl_filter`]) hands
//! those calls to the shim with `SECCOMP_RET_USER_NOTIF`; the shim asks
//! [`vet`](fn@vet) and answers through the [`Listener`]:
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
//!
//! Layout: `filter` builds the REPL's seccomp program, `listener` is the
//! shim's end of it, `vet` decides each notified call against a
//! [`FamilyView`], `procfs` is the real view ([`ProcFamilyView`]) and
//! `family_proc` mounts the procfs it reads ([`mount_family_proc`]).

mod family_proc;
mod filter;
mod listener;
mod procfs;
mod vet;

pub use family_proc::mount_family_proc;
pub use filter::{install_with_listener, repl_filter, socket_filter};
pub use listener::{HandOver, Listener, Notification, Served, Verdict};
pub(crate) use procfs::status_ids;
pub use procfs::ProcFamilyView;
pub use vet::{vet, vet_caller, Caller, FamilyProcess, FamilyView};

/// `fcntl` commands that name the process to receive `SIGIO`/`SIGURG`.
const F_SETOWN: i32 = libc::F_SETOWN;
const F_SETOWN_EX: i32 = 15;
/// `ioctl` requests by which a fork child takes its descriptors and its
/// parent REPL names the child that may ([`HandOver`], docs/architecture.md#processes-and-namespaces).
/// Direction "none" with a nonzero size: an encoding the kernel's `_IO*`
/// macros never produce, so no driver's request is taken over.
pub const HANDOVER_TAKE: u32 = 0x0046_4201;
pub const HANDOVER_GIVE: u32 = 0x0046_4202;
/// `which` of `setpriority` and of `ioprio_set` for "one process or thread".
const PRIO_PROCESS: i32 = 0;
const IOPRIO_WHO_PROCESS: i32 = 1;
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
