//! The server's caps on sandboxes (`--max-sandboxes`, `--max-memory-mib`):
//! live sandboxes and those being made count alike, so a burst of creates
//! and forks cannot overshoot a cap while each is still being made. Kept
//! in counters beside the registry, so checking needs no lock on it.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::Error;

/// How many sandboxes are registered, and how many are being made.
#[derive(Debug, Default)]
pub struct Capacity {
    live: AtomicUsize,
    creating: AtomicUsize,
}

/// The caps a reservation is checked against.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    pub max_sandboxes: usize,
    pub max_memory_mib: u64,
}

impl Capacity {
    /// Reserve room for `n` sandboxes being made, all or none. `memory_in_use_mib` is asked only
    /// when the count fits (it reads every sandbox's cgroup). The room is
    /// given back when the reservation drops: register what was made first.
    pub fn reserve(&self, n: usize, caps: Caps, memory_in_use_mib: impl FnOnce() -> u64) -> Result<Reserved<'_>, Error> {
        let live = self.live.load(Ordering::SeqCst);
        let creating = self.creating.fetch_add(n, Ordering::SeqCst);
        let reserved = Reserved { capacity: self, n };
        if live + creating + n > caps.max_sandboxes {
            return Err(Error::Capacity(format!(
                "the server's limit of {} live sandboxes is reached ({} live, {n} more requested)",
                caps.max_sandboxes,
                live + creating
            )));
        }
        let used = memory_in_use_mib();
        if used >= caps.max_memory_mib {
            return Err(Error::Capacity(format!(
                "the server's memory limit is reached: sandboxes use {used} MiB of the {} MiB allowed (--max-memory-mib)",
                caps.max_memory_mib
            )));
        }
        Ok(reserved)
    }

    /// `n` sandboxes joined the registry.
    pub fn registered(&self, n: usize) {
        self.live.fetch_add(n, Ordering::SeqCst);
    }

    /// One sandbox left the registry.
    pub fn unregistered(&self) {
        self.live.fetch_sub(1, Ordering::SeqCst);
    }

    /// Sandboxes in the registry now.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }
}

/// Room for sandboxes being made, given back when dropped.
#[derive(Debug)]
pub struct Reserved<'a> {
    capacity: &'a Capacity,
    n: usize,
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        self.capacity.creating.fetch_sub(self.n, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAPS: Caps = Caps { max_sandboxes: 3, max_memory_mib: 1000 };

    fn refused(r: Result<Reserved<'_>, Error>) -> String {
        match r {
            Err(Error::Capacity(m)) => m,
            Err(e) => panic!("refused for another reason: {e}"),
            Ok(_) => panic!("not refused"),
        }
    }

    #[test]
    fn sandboxes_being_made_count_against_the_cap_until_they_drop() {
        let c = Capacity::default();
        let held: Vec<_> = (0..3).map(|_| c.reserve(1, CAPS, || 0).expect("room")).collect();
        let why = refused(c.reserve(1, CAPS, || 0));
        assert_eq!(why, "the server's limit of 3 live sandboxes is reached (3 live, 1 more requested)");
        drop(held);
        c.reserve(1, CAPS, || 0).expect("room again once the reservations dropped");
    }

    #[test]
    fn registered_sandboxes_count_until_unregistered() {
        let c = Capacity::default();
        c.registered(3);
        assert_eq!(c.live(), 3);
        refused(c.reserve(1, CAPS, || 0));
        c.unregistered();
        c.reserve(1, CAPS, || 0).expect("room after one left");
    }

    #[test]
    fn a_fork_of_n_is_all_or_none_at_the_edge() {
        let c = Capacity::default();
        c.registered(1);
        refused(c.reserve(3, CAPS, || 0));
        let two = c.reserve(2, CAPS, || 0).expect("exactly the room left");
        refused(c.reserve(1, CAPS, || 0));
        drop(two);
        // A refusal gave its room back too.
        c.reserve(2, CAPS, || 0).expect("room after the refusals");
    }

    #[test]
    fn memory_at_the_cap_refuses_and_below_it_does_not() {
        let c = Capacity::default();
        c.reserve(1, CAPS, || 999).expect("below the cap");
        let why = refused(c.reserve(1, CAPS, || 1000));
        assert!(why.contains("sandboxes use 1000 MiB of the 1000 MiB allowed"), "{why}");
    }

    #[test]
    fn memory_is_not_read_when_the_count_already_refuses() {
        let c = Capacity::default();
        c.registered(3);
        refused(c.reserve(1, CAPS, || panic!("read the cgroups for a refused create")));
    }
}
