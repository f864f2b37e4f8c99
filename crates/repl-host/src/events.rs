//! `EventSink`: turns an exec's output into the NDJSON events of the API.
//! It numbers events, stamps them, cuts stdout/stderr into lines (the
//! podflare SDK joins `data` with `\n`; `nl` keeps the exact bytes for ours),
//! sends them to the HTTP response and records them for `replay`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use protocol::{Event, EventKind};
use serde_json::json;
use tokio::sync::mpsc;

/// Events kept per sandbox for `replay`.
pub const REPLAY_EVENTS: usize = 1000;
/// A line longer than this is sent in pieces (with `nl: false`).
const MAX_LINE: usize = 64 * 1024;
/// `replay` keeps the bundles of only this many most recent events; older
/// `result`/`display` events keep their `data`, cut to `MAX_LINE` bytes.
pub const REPLAY_BUNDLES: usize = 16;

pub type Replay = Arc<Mutex<VecDeque<Event>>>;

pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

pub struct EventSink {
    seq: u64,
    out: Option<mpsc::Sender<Event>>,
    replay: Replay,
    stdout: LineBuffer,
    stderr: LineBuffer,
}

impl EventSink {
    pub fn new(out: mpsc::Sender<Event>, replay: Replay) -> EventSink {
        EventSink { seq: 0, out: Some(out), replay, stdout: LineBuffer::default(), stderr: LineBuffer::default() }
    }

    pub async fn emit(&mut self, mut ev: Event) {
        ev.seq = self.seq;
        ev.ts = now_ms();
        self.seq += 1;
        if let Ok(mut r) = self.replay.lock() {
            keep_for_replay(&mut r, ev.clone());
        }
        if let Some(out) = &self.out {
            // A client that went away stops receiving; the exec goes on.
            if out.send(ev).await.is_err() {
                self.out = None;
            }
        }
    }

    pub async fn stdout(&mut self, bytes: &[u8]) {
        let lines = self.stdout.push(bytes);
        for (line, nl) in lines {
            self.emit(line_event(EventKind::Stdout, &line, nl)).await;
        }
    }

    pub async fn stderr(&mut self, bytes: &[u8]) {
        let lines = self.stderr.push(bytes);
        for (line, nl) in lines {
            self.emit(line_event(EventKind::Stderr, &line, nl)).await;
        }
    }

    /// Emit partial lines left in the buffers (at the end of an exec).
    pub async fn flush(&mut self) {
        if let Some(rest) = self.stdout.take() {
            self.emit(line_event(EventKind::Stdout, &rest, false)).await;
        }
        if let Some(rest) = self.stderr.take() {
            self.emit(line_event(EventKind::Stderr, &rest, false)).await;
        }
    }

    /// The value of the last expression.
    pub async fn result(&mut self, bundle: serde_json::Value) {
        self.emit(bundle_event(EventKind::Result, bundle)).await;
    }

    /// Rich output: `display()`, a figure.
    pub async fn display(&mut self, bundle: serde_json::Value) {
        self.emit(bundle_event(EventKind::Display, bundle)).await;
    }

    pub async fn error(&mut self, message: String, ename: Option<String>, evalue: Option<String>, traceback: Option<Vec<String>>) {
        let mut ev = Event::new(EventKind::Error, json!(message));
        ev.ename = ename;
        ev.evalue = evalue;
        ev.traceback = traceback;
        self.emit(ev).await;
    }

    pub async fn warning(&mut self, message: String) {
        self.emit(Event::new(EventKind::Warning, json!(message))).await;
    }

    pub async fn exit(&mut self, code: i32) {
        self.flush().await;
        self.emit(Event::new(EventKind::Exit, json!(code))).await;
    }
}

/// `data` is the bundle's `text/plain` (null without one).
fn bundle_event(kind: EventKind, bundle: serde_json::Value) -> Event {
    let text = bundle.get("text/plain").cloned().unwrap_or(serde_json::Value::Null);
    let mut ev = Event::new(kind, text);
    ev.bundle = Some(bundle);
    ev
}

/// Append `ev` to a sandbox's replay: at most `REPLAY_EVENTS` events, of
/// which at most `REPLAY_BUNDLES` keep a bundle (images are big).
fn keep_for_replay(r: &mut VecDeque<Event>, ev: Event) {
    if r.len() == REPLAY_EVENTS {
        r.pop_front();
    }
    if ev.bundle.is_some() {
        if let Some(old) = r.iter_mut().rev().filter(|e| e.bundle.is_some()).nth(REPLAY_BUNDLES - 1) {
            old.bundle = None;
            if let Some(text) = old.data.as_str().filter(|t| t.len() > MAX_LINE) {
                let cut = (0..=MAX_LINE).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
                old.data = json!(text[..cut]);
            }
        }
    }
    r.push_back(ev);
}

fn line_event(kind: EventKind, bytes: &[u8], nl: bool) -> Event {
    let mut ev = match std::str::from_utf8(bytes) {
        Ok(s) => Event::new(kind, json!(s)),
        Err(_) => {
            let mut ev = Event::new(kind, json!(String::from_utf8_lossy(bytes)));
            ev.b64 = Some(base64::engine::general_purpose::STANDARD.encode(bytes));
            ev
        }
    };
    ev.nl = Some(nl);
    ev
}

/// Bytes of one stream not yet cut into lines.
#[derive(Default)]
pub struct LineBuffer {
    pending: Vec<u8>,
}

impl LineBuffer {
    /// Add bytes; return complete lines (without `\n`) and long pieces.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<(Vec<u8>, bool)> {
        self.pending.extend_from_slice(bytes);
        let mut out = Vec::new();
        let mut start = 0;
        while let Some(pos) = self.pending[start..].iter().position(|b| *b == b'\n') {
            out.push((self.pending[start..start + pos].to_vec(), true));
            start += pos + 1;
        }
        self.pending.drain(..start);
        while self.pending.len() > MAX_LINE {
            let cut = utf8_boundary(&self.pending, MAX_LINE);
            out.push((self.pending.drain(..cut).collect(), false));
        }
        out
    }

    pub fn take(&mut self) -> Option<Vec<u8>> {
        if self.pending.is_empty() {
            None
        } else {
            Some(std::mem::take(&mut self.pending))
        }
    }
}

/// The largest cut ≤ `max` that does not split a UTF-8 character (or `max`
/// when the bytes are not UTF-8 there anyway).
fn utf8_boundary(bytes: &[u8], max: usize) -> usize {
    (max.saturating_sub(3)..=max).rev().find(|&i| i < bytes.len() && (bytes[i] & 0xC0) != 0x80).filter(|&i| i > 0).unwrap_or(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_cut_at_newlines_and_partial_lines_wait() {
        let mut b = LineBuffer::default();
        assert_eq!(b.push(b"a\nbc"), vec![(b"a".to_vec(), true)]);
        assert_eq!(b.push(b"d\n\n"), vec![(b"bcd".to_vec(), true), (b"".to_vec(), true)]);
        assert_eq!(b.push(b"tail"), vec![]);
        assert_eq!(b.take(), Some(b"tail".to_vec()));
        assert_eq!(b.take(), None);
    }

    #[test]
    fn replay_keeps_the_bundles_of_the_newest_events_only() {
        let mut r = VecDeque::new();
        let big = "é".repeat(MAX_LINE); // 2 bytes each
        for i in 0..REPLAY_BUNDLES {
            keep_for_replay(&mut r, bundle_event(EventKind::Display, json!({"text/plain": format!("{i}{big}"), "image/png": "AAAA"})));
            keep_for_replay(&mut r, Event::new(EventKind::Stdout, json!("line")));
        }
        assert!(r.iter().filter(|e| e.kind == EventKind::Display).all(|e| e.bundle.is_some()));
        keep_for_replay(&mut r, bundle_event(EventKind::Result, json!({"text/plain": "x"})));
        let first = &r[0];
        assert_eq!(first.bundle, None);
        let data = first.data.as_str().unwrap();
        assert!(data.starts_with("0é") && data.len() <= MAX_LINE && data.len() > MAX_LINE - 4, "{}", data.len());
        assert_eq!(r.iter().filter(|e| e.bundle.is_some()).count(), REPLAY_BUNDLES);
        assert_eq!(r[2].bundle.as_ref().unwrap()["image/png"], "AAAA");
        assert_eq!(r.back().unwrap().data, "x");
    }

    #[test]
    fn replay_holds_at_most_its_number_of_events() {
        let mut r = VecDeque::new();
        for i in 0..REPLAY_EVENTS + 5 {
            keep_for_replay(&mut r, Event::new(EventKind::Stdout, json!(i)));
        }
        assert_eq!(r.len(), REPLAY_EVENTS);
        assert_eq!(r[0].data, 5);
    }

    #[test]
    fn long_lines_are_split_on_character_boundaries() {
        let mut b = LineBuffer::default();
        let text = "é".repeat(MAX_LINE); // 2 bytes each
        let parts = b.push(text.as_bytes());
        assert!(!parts.is_empty());
        for (p, nl) in &parts {
            assert!(!nl);
            assert!(std::str::from_utf8(p).is_ok());
        }
    }
}
