//! Running code in a sandbox: validate, queue behind the sandbox's
//! earlier execs, run in the REPL (or bash), stream the events.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use protocol::{Event, ExecRequest, MAX_CODE_BYTES};
use repl_host::events::EventSink;
use tokio::sync::mpsc;

use crate::error::Error;
use crate::keys::Caller;
use crate::sandbox::{ExecBounds, SandboxEntry};
use crate::state::Service;

/// Events an exec may queue before its reader takes them.
const EVENT_QUEUE: usize = 256;

/// What an exec runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    Python,
    Bash,
}

impl Language {
    pub fn parse(name: Option<&str>) -> Result<Language, Error> {
        match name.unwrap_or("python") {
            "python" => Ok(Language::Python),
            "bash" => Ok(Language::Bash),
            other => Err(Error::Invalid(format!("unknown language `{other}` (use `python` or `bash`)"))),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Bash => "bash",
        }
    }
}

impl Service {
    /// Run `req` in sandbox `id`: its events, ending with `exit`. The exec
    /// runs in its own task, so a reader that goes away does not cancel it
    /// halfway (the REPL stays consistent); it just stops listening.
    pub async fn exec(&self, caller: &Caller, id: &str, req: ExecRequest) -> Result<mpsc::Receiver<Event>, Error> {
        let entry = self.get(caller, id).await?;
        if req.code.len() > MAX_CODE_BYTES {
            return Err(Error::TooLarge(format!("code is {} bytes; the limit is {MAX_CODE_BYTES}", req.code.len())));
        }
        let language = Language::parse(req.language.as_deref())?;
        let limits = &self.inner.config.limits;
        let timeout = match req.timeout_ms {
            None => limits.default_exec_timeout,
            Some(0) => return Err(Error::Invalid("timeout_ms must be at least 1".into())),
            Some(ms) => Duration::from_millis(ms).min(limits.max_exec_timeout),
        };
        let bounds = ExecBounds { timeout, stop: self.inner.drain.stop_token() };
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        let busy = entry.hold_busy();
        let state = self.clone();
        // It logs under the caller's span.
        let span = tracing::Span::current();
        tokio::spawn(tracing::Instrument::instrument(
            async move {
                // Busy until the exec is over, however it ends.
                let _busy = busy;
                state.run_queued(&entry, language, &req.code, &bounds, EventSink::new(tx, entry.replay.clone())).await;
            },
            span,
        ));
        Ok(rx)
    }

    /// Wait for the sandbox's exec slot, then run `code` unless the sandbox
    /// or the server went meanwhile.
    async fn run_queued(&self, entry: &Arc<SandboxEntry>, language: Language, code: &str, bounds: &ExecBounds, mut sink: EventSink) {
        let started = std::time::Instant::now();
        // A sandbox's network may still be coming up (sandbox/network.rs).
        let network_failed = entry.network.lock().await.failed.take();
        let mut slot = entry.slot.lock().await;
        if let Some(why) = network_failed {
            sink.warning(why).await;
        }
        if let Err(e) = crate::sandbox::freezer::ensure_running(entry).await {
            sink.error(e.to_string(), None, None, None).await;
            sink.exit(1).await;
            return;
        }
        if !entry.lifecycle().can_run() {
            sink.error("the sandbox was destroyed".into(), None, None, None).await;
            sink.exit(1).await;
        } else if bounds.stop.is_cancelled() {
            // Queued behind another exec until after the drain ran out: it
            // never starts.
            crate::sandbox::never_started_for_shutdown(&mut sink).await;
        } else if language == Language::Python {
            entry.run_python(&mut slot, code, bounds, &mut sink).await;
        } else {
            entry.run_bash(&mut slot, code, bounds, &mut sink).await;
        }
        entry.execs.fetch_add(1, Ordering::Relaxed);
        entry.touch();
        self.inner.metrics.observe_exec(language.as_str(), started);
    }

    /// Sandbox `id`'s last events (the replay ring), oldest first.
    pub async fn replay(&self, caller: &Caller, id: &str) -> Result<Vec<Event>, Error> {
        let entry = self.get(caller, id).await?;
        let events = entry.replay.lock().map(|r| r.iter().cloned().collect()).unwrap_or_default();
        Ok(events)
    }
}
