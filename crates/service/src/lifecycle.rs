//! Where a sandbox is in its life, and what each state allows.
//!
//! ```text
//!            hold_busy            drop the last Busy
//!   Ready ───────────────▶ Running ─────────────────▶ Ready
//!     │  ▲                    │
//!     │  │ resume             │ (an exec, fork, freeze or save waiting on a
//!     ▼  │                    │  paused sandbox resumes it first)
//!   Paused                    │
//!     │                       │
//!     └──────────┬────────────┘
//!                ▼ mark_destroyed (destroy, merge, freeze): one way
//!            Destroyed
//! ```
//!
//! The state is read from three facts kept where they are true: the
//! one-way destroyed mark, the engine's freezer, and the busy count that
//! only a `sandbox::Busy` guard moves. Running wins over paused: work on a
//! paused sandbox resumes it (or, for a freeze or save, pauses it itself
//! while it copies), and nothing may pause or idle it out meanwhile.

/// A sandbox's state, as `GET /v1/sandboxes/{id}` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    Ready,
    Running,
    Paused,
    Destroyed,
}

impl Lifecycle {
    pub fn of(destroyed: bool, paused: bool, busy: bool) -> Lifecycle {
        match (destroyed, paused, busy) {
            (true, _, _) => Lifecycle::Destroyed,
            (false, _, true) => Lifecycle::Running,
            (false, true, false) => Lifecycle::Paused,
            (false, false, false) => Lifecycle::Ready,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Lifecycle::Ready => "ready",
            Lifecycle::Running => "running",
            Lifecycle::Paused => "paused",
            Lifecycle::Destroyed => "destroyed",
        }
    }

    /// An exec, fork, checkpoint, freeze or save may start: a paused
    /// sandbox is resumed for it, a running one queues it.
    pub fn can_run(self) -> bool {
        self != Lifecycle::Destroyed
    }

    /// Pause only when nothing runs or waits: it would stall mid-call.
    pub fn can_pause(self) -> bool {
        self == Lifecycle::Ready
    }

    /// The idle timer may act on it (pause, freeze or destroy it at its
    /// idle timeout): not while work runs or waits, not twice.
    pub fn can_idle_out(self) -> bool {
        matches!(self, Lifecycle::Ready | Lifecycle::Paused)
    }
}

#[cfg(test)]
mod tests {
    use super::Lifecycle::{self, *};

    /// Every combination of the three facts, and what it allows.
    #[test]
    fn each_state_allows_exactly_its_transitions() {
        // (destroyed, paused, busy) -> (state, can_run, can_pause, can_idle_out)
        let table = [
            ((false, false, false), (Ready, true, true, true)),
            ((false, false, true), (Running, true, false, false)),
            ((false, true, false), (Paused, true, false, true)),
            ((false, true, true), (Running, true, false, false)),
            ((true, false, false), (Destroyed, false, false, false)),
            ((true, false, true), (Destroyed, false, false, false)),
            ((true, true, false), (Destroyed, false, false, false)),
            ((true, true, true), (Destroyed, false, false, false)),
        ];
        for ((destroyed, paused, busy), (state, run, pause, idle)) in table {
            let s = Lifecycle::of(destroyed, paused, busy);
            assert_eq!(s, state, "{destroyed} {paused} {busy}");
            assert_eq!((s.can_run(), s.can_pause(), s.can_idle_out()), (run, pause, idle), "{s:?}");
        }
    }

    #[test]
    fn the_names_are_the_apis() {
        assert_eq!([Ready, Running, Paused, Destroyed].map(Lifecycle::as_str), ["ready", "running", "paused", "destroyed"]);
    }
}
