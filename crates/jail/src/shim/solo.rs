//! The REPLs of solo members (docs/state.md): init starts them as its own
//! children, so they are known to the shim by the id of init's spawn, not
//! as children of its own. This is their bookkeeping: which spawn answers
//! which request, and which exit is a REPL's.

use std::collections::HashMap;

/// Spawn ids of REPLs start here, far above the server's command ids.
pub const FIRST_ID: u64 = 1 << 62;

#[derive(Default)]
pub struct SoloRepls {
    issued: u64,
    /// Spawn id → (request to answer, member), until init says it started.
    starting: HashMap<u64, (u64, String)>,
    /// Member → host pid of its running REPL. (One at a time; a restored
    /// member's REPL was spawned by an earlier shim, under an id this one
    /// never issued, so any REPL spawn id of the member's is its.)
    running: HashMap<String, i32>,
}

impl SoloRepls {
    /// A new spawn id for `member`'s REPL, answering `req` once started.
    pub fn start(&mut self, req: u64, member: &str) -> u64 {
        self.issued += 1;
        let id = FIRST_ID + self.issued;
        self.starting.insert(id, (req, member.to_string()));
        id
    }

    /// The request that waits for spawn `id` to start, and its member.
    pub fn started(&mut self, id: u64) -> Option<(u64, String)> {
        self.starting.remove(&id)
    }

    pub fn running(&mut self, member: &str, host_pid: i32) {
        self.running.insert(member.to_string(), host_pid);
    }

    /// Spawn `id` of `member` ended: the REPL's host pid, if it was its REPL.
    pub fn exited(&mut self, member: &str, id: u64) -> Option<i32> {
        if id < FIRST_ID {
            return None;
        }
        self.running.remove(member)
    }

    /// The host pid of `member`'s running REPL.
    pub fn of(&self, member: &str) -> Option<i32> {
        self.running.get(member).copied()
    }

    /// Forget every REPL of `member` (destroyed, or its init died); the
    /// host pid of the one that ran.
    pub fn forget_member(&mut self, member: &str) -> Option<i32> {
        self.starting.retain(|_, (_, m)| m != member);
        self.running.remove(member)
    }
}

/// The REPL among the children of the solo member's init (host pid
/// `init`): the one whose fd 3 is a socket (commands have nothing above
/// fd 2).
pub fn repl_child(init: i32) -> Option<i32> {
    super::children_of(init)
        .into_iter()
        .find(|child| std::fs::read_link(format!("/proc/{child}/fd/3")).is_ok_and(|l| l.to_string_lossy().starts_with("socket:")))
}

/// The host pid of the process that is `leaf_pid` in the pid namespace
/// whose init is `init_host_pid` (one of init's children).
pub fn host_pid_of(init_host_pid: i32, leaf_pid: i32) -> Option<i32> {
    super::children_of(init_host_pid).into_iter().find(|child| {
        let status = std::fs::read_to_string(format!("/proc/{child}/status")).unwrap_or_default();
        let nspid = status.lines().find_map(|l| l.strip_prefix("NSpid:"));
        nspid.and_then(|p| p.split_whitespace().last()).and_then(|p| p.parse::<i32>().ok()) == Some(leaf_pid)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repl_is_answered_once_and_its_exit_is_known_until_forgotten() {
        let mut repls = SoloRepls::default();
        let id = repls.start(7, "a");
        assert!(id > FIRST_ID);
        assert_eq!(repls.started(id), Some((7, "a".to_string())));
        assert_eq!(repls.started(id), None);
        repls.running("a", 1234);
        // A command's exit (a small id) is not a REPL's.
        assert_eq!(repls.exited("a", 3), None);
        assert_eq!(repls.exited("a", id), Some(1234));
        assert_eq!(repls.exited("a", id), None);
        // A restored member's REPL: spawned under an id this shim never issued.
        repls.running("b", 99);
        assert_eq!(repls.of("b"), Some(99));
        assert_eq!(repls.exited("b", FIRST_ID + 1000), Some(99));
        repls.running("c", 5);
        assert_eq!(repls.forget_member("c"), Some(5));
        assert_eq!(repls.of("c"), None);
    }
}
