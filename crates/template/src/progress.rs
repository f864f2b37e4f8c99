//! Build progress reporting: the trait the builder talks to, and two implementations.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// Receives build progress. Totals are estimates: the builder learns how many
/// packages it installs only while it runs, and refines them via `set_total`.
pub trait Progress: Sync {
    /// A template build starts with roughly `total_steps` steps.
    fn begin(&self, template: &str, total_steps: u64);
    /// `steps` more steps are done; `message` says what is happening now.
    fn advance(&self, steps: u64, message: &str);
    /// What is happening now, without finishing a step.
    fn message(&self, message: &str);
    /// The build of `template` is complete.
    fn finish(&self, template: &str);
    /// The estimate of total steps changed.
    fn set_total(&self, _total_steps: u64) {}
}

/// Ignores all progress.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn begin(&self, _template: &str, _total_steps: u64) {}
    fn advance(&self, _steps: u64, _message: &str) {}
    fn message(&self, _message: &str) {}
    fn finish(&self, _template: &str) {}
}

/// A terminal progress bar per template build, for the CLI.
///
/// A unit struct so callers can just pass `&BarProgress`; there is one
/// terminal, so the bar lives in a process-wide slot.
#[derive(Debug, Clone, Copy, Default)]
pub struct BarProgress;

static BAR: Mutex<Option<ProgressBar>> = Mutex::new(None);

fn with_bar(f: impl FnOnce(&ProgressBar)) {
    // A panic elsewhere while holding the lock shouldn't silence progress.
    let slot = BAR.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(bar) = slot.as_ref() {
        f(bar);
    }
}

impl Progress for BarProgress {
    fn begin(&self, template: &str, total_steps: u64) {
        let bar = ProgressBar::new(total_steps);
        let style = ProgressStyle::with_template("{prefix:.bold} {elapsed:>4} [{bar:30.cyan/blue}] {pos:>4}/{len:4} {wide_msg}")
            .expect("progress template is valid")
            .progress_chars("=> ");
        bar.set_style(style);
        bar.set_prefix(template.to_string());
        bar.set_message("starting");
        // Keeps the elapsed time ticking through long silent steps.
        bar.enable_steady_tick(Duration::from_millis(200));
        if !std::io::stderr().is_terminal() {
            eprintln!("building template {template}");
        }
        let mut slot = BAR.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = slot.replace(bar) {
            old.abandon();
        }
    }

    fn advance(&self, steps: u64, message: &str) {
        with_bar(|bar| {
            let len = bar.length().unwrap_or(0).max(1);
            let before = bar.position() * 10 / len;
            bar.inc(steps);
            bar.set_message(message.to_string());
            // Without a terminal (CI logs) the bar is hidden: a line per 10%.
            let after = bar.position() * 10 / len;
            if after > before && !std::io::stderr().is_terminal() {
                eprintln!("  {:>3}% {}: {message}", (after * 10).min(99), bar.prefix());
            }
        });
    }

    fn message(&self, message: &str) {
        let slot = BAR.lock().unwrap_or_else(|e| e.into_inner());
        match slot.as_ref() {
            Some(bar) => bar.set_message(message.to_string()),
            // Between builds (e.g. waiting for another builder's lock) there is no bar.
            None => eprintln!("{message}"),
        }
    }

    fn finish(&self, template: &str) {
        let mut slot = BAR.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(bar) = slot.take() {
            let len = bar.length().unwrap_or(0).max(bar.position());
            bar.set_length(len);
            bar.set_position(len);
            bar.finish_with_message("done");
        }
        if !std::io::stderr().is_terminal() {
            eprintln!("built template {template}");
        }
    }

    fn set_total(&self, total_steps: u64) {
        with_bar(|bar| bar.set_length(total_steps));
    }
}

/// Records every progress call as a line (`begin t 5`, `advance 1 msg`,
/// `message m`, `finish t`, `total 9`), for tests and diagnostics.
#[derive(Debug, Default)]
pub struct RecordedProgress(Mutex<Vec<String>>);

impl RecordedProgress {
    /// All calls so far, in order.
    pub fn calls(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn push(&self, line: String) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(line);
    }
}

impl Progress for RecordedProgress {
    fn begin(&self, t: &str, n: u64) {
        self.push(format!("begin {t} {n}"));
    }
    fn advance(&self, n: u64, m: &str) {
        self.push(format!("advance {n} {m}"));
    }
    fn message(&self, m: &str) {
        self.push(format!("message {m}"));
    }
    fn finish(&self, t: &str) {
        self.push(format!("finish {t}"));
    }
    fn set_total(&self, n: u64) {
        self.push(format!("total {n}"));
    }
}
