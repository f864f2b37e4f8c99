//! Graceful shutdown. On SIGTERM the server first refuses new requests with
//! 503, lets the execs already running finish for up to `--drain-seconds`,
//! then interrupts what is left (each such exec ends with a `ServerShutdown`
//! error event rather than a cut stream), and only then tears the
//! sandboxes down.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::state::Service;

/// Exit status of an exec the server interrupted because it was shutting
/// down (128 + SIGTERM, as a shell reports a terminated command).
pub const SHUTDOWN_EXIT: i32 = 143;

#[derive(Default)]
pub struct Drain {
    draining: AtomicBool,
    /// Cancelled when the drain time is up: running execs stop.
    stop: CancellationToken,
}

impl Drain {
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// What a running exec watches to stop early.
    pub fn stop_token(&self) -> CancellationToken {
        self.stop.clone()
    }
}

impl Service {
    /// Refuse new work, wait up to `grace` for running execs, then interrupt
    /// the rest and wait for them to report (bounded by their interrupt
    /// grace: an exec that ignores SIGINT has its REPL killed).
    pub async fn drain(&self, grace: Duration) {
        let drain = &self.inner.drain;
        drain.draining.store(true, Ordering::SeqCst);
        let running = self.running_execs().await;
        tracing::info!(running, grace_s = grace.as_secs_f64(), "draining: new requests get 503");
        if self.wait_execs_done(grace).await {
            return;
        }
        let left = self.running_execs().await;
        tracing::warn!(left, "drain time is up: interrupting the execs still running");
        drain.stop.cancel();
        let bound = self.inner.config.limits.interrupt_grace + Duration::from_secs(5);
        if !self.wait_execs_done(bound).await {
            let left = self.running_execs().await;
            tracing::error!(left, "execs still running after they were interrupted");
        }
    }

    async fn wait_execs_done(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.running_execs().await == 0 {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Execs running or queued behind another in their sandbox.
    async fn running_execs(&self) -> u64 {
        self.inner.sandboxes.read().await.values().map(|e| e.busy_count()).sum()
    }
}
