//! `/v1/sandboxes/{id}/ports/{port}/{*path}`: an HTTP reverse proxy to a
//! service listening on a TCP port inside a sandbox (docs/network.md#ports).
//!
//! Each proxied request opens one connection in the sandbox's network
//! namespace (`jail::Sandbox::connect_port`) and speaks HTTP/1.1 on it with
//! hyper's client connection API. Bodies stream both ways without
//! buffering; an `Upgrade` (WebSocket) answered `101` becomes a byte tunnel.
//! The connection, and so the slot it takes from the sandbox's cap, lives
//! until the response body or the tunnel ends.

use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{StatusCode, Uri, Version};
use axum::response::Response;
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;

use crate::error::ApiError;
use crate::http::Key;
use crate::AppState;
use service::sandbox::CapSlot;

/// Path parameters of both proxy routes (the `{*path}` rest is read from
/// the raw URI, undecoded).
#[derive(Debug, Deserialize)]
pub struct PortPath {
    pub id: String,
    pub port: String,
}

/// Headers that belong to one connection (RFC 9110 §7.6.1), never forwarded
/// as they are; `Upgrade` and `Connection: upgrade` are put back for an
/// upgrade. `Expect` was answered by this server already.
const HOP_BY_HOP: [&str; 10] =
    ["connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade", "expect"];

/// The prefix a proxied service sits under, for `X-Forwarded-Prefix`.
pub fn prefix(id: &str, port: u16) -> String {
    format!("/v1/sandboxes/{id}/ports/{port}")
}

/// A port number from the path: 1..=65535.
pub fn parse_port(raw: &str) -> Result<u16, ApiError> {
    match raw.parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(ApiError::BadRequest(format!("port must be a number from 1 to 65535, not `{raw}`"))),
    }
}

/// The service's path and query: what follows `/ports/{port}` in the raw
/// request path (`/` when nothing does), and the query as it came.
pub fn service_path(uri: &Uri) -> String {
    // /v1/sandboxes/{id}/ports/{port}[/rest]: the rest starts after the sixth '/'.
    let path = uri.path();
    let rest = path.match_indices('/').nth(5).map(|(i, _)| &path[i..]).unwrap_or("/");
    match uri.query() {
        Some(q) => format!("{rest}?{q}"),
        None => rest.to_string(),
    }
}

/// Whether the request asks to switch protocols (`Connection: upgrade`).
fn wants_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Drop hop-by-hop headers, and those the `Connection` header names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// The headers the service gets: the client's, without hop-by-hop ones and
/// without `Authorization` (the forkbox key), with `Host` set to the
/// address reached and the `X-Forwarded-*` set.
pub fn forward_headers(
    mut headers: HeaderMap,
    upgrade: Option<HeaderValue>,
    host: &SocketAddr,
    client: Option<SocketAddr>,
    prefix: &str,
    authority: Option<&str>,
) -> HeaderMap {
    let original_host = headers.get(header::HOST).cloned().or_else(|| authority.and_then(|a| HeaderValue::from_str(a).ok()));
    strip_hop_by_hop(&mut headers);
    // The caller's credentials are forkbox's, not the service's.
    for secret in [header::AUTHORIZATION.as_str(), "x-api-key", "x-access-token", "e2b-traffic-access-token"] {
        headers.remove(secret);
    }
    if let Some(up) = upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, up);
    }
    if let Ok(v) = HeaderValue::from_str(&host.to_string()) {
        headers.insert(header::HOST, v);
    }
    if let Some(ip) = client.map(|c| c.ip().to_string()) {
        let xff = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
            Some(before) => format!("{before}, {ip}"),
            None => ip,
        };
        if let Ok(v) = HeaderValue::from_str(&xff) {
            headers.insert("x-forwarded-for", v);
        }
    }
    if !headers.contains_key("x-forwarded-proto") {
        headers.insert("x-forwarded-proto", HeaderValue::from_static("http"));
    }
    if let (false, Some(h)) = (headers.contains_key("x-forwarded-host"), original_host) {
        headers.insert("x-forwarded-host", h);
    }
    if let (false, Ok(v)) = (prefix.is_empty(), HeaderValue::from_str(prefix)) {
        headers.insert("x-forwarded-prefix", v);
    }
    headers
}

/// A redirect to a path of the service (`/login`, or an absolute URL on the
/// address the proxy used) is made to point back through the proxy.
pub fn rewrite_location(location: &str, host: &SocketAddr, prefix: &str) -> Option<String> {
    let own = format!("http://{host}");
    let path = match location.strip_prefix(&own) {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => rest,
        _ if location.starts_with('/') && !location.starts_with("//") => location,
        _ => return None,
    };
    Some(format!("{prefix}{}", if path.is_empty() { "/" } else { path }))
}

/// The connection to the service: bytes moving either way count as the
/// sandbox's activity (its idle timeout), and it holds the cap's slot.
struct ServiceIo {
    stream: tokio::net::TcpStream,
    slot: CapSlot,
}

impl AsyncRead for ServiceIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.slot.entry().touch();
        }
        r
    }
}

impl AsyncWrite for ServiceIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.stream).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.slot.entry().touch();
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// The request body on its way to the service: says when it has been sent
/// in full (or dropped), which starts the response timeout.
struct Sending {
    body: Body,
    /// Dropped when the body has been sent (or given up on).
    _sent: Option<oneshot::Sender<()>>,
}

impl http_body::Body for Sending {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let r = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(r, Poll::Ready(None | Some(Err(_)))) {
            self._sent = None;
        }
        r
    }
    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }
    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

fn unreachable_port(e: jail::ports::PortError, id: &str, port: u16) -> ApiError {
    use jail::ports::PortError as E;
    match e {
        E::Refused => ApiError::BadGateway(format!("nothing listens on port {port} in sandbox {id}")),
        E::TimedOut => ApiError::GatewayTimeout(format!("connecting to port {port} in sandbox {id} timed out")),
        E::Unreachable(why) => {
            tracing::warn!(sandbox = %id, %why, "port proxy: namespace not reachable");
            ApiError::Conflict("the sandbox's network is not reachable right now; retry".into())
        }
        E::Io { .. } => ApiError::engine("connect to the sandbox's port", e),
    }
}

fn bad_answer(e: hyper::Error, id: &str, port: u16) -> ApiError {
    let what = if e.is_incomplete_message() {
        "closed the connection without answering".to_string()
    } else if e.is_parse() || e.is_parse_status() {
        "sent an invalid HTTP response".to_string()
    } else {
        format!("failed: {e}")
    };
    ApiError::BadGateway(format!("the service on port {port} in sandbox {id} {what}"))
}

#[utoipa::path(method(get, post, put, delete, patch, head, options), path = "/v1/sandboxes/{id}/ports/{port}/{path}",
    params(("id" = String, Path), ("port" = u16, Path, description = "TCP port inside the sandbox, 1..=65535"),
        ("path" = String, Path, description = "The service's path (any depth; may be empty), forwarded with the query string")),
    request_body(content = Vec<u8>, content_type = "*/*", description = "Forwarded to the service as it streams"),
    responses((status = 200, description = "The service's answer, streamed: any status, its headers (hop-by-hop ones dropped) and body"),
        (status = 101, description = "The service switched protocols (WebSocket): the connection is a tunnel to it"),
        (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody), (status = 429, body = protocol::ErrorBody),
        (status = 502, body = protocol::ErrorBody, description = "Nothing listens on the port, or the service's answer was not HTTP"),
        (status = 504, body = protocol::ErrorBody, description = "The connect or the service's response headers timed out")))]
pub async fn proxy(
    State(state): State<AppState>,
    Key(caller): Key,
    path: Result<Path<PortPath>, axum::extract::rejection::PathRejection>,
    req: Request,
) -> Result<Response, ApiError> {
    let Path(p) = path.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let entry = state.get(&caller, &p.id).await?;
    let port = parse_port(&p.port)?;
    let target: Uri = service_path(req.uri()).parse().map_err(|_| ApiError::BadRequest("invalid path".into()))?;
    forward(&state, entry, port, req, &prefix(&p.id, port), target).await
}

/// Proxy `req` to `port` in `entry` as `target` (path and query); the
/// service sits under `prefix` on this server (`""`: at the root of its
/// own host name, as E2B's `{port}-{id}.{domain}` hosts put it).
pub async fn forward(
    state: &AppState,
    entry: std::sync::Arc<service::sandbox::SandboxEntry>,
    port: u16,
    mut req: Request,
    prefix: &str,
    target: Uri,
) -> Result<Response, ApiError> {
    let p = PortPath { id: entry.id.clone(), port: port.to_string() };
    let limits = &state.inner.config.limits;
    let max = limits.max_port_connections;
    let slot = CapSlot::take(&entry, |e| &e.port_connections, max, || format!("a sandbox may have at most {max} proxied connections open"))?;
    entry.touch();
    service::pause::ensure_running(&entry).await?;
    let (stream, addr) = entry.engine.connect_port(port, limits.port_connect_timeout).await.map_err(|e| unreachable_port(e, &p.id, port))?;
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .handshake::<_, Sending>(TokioIo::new(ServiceIo { stream, slot }))
        .await
        .map_err(|e| bad_answer(e, &p.id, port))?;
    let sandbox = p.id.clone();
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(%sandbox, port, err = %e, "port proxy: service connection ended");
        }
    });

    let upgrade = wants_upgrade(req.headers()).then(|| req.headers().get(header::UPGRADE).cloned()).flatten();
    let client_upgrade = upgrade.is_some().then(|| hyper::upgrade::on(&mut req));
    let client = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0);
    let (parts, body) = req.into_parts();
    let (sent_tx, sent_rx) = oneshot::channel();
    let mut out = hyper::Request::new(Sending { body, _sent: Some(sent_tx) });
    *out.method_mut() = parts.method;
    *out.uri_mut() = target;
    *out.version_mut() = Version::HTTP_11;
    *out.headers_mut() = forward_headers(parts.headers, upgrade, &addr, client, prefix, parts.uri.authority().map(|a| a.as_str()));

    // The service has `port_response_timeout` from the end of the request
    // body (a slow upload is not its fault) to send its response headers.
    let response_timeout = limits.port_response_timeout;
    let deadline = async move {
        let _ = sent_rx.await;
        tokio::time::sleep(response_timeout).await;
    };
    let mut resp = tokio::select! {
        r = sender.send_request(out) => r.map_err(|e| bad_answer(e, &p.id, port))?,
        () = deadline => return Err(ApiError::GatewayTimeout(format!(
            "the service on port {port} in sandbox {} sent no response headers within {} s", p.id, response_timeout.as_secs_f64()))),
    };

    let switching = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
    let upgraded_to = resp.headers().get(header::UPGRADE).cloned();
    strip_hop_by_hop(resp.headers_mut());
    if let Some(loc) = resp.headers().get(header::LOCATION).and_then(|v| v.to_str().ok()).and_then(|l| rewrite_location(l, &addr, prefix)) {
        if let Ok(v) = HeaderValue::from_str(&loc) {
            resp.headers_mut().insert(header::LOCATION, v);
        }
    }
    if switching {
        let Some(client_upgrade) = client_upgrade else {
            return Err(ApiError::BadGateway(format!("the service on port {port} switched protocols unasked")));
        };
        resp.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        if let Some(up) = upgraded_to {
            resp.headers_mut().insert(header::UPGRADE, up);
        }
        let service_upgrade = hyper::upgrade::on(&mut resp);
        let sandbox = p.id.clone();
        tokio::spawn(async move {
            match tokio::try_join!(client_upgrade, service_upgrade) {
                Ok((c, s)) => {
                    let _ = tokio::io::copy_bidirectional(&mut TokioIo::new(c), &mut TokioIo::new(s)).await;
                }
                Err(e) => tracing::debug!(%sandbox, port, err = %e, "port proxy: upgrade failed"),
            }
        });
    }
    Ok(resp.map(Body::new))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_and_paths() {
        assert_eq!(parse_port("8000").unwrap(), 8000);
        for bad in ["0", "65536", "-1", "http", "", "80.0"] {
            assert!(parse_port(bad).is_err(), "{bad}");
        }
        let uri = |s: &str| s.parse::<Uri>().unwrap();
        assert_eq!(service_path(&uri("/v1/sandboxes/sb-x/ports/80")), "/");
        assert_eq!(service_path(&uri("/v1/sandboxes/sb-x/ports/80/")), "/");
        assert_eq!(service_path(&uri("/v1/sandboxes/sb-x/ports/80?a=1")), "/?a=1");
        assert_eq!(service_path(&uri("/v1/sandboxes/sb-x/ports/80/a/b%20c/?x=%2F&y")), "/a/b%20c/?x=%2F&y");
    }

    #[test]
    fn headers_to_the_service() {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer key"));
        h.insert(header::HOST, HeaderValue::from_static("forkbox:7070"));
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, x-secret"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("x-app", HeaderValue::from_static("kept"));
        h.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        h.insert("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
        let host: SocketAddr = "127.0.0.1:8000".parse().unwrap();
        let out = forward_headers(h.clone(), None, &host, Some("127.0.0.9:5555".parse().unwrap()), "/v1/sandboxes/sb-x/ports/8000", None);
        for gone in ["authorization", "connection", "x-secret", "transfer-encoding", "upgrade"] {
            assert!(!out.contains_key(gone), "{gone} forwarded");
        }
        assert_eq!(out["host"], "127.0.0.1:8000");
        assert_eq!(out["x-app"], "kept");
        assert_eq!(out["x-forwarded-for"], "10.0.0.1, 127.0.0.9");
        assert_eq!(out["x-forwarded-proto"], "http");
        assert_eq!(out["x-forwarded-host"], "forkbox:7070");
        assert_eq!(out["x-forwarded-prefix"], "/v1/sandboxes/sb-x/ports/8000");
        // An upgrade keeps (only) what it needs.
        let out = forward_headers(h, Some(HeaderValue::from_static("websocket")), &host, None, "/p", None);
        assert_eq!(out["connection"], "upgrade");
        assert_eq!(out["upgrade"], "websocket");
        assert!(!out.contains_key("x-secret"));
    }

    #[test]
    fn upgrades_are_recognised() {
        let mut h = HeaderMap::new();
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(!wants_upgrade(&h));
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, Upgrade"));
        assert!(wants_upgrade(&h));
    }

    #[test]
    fn redirects_point_back_through_the_proxy() {
        let host: SocketAddr = "127.0.0.1:8000".parse().unwrap();
        let p = "/v1/sandboxes/sb-x/ports/8000";
        assert_eq!(rewrite_location("/dir/", &host, p).as_deref(), Some("/v1/sandboxes/sb-x/ports/8000/dir/"));
        assert_eq!(rewrite_location("http://127.0.0.1:8000/a?b", &host, p).as_deref(), Some("/v1/sandboxes/sb-x/ports/8000/a?b"));
        assert_eq!(rewrite_location("http://127.0.0.1:8000", &host, p).as_deref(), Some("/v1/sandboxes/sb-x/ports/8000/"));
        assert_eq!(rewrite_location("http://127.0.0.1:80001/", &host, p), None);
        assert_eq!(rewrite_location("https://example.com/", &host, p), None);
        assert_eq!(rewrite_location("//example.com/", &host, p), None);
        assert_eq!(rewrite_location("relative", &host, p), None);
    }
}
