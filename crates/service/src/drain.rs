//! Graceful shutdown's state. On SIGTERM the server first refuses new
//! requests with 503, lets the execs already running finish for up to
//! `--drain-seconds`, then interrupts what is left (each such exec ends
//! with a `ServerShutdown` error event rather than a cut stream), and only
//! then tears the sandboxes down (`Service::drain`, start.rs).

use std::sync::atomic::{AtomicBool, Ordering};

use tokio_util::sync::CancellationToken;

pub use crate::sandbox::SHUTDOWN_EXIT;

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

    /// New work is refused from now on.
    pub fn begin(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// The drain time is up: running execs stop.
    pub fn stop_now(&self) {
        self.stop.cancel();
    }
}
