//! Request ids and trace context (docs/operations.md#logs): every request
//! runs in a tracing span carrying its id (the client's `X-Request-Id` if
//! it sent a sane one, else a new one), its route, and the trace id of an
//! incoming W3C `traceparent`, so every log line a request causes can be
//! found by either. The id is echoed in the `X-Request-Id` response header.

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use rand::Rng;
use tracing::Instrument;

pub static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The client's id when it is short and printable, else 16 random hex digits.
fn request_id(req: &Request) -> String {
    let theirs = req.headers().get(&REQUEST_ID).and_then(|v| v.to_str().ok());
    match theirs {
        Some(id) if !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_graphic()) => id.to_string(),
        _ => format!("{:016x}", rand::rng().random::<u64>()),
    }
}

/// The trace id of a well-formed `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`).
pub fn trace_id(traceparent: &str) -> Option<&str> {
    let parts: Vec<&str> = traceparent.trim().split('-').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
    match parts.as_slice() {
        [version, trace, parent, flags]
            if hex(version, 2) && *version != "ff" && hex(trace, 32) && hex(parent, 16) && hex(flags, 2) && trace.bytes().any(|b| b != b'0') =>
        {
            Some(trace)
        }
        _ => None,
    }
}

pub async fn layer(req: Request, next: Next) -> Response {
    let id = request_id(&req);
    let route = req.extensions().get::<MatchedPath>().map(|p| p.as_str().to_string()).unwrap_or_default();
    let trace = req.headers().get("traceparent").and_then(|v| v.to_str().ok()).and_then(trace_id).unwrap_or_default().to_string();
    let span = tracing::info_span!("request", request_id = %id, method = %req.method(), route = %route, trace_id = %trace);
    let started = std::time::Instant::now();
    let mut response = next.run(req).instrument(span.clone()).await;
    let (status, ms) = (response.status().as_u16(), started.elapsed().as_millis() as u64);
    span.in_scope(|| {
        // Probes would drown the rest.
        if matches!(route.as_str(), "/v1/healthz" | "/metrics") {
            tracing::debug!(status, ms, "request");
        } else {
            tracing::info!(status, ms, "request");
        }
    });
    if let Ok(v) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID.clone(), v);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::trace_id;

    #[test]
    fn traceparent_is_parsed_strictly() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(trace_id(good), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        for bad in [
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e47-00f067aa0ba902b7-01",
            "",
        ] {
            assert_eq!(trace_id(bad), None, "{bad}");
        }
    }
}
