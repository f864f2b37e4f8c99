//! Whether a fork may snapshot its parent's files without freezing it
//! (docs/fork.md, *Snapshotting while the REPL forks*). The freeze is
//! there so that no process of the parent is halfway through a write when
//! its layer is copied; when nothing but the member's init and its idle
//! REPL runs, nothing can be, and the snapshot is taken while the REPL
//! forks instead of before.

use super::*;

/// The descriptor of the REPL's flusher timer (`_TIMER_FD` in repl/repl.py):
/// the one thread a REPL runs besides its main one, waiting on the timer.
const REPL_TIMER_FD: u64 = 7;

impl Sandbox {
    /// When nothing but init and the idle REPL (host pid `repl`) runs in
    /// the member and no command is on its way in: a guard that keeps new
    /// commands out until it is dropped. `None` otherwise: freeze first.
    pub(super) async fn quiet_for_snapshot(&self, repl: i32) -> Option<tokio::sync::OwnedRwLockWriteGuard<()>> {
        let no_spawns = Arc::clone(&self.spawn_gate).write_owned().await;
        if self.paused_now.load(std::sync::atomic::Ordering::SeqCst) || self.spawns_in_flight().await {
            return None;
        }
        let init = self.init_pid().ok()?;
        let repl_thread = |tid: i32| std::fs::read_to_string(format!("/proc/{repl}/task/{tid}/syscall")).ok();
        nothing_else_runs(&self.cgroup.threads(), init, repl, repl_thread).then_some(no_spawns)
    }

    /// Whether a command was asked for whose process init has not yet
    /// said it started (it may appear in the member at any moment).
    async fn spawns_in_flight(&self) -> bool {
        self.shim().commands.lock().await.iter().any(|((member, _), w)| *member == self.id && w.started.is_some())
    }
}

/// Whether `threads` (a member's, from its cgroup) are only its `init`,
/// its REPL's main thread `repl`, and REPL threads waiting on the flusher
/// timer. `repl_thread(tid)`: `/proc/<repl>/task/<tid>/syscall`, `None`
/// when `tid` is not a thread of the REPL.
pub(crate) fn nothing_else_runs(threads: &[i32], init: i32, repl: i32, repl_thread: impl Fn(i32) -> Option<String>) -> bool {
    threads.contains(&repl) && threads.iter().all(|&tid| tid == init || tid == repl || repl_thread(tid).is_some_and(|syscall| waits_on_timer(&syscall)))
}

/// A `/proc/<tid>/syscall` line of a thread blocked in `read(REPL_TIMER_FD, …)`.
fn waits_on_timer(syscall: &str) -> bool {
    let mut fields = syscall.split_whitespace();
    let nr = fields.next().and_then(|f| f.parse::<i64>().ok());
    let fd = fields.next().and_then(|f| u64::from_str_radix(f.trim_start_matches("0x"), 16).ok());
    nr == Some(libc::SYS_read) && fd == Some(REPL_TIMER_FD)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLUSHER: &str = "0 0x7 0x7f3afb8f7ec0 0x8 0x0 0x0 0x0 0x7f3b04b53bd8 0x7f3b0514f72e";

    fn repl_threads(tid: i32) -> Option<String> {
        match tid {
            11 => Some(FLUSHER.to_string()),
            12 => Some("running".to_string()),
            13 => Some("7 0x7f3b04fd09d0 0x1 0xffffffffffffffff 0x0 0x0 0x0 0x7ffeeb289dd8 0x7f3b0514f72e".to_string()),
            _ => None,
        }
    }

    #[test]
    fn init_and_an_idle_repl_with_its_flusher_are_quiet() {
        assert!(nothing_else_runs(&[1, 10, 11], 1, 10, repl_threads));
        assert!(nothing_else_runs(&[10, 1], 1, 10, repl_threads));
    }

    #[test]
    fn another_process_or_a_busy_repl_thread_is_not() {
        // A command (pid 20) running beside the REPL.
        assert!(!nothing_else_runs(&[1, 10, 11, 20], 1, 10, repl_threads));
        // A thread of the REPL that is running, or blocked elsewhere (poll).
        assert!(!nothing_else_runs(&[1, 10, 12], 1, 10, repl_threads));
        assert!(!nothing_else_runs(&[1, 10, 13], 1, 10, repl_threads));
    }

    #[test]
    fn a_repl_outside_the_cgroup_is_not() {
        assert!(!nothing_else_runs(&[1, 11], 1, 10, repl_threads));
        assert!(!nothing_else_runs(&[], 1, 10, repl_threads));
    }

    #[test]
    fn only_a_read_of_the_timer_counts_as_waiting_on_it() {
        assert!(waits_on_timer(FLUSHER));
        assert!(!waits_on_timer("0 0x8 0x7f3afb8f7ec0 0x8 0x0 0x0 0x0 0x0 0x0"));
        assert!(!waits_on_timer("1 0x7 0x7f3afb8f7ec0 0x8 0x0 0x0 0x0 0x0 0x0"));
        assert!(!waits_on_timer("running"));
        assert!(!waits_on_timer(""));
    }
}
