//! `EventSink`: turns an exec's output into the NDJSON events of the API.
//! It numbers events, stamps them, cuts stdout/stderr into lines (the
//! podflare SDK joins `data` with `\n`; `nl` keeps the exact bytes for ours),
//! sends them to the HTTP response and records them for `replay`. A caller
//! that asked for chunks gets the lines of one read in one event: 100,000
//! printed lines cost a few hundred events instead of 100,000.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use protocol::{Event, EventKind};
use serde_json::json;
use tokio::sync::mpsc;

/// Lines kept per sandbox for `replay` (an event of `lines: k` counts `k`).
pub const REPLAY_EVENTS: usize = 1000;
/// A chunk holds at most this many lines, so that `replay`, which keeps
/// whole events, holds at least the last 750 lines...
const CHUNK_LINES: usize = REPLAY_EVENTS / 4;
/// ... and about this many bytes, so that no one event is huge.
const CHUNK_BYTES: usize = 1 << 20;
/// A line longer than this is sent in pieces (with `nl: false`).
const MAX_LINE: usize = 64 * 1024;
/// `replay` keeps the bundles of only this many most recent events; older
/// `result`/`display` events keep their `data`, cut to `MAX_LINE` bytes.
pub const REPLAY_BUNDLES: usize = 16;

pub type Replay = Arc<Mutex<ReplayRing>>;

/// A sandbox's last events, at most `REPLAY_EVENTS` lines of them.
#[derive(Default)]
pub struct ReplayRing {
    events: VecDeque<Event>,
    lines: usize,
}

impl ReplayRing {
    pub fn events(&self) -> impl Iterator<Item = &Event> {
        self.events.iter()
    }
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

pub struct EventSink {
    seq: u64,
    out: Option<mpsc::Sender<Event>>,
    replay: Replay,
    stdout: LineBuffer,
    stderr: LineBuffer,
    chunks: bool,
}

impl EventSink {
    pub fn new(out: mpsc::Sender<Event>, replay: Replay) -> EventSink {
        EventSink { seq: 0, out: Some(out), replay, stdout: LineBuffer::default(), stderr: LineBuffer::default(), chunks: false }
    }

    /// Send the lines of each read together (`output: "chunks"`).
    pub fn chunked(mut self, chunks: bool) -> EventSink {
        self.chunks = chunks;
        self
    }

    pub async fn emit(&mut self, mut ev: Event) {
        ev.seq = self.seq;
        ev.ts = now_ms();
        self.seq += ev.lines.unwrap_or(1);
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
        self.output(EventKind::Stdout, lines).await;
    }

    pub async fn stderr(&mut self, bytes: &[u8]) {
        let lines = self.stderr.push(bytes);
        self.output(EventKind::Stderr, lines).await;
    }

    /// Emit partial lines left in the buffers (at the end of an exec).
    pub async fn flush(&mut self) {
        if let Some(rest) = self.stdout.take() {
            self.output(EventKind::Stdout, vec![(rest, false)]).await;
        }
        if let Some(rest) = self.stderr.take() {
            self.output(EventKind::Stderr, vec![(rest, false)]).await;
        }
    }

    async fn output(&mut self, kind: EventKind, lines: Vec<(Vec<u8>, bool)>) {
        if self.chunks {
            for ev in chunk_events(kind, lines) {
                self.emit(ev).await;
            }
        } else {
            for (line, nl) in lines {
                self.emit(line_event(kind, &line, nl)).await;
            }
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

/// Append `ev` to a sandbox's replay: at most `REPLAY_EVENTS` lines, in
/// events of which at most `REPLAY_BUNDLES` keep a bundle (images are big).
fn keep_for_replay(ring: &mut ReplayRing, ev: Event) {
    let lines = |e: &Event| e.lines.unwrap_or(1) as usize;
    ring.lines += lines(&ev);
    while ring.lines > REPLAY_EVENTS {
        match ring.events.pop_front() {
            Some(old) => ring.lines -= lines(&old),
            None => break,
        }
    }
    let r = &mut ring.events;
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

/// Lines (and pieces of long ones) as `chunks` events: each holds the exact
/// bytes of up to `CHUNK_LINES` of them, `\n`-joined, the last one's newline
/// in `nl` as for a line, so one holding a single line is a line's event.
fn chunk_events(kind: EventKind, lines: Vec<(Vec<u8>, bool)>) -> Vec<Event> {
    let mut events = Vec::new();
    let (mut text, mut count, mut last_nl) = (Vec::new(), 0, false);
    for (line, nl) in lines {
        if count > 0 && last_nl {
            text.push(b'\n');
        }
        text.extend_from_slice(&line);
        count += 1;
        last_nl = nl;
        if count == CHUNK_LINES || text.len() >= CHUNK_BYTES {
            events.push(chunk_event(kind, &std::mem::take(&mut text), count, last_nl));
            count = 0;
        }
    }
    if count > 0 {
        events.push(chunk_event(kind, &text, count, last_nl));
    }
    events
}

fn chunk_event(kind: EventKind, text: &[u8], lines: usize, nl: bool) -> Event {
    let mut ev = line_event(kind, text, nl);
    ev.lines = (lines > 1).then_some(lines as u64);
    ev
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
        let mut r = ReplayRing::default();
        let big = "é".repeat(MAX_LINE); // 2 bytes each
        for i in 0..REPLAY_BUNDLES {
            keep_for_replay(&mut r, bundle_event(EventKind::Display, json!({"text/plain": format!("{i}{big}"), "image/png": "AAAA"})));
            keep_for_replay(&mut r, Event::new(EventKind::Stdout, json!("line")));
        }
        assert!(r.events().filter(|e| e.kind == EventKind::Display).all(|e| e.bundle.is_some()));
        keep_for_replay(&mut r, bundle_event(EventKind::Result, json!({"text/plain": "x"})));
        let first = &r.events[0];
        assert_eq!(first.bundle, None);
        let data = first.data.as_str().unwrap();
        assert!(data.starts_with("0é") && data.len() <= MAX_LINE && data.len() > MAX_LINE - 4, "{}", data.len());
        assert_eq!(r.events().filter(|e| e.bundle.is_some()).count(), REPLAY_BUNDLES);
        assert_eq!(r.events[2].bundle.as_ref().unwrap()["image/png"], "AAAA");
        assert_eq!(r.events.back().unwrap().data, "x");
    }

    #[test]
    fn replay_holds_at_most_its_number_of_events() {
        let mut r = ReplayRing::default();
        for i in 0..REPLAY_EVENTS + 5 {
            keep_for_replay(&mut r, Event::new(EventKind::Stdout, json!(i)));
        }
        assert_eq!(r.events.len(), REPLAY_EVENTS);
        assert_eq!(r.events[0].data, 5);
    }

    /// What a sink sent, read back from its channel.
    async fn sent(chunks: bool, writes: &[&[u8]]) -> (Vec<Event>, Replay) {
        let (tx, mut rx) = mpsc::channel(100_000);
        let replay = Replay::default();
        let mut sink = EventSink::new(tx, replay.clone()).chunked(chunks);
        for w in writes {
            sink.stdout(w).await;
        }
        sink.exit(0).await;
        drop(sink);
        let mut events = Vec::new();
        while let Some(ev) = rx.recv().await {
            events.push(ev);
        }
        (events, replay)
    }

    /// The bytes the events stand for, as our SDKs rebuild them.
    fn text_of(events: &[Event]) -> String {
        let mut out = String::new();
        for ev in events.iter().filter(|e| e.kind == EventKind::Stdout) {
            out.push_str(ev.data.as_str().unwrap());
            if ev.nl == Some(true) {
                out.push('\n');
            }
        }
        out
    }

    #[tokio::test]
    async fn chunks_carry_the_same_bytes_in_fewer_events_numbered_by_line() {
        let writes: Vec<&[u8]> = vec![b"a\nb\nc", b"d\n\ne\n", b"tail"];
        let (lines, _) = sent(false, &writes).await;
        let (chunks, _) = sent(true, &writes).await;
        assert_eq!(text_of(&chunks), "a\nb\ncd\n\ne\ntail");
        assert_eq!(text_of(&chunks), text_of(&lines));
        let out: Vec<_> = chunks.iter().filter(|e| e.kind == EventKind::Stdout).collect();
        assert_eq!(out.len(), 3, "{chunks:?}");
        assert_eq!((out[0].data.as_str(), out[0].lines, out[0].nl), (Some("a\nb"), Some(2), Some(true)));
        assert_eq!((out[1].data.as_str(), out[1].lines, out[1].nl, out[1].seq), (Some("cd\n\ne"), Some(3), Some(true), 2));
        assert_eq!((out[2].data.as_str(), out[2].lines, out[2].nl), (Some("tail"), None, Some(false)));
        // Sequence numbers count lines, so both ways end on the same one.
        assert_eq!(out[2].seq, 5);
        assert_eq!(chunks.last().unwrap().seq, lines.last().unwrap().seq);
    }

    #[tokio::test]
    async fn a_chunk_holds_at_most_its_lines_and_replay_at_most_its_lines() {
        let many: String = (0..2500).map(|i| format!("{i}\n")).collect();
        let (chunks, replay) = sent(true, &[many.as_bytes()]).await;
        let out: Vec<_> = chunks.iter().filter(|e| e.kind == EventKind::Stdout).collect();
        assert_eq!(out.iter().map(|e| e.lines.unwrap_or(1)).collect::<Vec<_>>(), [vec![250; 10]].concat());
        assert_eq!(text_of(&chunks), many);
        let ring = replay.lock().unwrap();
        assert!(ring.lines <= REPLAY_EVENTS);
        let kept: Vec<_> = ring.events().collect();
        assert_eq!(kept[0].seq, 1750, "the newest whole chunks are kept");
        assert!(kept[0].data.as_str().unwrap().starts_with("1750\n"));
        assert!(kept[kept.len() - 2].data.as_str().unwrap().ends_with("\n2499"));
        assert_eq!(kept.last().unwrap().kind, EventKind::Exit);
    }

    #[tokio::test]
    async fn a_chunk_that_is_not_utf8_comes_whole_in_b64() {
        let (chunks, _) = sent(true, &[b"ok\n\xff\xfe\nend\n"]).await;
        let ev = &chunks[0];
        assert_eq!(ev.lines, Some(3));
        let raw = base64::engine::general_purpose::STANDARD.decode(ev.b64.as_ref().unwrap()).unwrap();
        assert_eq!(raw, b"ok\n\xff\xfe\nend");
    }

    #[tokio::test]
    async fn a_chunk_is_cut_near_its_byte_bound() {
        let line = "x".repeat(1000) + "\n";
        let big = line.repeat(CHUNK_BYTES / 1000 + 10);
        let (chunks, _) = sent(true, &[big.as_bytes()]).await;
        let out: Vec<_> = chunks.iter().filter(|e| e.kind == EventKind::Stdout).collect();
        assert!(out.len() >= 2);
        assert!(out.iter().all(|e| e.data.as_str().unwrap().len() <= CHUNK_BYTES + 1000));
        assert_eq!(text_of(&chunks), big);
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
