//! Step counting on top of a `Progress`, keeping the estimated total honest.

use crate::progress::Progress;

/// Longest message passed on; a progress line has room for little more.
const MAX_MESSAGE: usize = 100;

pub(crate) struct Steps<'a> {
    progress: &'a dyn Progress,
    done: u64,
    total: u64,
}

impl<'a> Steps<'a> {
    pub(crate) fn begin(progress: &'a dyn Progress, template: &str, total: u64) -> Steps<'a> {
        progress.begin(template, total);
        Steps { progress, done: 0, total }
    }

    pub(crate) fn advance(&mut self, message: &str) {
        self.done += 1;
        if self.done > self.total {
            self.set_total(self.done);
        }
        self.progress.advance(1, short(message));
    }

    pub(crate) fn message(&mut self, message: &str) {
        self.progress.message(short(message));
    }

    /// New estimate: `remaining` more steps after the ones already done.
    pub(crate) fn remaining(&mut self, remaining: u64) {
        self.set_total(self.done + remaining);
    }

    fn set_total(&mut self, total: u64) {
        if total != self.total {
            self.total = total;
            self.progress.set_total(total);
        }
    }
}

fn short(message: &str) -> &str {
    let message = message.trim();
    match message.char_indices().nth(MAX_MESSAGE) {
        Some((cut, _)) => &message[..cut],
        None => message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn total_grows_when_the_estimate_was_low_and_is_refined() {
        let rec = crate::RecordedProgress::default();
        let mut steps = Steps::begin(&rec, "t", 1);
        steps.advance("a");
        steps.advance("b");
        steps.remaining(3);
        steps.remaining(3);
        steps.message(&"x".repeat(500));
        let log = rec.calls();
        assert_eq!(log[..5], ["begin t 1", "advance 1 a", "total 2", "advance 1 b", "total 5"]);
        assert_eq!(log.len(), 6, "unchanged total is not re-sent");
        assert_eq!(log[5].len(), "message ".len() + MAX_MESSAGE);
    }
}
