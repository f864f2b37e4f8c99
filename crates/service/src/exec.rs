//! Running code in a sandbox: validate, queue behind the sandbox's
//! earlier execs, run in the REPL (or bash), stream the events.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use protocol::{Event, ExecRequest, OutputEvents, MAX_CODE_BYTES};
use repl_host::events::EventSink;
use tokio::sync::mpsc;

use crate::error::Error;
use crate::keys::Caller;
pub use crate::sandbox::contexts::Target;
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
        self.exec_with(caller, id, req, ExecOptions::default()).await
    }

    /// [`Service::exec`] with `options`: another target, environment
    /// variables for this call only, a way to stop it.
    pub async fn exec_with(&self, caller: &Caller, id: &str, req: ExecRequest, options: ExecOptions) -> Result<mpsc::Receiver<Event>, Error> {
        let ExecOptions { target, env, cancel } = options;
        for (k, v) in &env {
            if !is_env_name(k) || v.contains('\0') {
                return Err(Error::Invalid(format!("invalid environment variable `{}`", k.chars().take(64).collect::<String>())));
            }
        }
        let entry = self.get(caller, id).await?;
        if req.code.len() > MAX_CODE_BYTES {
            return Err(Error::TooLarge(format!("code is {} bytes; the limit is {MAX_CODE_BYTES}", req.code.len())));
        }
        let language = Language::parse(req.language.as_deref())?;
        if language != Language::Python && matches!(target, Target::Context(_)) {
            return Err(Error::Invalid("a context runs Python only".into()));
        }
        let limits = &self.inner.config.limits;
        let timeout = match req.timeout_ms {
            None => limits.default_exec_timeout,
            Some(0) => return Err(Error::Invalid("timeout_ms must be at least 1".into())),
            Some(ms) => Duration::from_millis(ms).min(limits.max_exec_timeout),
        };
        let bounds = ExecBounds { timeout, stop: self.inner.drain.stop_token(), cancel };
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        let busy = entry.hold_busy();
        let state = self.clone();
        // It logs under the caller's span.
        let span = tracing::Span::current();
        tokio::spawn(tracing::Instrument::instrument(
            async move {
                // Busy until the exec is over, however it ends.
                let _busy = busy;
                let run = Run { target: &target, language, code: &req.code, env: &env };
                let sink = EventSink::new(tx, entry.replay.clone()).chunked(req.output == OutputEvents::Chunks);
                state.run_queued(&entry, run, &bounds, sink).await;
            },
            span,
        ));
        Ok(rx)
    }

    /// Wait for the sandbox's exec slot, then run `code` unless the sandbox
    /// or the server went meanwhile.
    async fn run_queued(&self, entry: &Arc<SandboxEntry>, run: Run<'_>, bounds: &ExecBounds, mut sink: EventSink) {
        let Run { target, language, code, env } = run;
        let started = std::time::Instant::now();
        // A sandbox's network may still be coming up (sandbox/network.rs).
        let network_failed = entry.network.lock().await.failed.take();
        let mut slot = target.slot(entry).await;
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
        } else if language == Language::Python && env.is_empty() {
            entry.run_python(&mut slot, code, bounds, &mut sink).await;
        } else if language == Language::Python {
            // The call's variables for this call only: set before it, put back after.
            let _ = entry.run_hidden(&mut slot, &env_code(env), ENV_SWAP_TIMEOUT).await;
            entry.run_python(&mut slot, code, bounds, &mut sink).await;
            let _ = entry.run_hidden(&mut slot, RESTORE_ENV, ENV_SWAP_TIMEOUT).await;
        } else {
            let exports: String = env.iter().map(|(k, v)| format!("export {k}={}\n", shell_quote(v))).collect();
            entry.run_bash(&mut slot, &format!("{exports}{code}"), bounds, &mut sink).await;
        }
        entry.execs.fetch_add(1, Ordering::Relaxed);
        entry.touch();
        self.inner.metrics.observe_exec(language.as_str(), started);
    }

    /// Sandbox `id`'s last events (the replay ring), oldest first.
    pub async fn replay(&self, caller: &Caller, id: &str) -> Result<Vec<Event>, Error> {
        let entry = self.get(caller, id).await?;
        let events = entry.replay.lock().map(|r| r.events().cloned().collect()).unwrap_or_default();
        Ok(events)
    }
}

/// How an exec runs beyond its request.
#[derive(Default)]
pub struct ExecOptions {
    pub target: Target,
    /// Environment variables for this call only.
    pub env: Vec<(String, String)>,
    /// Cancel to interrupt the call (its client went away).
    pub cancel: tokio_util::sync::CancellationToken,
}

/// One exec's work, as `run_queued` takes it.
struct Run<'a> {
    target: &'a Target,
    language: Language,
    code: &'a str,
    env: &'a [(String, String)],
}

/// How long setting or restoring a call's environment may take.
const ENV_SWAP_TIMEOUT: Duration = Duration::from_secs(10);

/// Python that sets `env` in the REPL's `os.environ`, keeping what it
/// replaces for [`RESTORE_ENV`].
fn env_code(env: &[(String, String)]) -> String {
    // A JSON string is a Python string literal too.
    let pairs = serde_json::to_string(&serde_json::to_string(env).unwrap_or_else(|_| "[]".into())).unwrap_or_default();
    format!(
        "import os as _fb_os, json as _fb_json\n_fb_env_saved = {{k: _fb_os.environ.get(k) for k, _ in _fb_json.loads({pairs})}}\n_fb_os.environ.update(dict(_fb_json.loads({pairs})))\ndel _fb_os, _fb_json\n"
    )
}

const RESTORE_ENV: &str = "import os as _fb_os\nfor _fb_k, _fb_v in globals().pop('_fb_env_saved', {}).items():\n    _fb_os.environ.pop(_fb_k, None) if _fb_v is None else _fb_os.environ.__setitem__(_fb_k, _fb_v)\ndel _fb_os\n";

/// A shell variable name: a letter or `_`, then letters, digits and `_`.
pub fn is_env_name(k: &str) -> bool {
    let mut chars = k.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_') && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `v` as one single-quoted shell word.
fn shell_quote(v: &str) -> String {
    format!("'{}'", v.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_words_are_quoted() {
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
    }

    #[test]
    fn env_names_are_shell_names() {
        for ok in ["A", "_x", "PATH2"] {
            assert!(is_env_name(ok), "{ok}");
        }
        for bad in ["", "2A", "A B", "A;rm", "A=B", "é"] {
            assert!(!is_env_name(bad), "{bad}");
        }
    }

    #[test]
    fn env_code_is_python_literal_json() {
        let code = env_code(&[("A".into(), "x\"y".into())]);
        assert!(code.contains(r#"_fb_json.loads("[[\"A\",\"x\\\"y\"]]")"#), "{code}");
        assert!(!env_code(&[("A".into(), "\u{1b}".into())]).contains("\\u{"), "JSON escapes, not Rust's");
    }
}
