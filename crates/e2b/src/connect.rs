//! The Connect protocol with the JSON codec, as the E2B SDKs speak it to
//! envd: unary calls are plain JSON both ways; streams are 5-byte
//! envelopes (flags, big-endian length) of JSON, and a server stream always
//! ends with an end-stream envelope (flag 0x02) that carries its error, if
//! any. No compression, no binary protobuf.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use crate::error::{Code, RpcError};

/// Envelope flag of the stream's last message.
const END_STREAM: u8 = 0x02;
const COMPRESSED: u8 = 0x01;
/// Largest request message (a file's bytes travel over /files, not RPC).
pub const MAX_MESSAGE: usize = 8 << 20;
/// Messages a stream may queue before its producer waits.
const STREAM_QUEUE: usize = 32;

/// One envelope.
pub fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + payload.len());
    b.put_u8(flags);
    b.put_u32(payload.len() as u32);
    b.put_slice(payload);
    b.freeze()
}

/// Decode a unary request's body (plain JSON; empty means all defaults).
pub fn unary<T: DeserializeOwned + Default>(headers: &HeaderMap, body: &[u8]) -> Result<T, RpcError> {
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("application/json");
    if ct.starts_with("application/connect+") {
        // A streaming-framed request to a unary method: take its one message.
        let mut messages = Envelopes::default();
        messages.push(body);
        return match messages.next_message()? {
            Some(m) => parse(&m),
            None => Ok(T::default()),
        };
    }
    if !ct.starts_with("application/json") {
        return Err(RpcError::invalid(format!("only the JSON codec is served (Content-Type: application/json), not `{ct}`")));
    }
    if headers.get("connect-content-encoding").or(headers.get(header::CONTENT_ENCODING)).is_some_and(|v| v != "identity") {
        return Err(RpcError::new(Code::Unimplemented, "compressed requests are not served"));
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    parse(body)
}

pub fn parse<T: DeserializeOwned>(json: &[u8]) -> Result<T, RpcError> {
    serde_json::from_slice(json).map_err(|e| RpcError::invalid(format!("invalid request message: {e}")))
}

/// The messages of an enveloped request body, fed in pieces.
#[derive(Default)]
pub struct Envelopes {
    buf: BytesMut,
}

impl Envelopes {
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next whole message, if one is buffered (the end-stream envelope
    /// of a client stream ends the messages).
    pub fn next_message(&mut self) -> Result<Option<Bytes>, RpcError> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let flags = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_MESSAGE {
            return Err(too_large());
        }
        if flags & COMPRESSED != 0 {
            return Err(RpcError::new(Code::Unimplemented, "compressed messages are not served"));
        }
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        let _ = self.buf.split_to(5);
        let msg = self.buf.split_to(len).freeze();
        if flags & END_STREAM != 0 {
            return Ok(None);
        }
        Ok(Some(msg))
    }
}

fn too_large() -> RpcError {
    RpcError::new(Code::ResourceExhausted, format!("a message is larger than {MAX_MESSAGE} bytes"))
}

/// A unary request's whole body, at most [`MAX_MESSAGE`] bytes.
pub async fn body_bytes(body: Body) -> Result<Bytes, RpcError> {
    let mut stream = body.into_data_stream();
    let mut buf = BytesMut::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| RpcError::invalid(format!("request body: {e}")))?;
        if buf.len() + chunk.len() > MAX_MESSAGE {
            return Err(too_large());
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

/// The first message of a server-streaming call's request.
pub async fn first_message<T: DeserializeOwned + Default>(headers: &HeaderMap, body: Body) -> Result<T, RpcError> {
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if !ct.starts_with("application/connect+json") {
        // Some clients send a stream's request as plain JSON.
        let bytes = body_bytes(body).await?;
        return unary(headers, &bytes);
    }
    let mut stream = body.into_data_stream();
    let mut messages = Envelopes::default();
    loop {
        if let Some(m) = messages.next_message()? {
            return parse(&m);
        }
        match stream.next().await {
            Some(Ok(chunk)) => messages.push(&chunk),
            Some(Err(e)) => return Err(RpcError::invalid(format!("request body: {e}"))),
            None => return Ok(T::default()),
        }
    }
}

/// The sending side of a server stream: messages, then one end.
pub struct StreamWriter {
    tx: mpsc::Sender<Bytes>,
}

impl StreamWriter {
    /// Send one message; false once the client has gone.
    pub async fn send(&self, message: &serde_json::Value) -> bool {
        let json = serde_json::to_vec(message).unwrap_or_default();
        self.tx.send(envelope(0, &json)).await.is_ok()
    }

    /// End the stream, with `error` if it failed.
    pub async fn end(self, error: Option<RpcError>) {
        let end = match error {
            Some(e) => serde_json::json!({"error": e.json()}),
            None => serde_json::json!({}),
        };
        let _ = self.tx.send(envelope(END_STREAM, &serde_json::to_vec(&end).unwrap_or_default())).await;
    }

    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Resolves when the client has gone.
    pub async fn closed(&self) {
        self.tx.closed().await
    }
}

/// A streaming response (200, `application/connect+json`) and its writer.
/// Each message is flushed as it is sent.
pub fn stream() -> (Response, StreamWriter) {
    let (tx, rx) = mpsc::channel::<Bytes>(STREAM_QUEUE);
    let body = tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, Infallible>);
    let resp = Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/connect+json")
        .header(header::CACHE_CONTROL, "no-store")
        .body(Body::from_stream(body))
        .unwrap_or_default();
    (resp, StreamWriter { tx })
}

/// A stream that fails before its first message: 200 and one end frame,
/// which is how the JS client reads a stream's error.
pub async fn failed_stream(error: RpcError) -> Response {
    let (resp, writer) = stream();
    writer.end(Some(error)).await;
    resp
}

/// The call's deadline from `Connect-Timeout-Ms` (None: no deadline).
pub fn timeout(headers: &HeaderMap) -> Result<Option<Duration>, RpcError> {
    match headers.get("connect-timeout-ms").map(|v| v.to_str().unwrap_or("")) {
        None => Ok(None),
        Some(v) => match v.trim().parse::<u64>() {
            Ok(0) => Ok(None),
            Ok(ms) if v.len() <= 10 => Ok(Some(Duration::from_millis(ms))),
            _ => Err(RpcError::invalid(format!("invalid Connect-Timeout-Ms `{v}`"))),
        },
    }
}

/// How often to send keepalive messages (`Keepalive-Ping-Interval`, seconds).
pub fn keepalive(headers: &HeaderMap) -> Option<Duration> {
    let secs: u64 = headers.get("keepalive-ping-interval")?.to_str().ok()?.trim().parse().ok()?;
    (secs > 0).then(|| Duration::from_secs(secs.min(3600)))
}

/// A unary success: the message as JSON (at least `{}`).
pub fn ok(message: serde_json::Value) -> Response {
    let body = serde_json::to_vec(&message).unwrap_or_else(|_| b"{}".to_vec());
    Response::builder().status(StatusCode::OK).header(header::CONTENT_TYPE, "application/json").body(Body::from(body)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip_in_pieces() {
        let mut all = envelope(0, br#"{"a":1}"#).to_vec();
        all.extend_from_slice(&envelope(0, br#"{"b":2}"#));
        all.extend_from_slice(&envelope(END_STREAM, b"{}"));
        let mut e = Envelopes::default();
        let mut got = Vec::new();
        for byte in all {
            e.push(&[byte]);
            while let Some(m) = e.next_message().unwrap() {
                got.push(m);
            }
        }
        assert_eq!(got, vec![Bytes::from_static(br#"{"a":1}"#), Bytes::from_static(br#"{"b":2}"#)]);
    }

    #[test]
    fn oversized_and_compressed_messages_are_refused() {
        let mut e = Envelopes::default();
        e.push(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(e.next_message().unwrap_err().code, Code::ResourceExhausted);
        let mut e = Envelopes::default();
        e.push(&envelope(COMPRESSED, b"{}"));
        assert_eq!(e.next_message().unwrap_err().code, Code::Unimplemented);
    }

    #[test]
    fn deadlines_and_keepalives_from_headers() {
        let mut h = HeaderMap::new();
        assert_eq!(timeout(&h).unwrap(), None);
        h.insert("connect-timeout-ms", "1500".parse().unwrap());
        assert_eq!(timeout(&h).unwrap(), Some(Duration::from_millis(1500)));
        h.insert("connect-timeout-ms", "soon".parse().unwrap());
        assert!(timeout(&h).is_err());
        h.insert("keepalive-ping-interval", "50".parse().unwrap());
        assert_eq!(keepalive(&h), Some(Duration::from_secs(50)));
    }

    #[test]
    fn unary_bodies_are_json_only() {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
        let v: serde_json::Value = unary(&h, b"").unwrap();
        assert_eq!(v, serde_json::Value::Null);
        assert!(unary::<serde_json::Value>(&h, b"{").is_err());
        h.insert(header::CONTENT_TYPE, "application/proto".parse().unwrap());
        assert!(unary::<serde_json::Value>(&h, b"").is_err());
    }
}
