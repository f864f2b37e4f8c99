//! A fork's descriptor hand-over (docs/architecture.md, docs/fork.md): the shim
//! copies each fork child's descriptors — its namespaces, channels and
//! cgroup files — straight into that child, so the forking REPL, whose
//! other threads run user code, never holds them.
//!
//! 1. Before the fork the server gives the shim, per child (`slot`), the
//!    child's channel ends and cgroup files (`Request::ExpectFork`); the
//!    shim holds the child member's namespaces already.
//! 2. The forking REPL's main thread forks and names the child:
//!    `ioctl(slot, HANDOVER_GIVE, pid)`. Only that thread can: a slot is
//!    keyed by the REPL's host pid, which is its main thread's tid. The
//!    named process must be a child of that very thread, in the family pid
//!    namespace.
//! 3. The child, single-threaded right after `fork(2)`, asks:
//!    `ioctl(slot, HANDOVER_TAKE, 0)`. It must be the process named in
//!    step 2, with one thread. The shim puts the descriptors in one message
//!    on a new socket pair and answers with the receiving end, copied into
//!    the child by `SECCOMP_IOCTL_NOTIF_ADDFD` (which the caller's own
//!    thread installs): the call returns its number, and the child reads
//!    its descriptors from it. One copy into the child, however many
//!    descriptors, and the message is only ever readable there.
//!
//! Steps 2 and 3 come in either order; a take waits (its caller blocked in
//! the call) until the give. Any other take of the slot fails with `EPERM`.
//! A take also waits while the child's member is still being given its
//! root (`Request::RootMember`, answered when its init has moved in): the
//! server has the REPL fork meanwhile, and the child must not join a mount
//! namespace whose root is not its own yet.
//! A named child that dies before it took frees its slot; so does
//! destroying the child's member. Nothing here is kept across a restart of
//! the server: a fork in flight then fails.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use nix::unistd::Pid;

use crate::notify::{Listener, Verdict};
use crate::sys;

use super::member::Member;

/// The fork children waiting for their descriptors, per forking REPL.
#[derive(Default)]
pub struct HandOvers {
    /// Forking REPL (host pid) → slot → what waits for its child.
    forks: HashMap<i32, HashMap<usize, Slot>>,
}

struct Slot {
    /// The child's member (its namespaces are the shim's).
    member: String,
    /// Its control socket, stdout and stderr ends, then cgroup files.
    fds: Vec<OwnedFd>,
    /// The child its parent named: host pid, and a pidfd the shim polls
    /// (a child that dies before it took frees the slot).
    child: Option<(i32, OwnedFd)>,
    /// Takes waiting for the give.
    takes: Vec<Take>,
    /// The named child's take, waiting for its member's root.
    rooting: Option<Take>,
}

struct Take {
    host_pid: i32,
    id: u64,
    listener: Listener,
}

/// Fields of a `/proc/<pid>/status`: host pids, and `NSpid` (its pid in
/// each pid namespace from the host's down).
struct Status {
    tgid: i32,
    ppid: i32,
    threads: i32,
    nspid: Vec<i32>,
}

fn status(host_pid: i32) -> Option<Status> {
    let text = fs::read_to_string(format!("/proc/{host_pid}/status")).ok()?;
    let one = |key: &str| crate::notify::status_ids(&text, key).and_then(|v| v.first().copied());
    Some(Status { tgid: one("Tgid:")?, ppid: one("PPid:")?, threads: one("Threads:")?, nspid: crate::notify::status_ids(&text, "NSpid:")? })
}

/// Host pids of the children of thread `tid` of process `pid` (not of its
/// other threads), oldest first.
fn children_of_thread(pid: i32, tid: i32) -> Vec<i32> {
    let text = fs::read_to_string(format!("/proc/{pid}/task/{tid}/children")).unwrap_or_default();
    text.split_whitespace().filter_map(|p| p.parse().ok()).collect()
}

/// A socket from which one message with `fds` attached can be read (the
/// sending end is closed).
fn bundle(fds: &[BorrowedFd<'_>]) -> std::io::Result<OwnedFd> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let (ours, theirs) = crate::channel::pair().map_err(|e| std::io::Error::other(e.to_string()))?;
    let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let iov = [std::io::IoSlice::new(b"F")];
    sendmsg::<()>(ours.as_raw_fd(), &iov, &[ControlMessage::ScmRights(&raw)], MsgFlags::MSG_NOSIGNAL, None)?;
    Ok(theirs)
}

fn refuse(listener: &Listener, id: u64, errno: i32) {
    let _ = listener.respond(id, Verdict::Errno(errno));
}

/// The family's members as a hand-over needs them: all of them, those
/// still being given their root (name → the `RootMember` request), and
/// hollow ones not yet asked to take one.
pub struct Members<'a> {
    pub all: &'a HashMap<String, Member>,
    pub rooting: &'a HashMap<String, u64>,
    pub unrooted: &'a HashSet<String>,
}

impl Members<'_> {
    /// Whether `member` has no root of its own yet: a child that joined it
    /// now would run in the hollow init's mount namespace.
    fn without_root(&self, member: &str) -> bool {
        self.rooting.contains_key(member) || self.unrooted.contains(member)
    }
}

/// A hand-over `ioctl` waiting for its answer: the listener it came on, its
/// notification and the host tid of the thread that made it.
#[derive(Clone, Copy)]
pub struct Call<'a> {
    pub listener: &'a Listener,
    pub id: u64,
    pub caller: i32,
}

impl Call<'_> {
    fn refuse(self, errno: i32) {
        refuse(self.listener, self.id, errno)
    }
}

impl HandOvers {
    /// Hold `fds` for the child that REPL `parent` forks as `slot` into
    /// `member`; replaces what an earlier fork left in that slot.
    pub fn expect(&mut self, parent: i32, slot: usize, member: String, fds: Vec<OwnedFd>) {
        let old = self.forks.entry(parent).or_default().insert(slot, Slot { member, fds, child: None, takes: Vec::new(), rooting: None });
        if let Some(old) = old {
            old.fail();
        }
    }

    /// `ioctl(slot, HANDOVER_GIVE, pid)`; `family_level`: the index of the
    /// family pid namespace in `NSpid` lines.
    pub fn give(&mut self, call: Call<'_>, slot: usize, pid: i32, family_level: usize, members: &Members<'_>) {
        let caller = call.caller;
        let Some(s) = self.forks.get_mut(&caller).and_then(|f| f.get_mut(&slot)) else {
            return call.refuse(libc::EPERM);
        };
        if s.child.is_some() {
            return call.refuse(libc::EBUSY);
        }
        // The named process: a child of the calling thread (the REPL's main
        // thread), in the family pid namespace (not below), known there as
        // `pid`. Its newest child is listed last: the one just forked.
        let is_it = |host: i32| status(host).is_some_and(|s| s.tgid == host && s.nspid.len() == family_level + 1 && s.nspid.last() == Some(&pid));
        let Some(host) = children_of_thread(caller, caller).into_iter().rev().find(|h| is_it(*h)) else {
            return call.refuse(libc::ESRCH);
        };
        let Ok(pidfd) = sys::pidfd_open(Pid::from_raw(host)) else {
            return call.refuse(libc::ESRCH);
        };
        // The pidfd is of the process checked, not of one that took its pid since.
        if !is_it(host) {
            return call.refuse(libc::ESRCH);
        }
        s.child = Some((host, pidfd));
        let _ = call.listener.respond(call.id, Verdict::Return(0));
        let takes = std::mem::take(&mut s.takes);
        let mut served = false;
        for t in takes {
            let take = Call { listener: &t.listener, id: t.id, caller: t.host_pid };
            if t.host_pid == host && !served {
                served = true;
                self.serve(caller, slot, take, members);
            } else {
                take.refuse(libc::EPERM);
            }
        }
    }

    /// `ioctl(slot, HANDOVER_TAKE, 0)`.
    pub fn take(&mut self, call: Call<'_>, slot: usize, members: &Members<'_>) {
        let caller = call.caller;
        // A fork child is a whole single-threaded process, blocked in this
        // call: it cannot start a thread before it is answered.
        let Some(st) = status(caller).filter(|s| s.tgid == caller && s.threads == 1) else {
            return call.refuse(libc::EPERM);
        };
        let Some(s) = self.forks.get_mut(&st.ppid).and_then(|f| f.get_mut(&slot)) else {
            return call.refuse(libc::EPERM);
        };
        match &s.child {
            Some((host, _)) if *host == caller => self.serve(st.ppid, slot, call, members),
            Some(_) => call.refuse(libc::EPERM),
            None => match call.listener.try_clone() {
                Ok(listener) => s.takes.push(Take { host_pid: caller, id: call.id, listener }),
                Err(_) => call.refuse(libc::EPERM),
            },
        }
    }

    /// Answer the caller of `take` (a fork child waiting in its take) with
    /// a socket holding slot `slot`'s descriptors, and free the slot; or,
    /// while the child's member has no root yet (being rooted, or not yet
    /// asked to be), hold the take until it has one (`rooted`).
    fn serve(&mut self, parent: i32, slot: usize, take: Call<'_>, members: &Members<'_>) {
        if let Some(s) = self.forks.get_mut(&parent).and_then(|f| f.get_mut(&slot)) {
            if members.without_root(&s.member) {
                // Only the named child gets here, and it waits in one call
                // at a time: a take held before is one a signal restarted.
                match take.listener.try_clone() {
                    Ok(listener) => s.rooting = Some(Take { host_pid: take.caller, id: take.id, listener }),
                    Err(_) => take.refuse(libc::EPERM),
                }
                return;
            }
        }
        self.hand_over(parent, slot, take, members.all);
    }

    /// `member` has its root: serve the take that waited for it.
    pub fn rooted(&mut self, member: &str, members: &HashMap<String, Member>) {
        let waiting: Vec<(i32, usize)> = self
            .forks
            .iter()
            .flat_map(|(parent, fork)| fork.iter().filter(|(_, s)| s.member == member && s.rooting.is_some()).map(|(slot, _)| (*parent, *slot)))
            .collect();
        for (parent, slot) in waiting {
            let Some(t) = self.forks.get_mut(&parent).and_then(|f| f.get_mut(&slot)).and_then(|s| s.rooting.take()) else {
                continue;
            };
            self.hand_over(parent, slot, Call { listener: &t.listener, id: t.id, caller: t.host_pid }, members);
        }
    }

    fn hand_over(&mut self, parent: i32, slot: usize, take: Call<'_>, members: &HashMap<String, Member>) {
        let Some(s) = self.remove(parent, slot) else {
            return take.refuse(libc::EPERM);
        };
        let Some(m) = members.get(&s.member) else {
            s.fail();
            return take.refuse(libc::EPERM);
        };
        let ns = &m.ns;
        // In the order of crate::fork_fds::NAMESPACES; the slot's own
        // (channels, then cgroup files) follow.
        let ours = [ns.mnt.as_fd(), ns.net.as_fd(), ns.uts.as_fd(), ns.ipc.as_fd(), ns.pid.as_fd()];
        let all: Vec<BorrowedFd<'_>> = ours.into_iter().chain(s.fds.iter().map(|f| f.as_fd())).collect();
        match bundle(&all) {
            // A caller gone meanwhile fails the copy: nothing to answer.
            Ok(sock) => {
                let _ = take.listener.answer_with_fd(take.id, sock.as_fd());
            }
            Err(e) => take.refuse(e.raw_os_error().unwrap_or(libc::EPERM)),
        }
        s.fail();
    }

    fn remove(&mut self, parent: i32, slot: usize) -> Option<Slot> {
        let fork = self.forks.get_mut(&parent)?;
        let s = fork.remove(&slot);
        if fork.is_empty() {
            self.forks.remove(&parent);
        }
        s
    }

    /// The pidfds of named children that have not taken yet: (parent,
    /// slot, pidfd), polled by the shim.
    pub fn watched(&self) -> Vec<(i32, usize, BorrowedFd<'_>)> {
        let mut out = Vec::new();
        for (parent, fork) in &self.forks {
            for (slot, s) in fork {
                if let Some((_, pidfd)) = &s.child {
                    out.push((*parent, *slot, pidfd.as_fd()));
                }
            }
        }
        out
    }

    /// A named child died before it took: free its slot.
    pub fn child_gone(&mut self, parent: i32, slot: usize) {
        if let Some(s) = self.remove(parent, slot) {
            s.fail();
        }
    }

    /// The member is being destroyed: free the slots of its fork child.
    pub fn forget_member(&mut self, member: &str) {
        for fork in self.forks.values_mut() {
            let gone: Vec<usize> = fork.iter().filter(|(_, s)| s.member == member).map(|(k, _)| *k).collect();
            for k in gone {
                if let Some(s) = fork.remove(&k) {
                    s.fail();
                }
            }
        }
        self.forks.retain(|_, f| !f.is_empty());
    }
}

impl Slot {
    /// Refuse every waiting take; the descriptors close with the slot.
    fn fail(self) {
        for t in self.takes.into_iter().chain(self.rooting) {
            refuse(&t.listener, t.id, libc::EPERM);
        }
    }
}
