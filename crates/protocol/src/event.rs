//! The NDJSON events of `exec` and `replay`.
//!
//! `stdout`/`stderr` events carry one line without its newline in `data` (the
//! podflare SDK joins them with `\n`); `nl` says whether the line ended with a
//! newline, so our own SDKs rebuild the exact bytes. Undecodable bytes travel
//! in `b64` as well. An exec asked for `output: "chunks"` gets the lines that
//! arrived together in one event instead, counted in `lines`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    Stdout,
    Stderr,
    /// The value of the last expression: `data` is its `text/plain` repr,
    /// `bundle` the MIME bundle.
    Result,
    /// Rich output (`display()`, a matplotlib figure): `data` is its
    /// `text/plain` (or null), `bundle` the MIME bundle.
    Display,
    /// A structured error: `data` is a message; `ename`/`evalue`/`traceback`
    /// when it comes from Python.
    Error,
    /// Something the caller should know that is not an error (e.g. state lost).
    Warning,
    /// Always last: `data` is the exit code.
    Exit,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Event {
    #[serde(rename = "type")]
    pub kind: EventKind,
    #[schema(value_type = Object)]
    pub data: serde_json::Value,
    /// Position in this exec's stream, from 0.
    pub seq: u64,
    /// Unix milliseconds.
    pub ts: u64,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub nl: Option<bool>,
    /// A `chunks` event holding more than one line: how many (`data` joins
    /// them with `\n`; the next event's `seq` is this one's plus `lines`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub lines: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub b64: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    #[schema(value_type = Option<Object>)]
    pub bundle: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub ename: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub evalue: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub traceback: Option<Vec<String>>,
}

impl Event {
    pub fn new(kind: EventKind, data: serde_json::Value) -> Event {
        Event { kind, data, seq: 0, ts: 0, nl: None, lines: None, b64: None, bundle: None, ename: None, evalue: None, traceback: None }
    }
}
