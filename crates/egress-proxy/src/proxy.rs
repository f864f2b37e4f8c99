//! One sandbox's proxy: an HTTP/1.1 server on a listener the sandbox can
//! reach, serving `CONNECT host:port` (tunnels, for HTTPS) and
//! absolute-form requests (`GET http://host/...`, for plain HTTP), each
//! checked against the policy before anything is sent upstream, and each
//! sent upstream on a connection of its own with the operator's credentials.
//! Checking every request, not every connection, is what keeps a
//! keep-alive connection from carrying a second request elsewhere.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::target::Target;
use crate::upstream::Upstream;

/// What a sandbox may reach: asked once per request, with the policy in
/// force at that moment (it may look the name up first).
pub trait Policy: Send + Sync + 'static {
    fn allows<'a>(&'a self, target: &'a Target) -> Pin<Box<dyn Future<Output = bool> + Send + 'a>>;
}

/// A policy that needs no lookup.
impl<F: Fn(&Target) -> bool + Send + Sync + 'static> Policy for F {
    fn allows<'a>(&'a self, target: &'a Target) -> Pin<Box<dyn Future<Output = bool> + Send + 'a>> {
        let verdict = self(target);
        Box::pin(std::future::ready(verdict))
    }
}

/// The proxy's limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections from the sandbox open at once (tunnels included); one
    /// more is answered 503 and closed.
    pub max_connections: usize,
    /// How long a client may take to send a request's headers.
    pub header_timeout: Duration,
    /// How long the upstream proxy may take to accept a connection, and
    /// then to answer a request's headers.
    pub upstream_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { max_connections: 256, header_timeout: Duration::from_secs(30), upstream_timeout: Duration::from_secs(30) }
    }
}

/// Largest request head a client may send: the target and the headers,
/// counted after parsing (hyper's read buffer, twice that, only bounds
/// what it holds before).
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// Headers of one hop (RFC 9110 §7.6.1) and the client's own proxy
/// credentials: never sent upstream.
const HOP_BY_HOP: [&str; 9] =
    ["connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade"];

type Body = BoxBody<Bytes, hyper::Error>;

struct Ctx {
    upstream: Arc<Upstream>,
    policy: Arc<dyn Policy>,
    limits: Limits,
    /// For the log: whose proxy this is.
    name: String,
}

/// Serve `listener` until the task is dropped (aborted).
pub async fn serve(listener: TcpListener, upstream: Arc<Upstream>, policy: Arc<dyn Policy>, limits: Limits, name: String) {
    let ctx = Arc::new(Ctx { upstream, policy, limits, name });
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            tokio::spawn(refuse_busy(stream, limits.max_connections));
            continue;
        };
        // Held by the connection and by the tunnel it may become (hyper
        // lets go of an upgraded connection while its tunnel goes on).
        let slot = Arc::new(slot);
        let ctx = Arc::clone(&ctx);
        tokio::spawn(async move {
            let held = Arc::clone(&slot);
            let service = hyper::service::service_fn(move |req| {
                let (ctx, slot) = (Arc::clone(&ctx), Arc::clone(&held));
                async move { Ok::<_, Infallible>(route(req, &ctx, slot).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .max_buf_size(2 * MAX_HEAD_BYTES)
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades()
                .await;
            drop(slot);
        });
    }
}

async fn refuse_busy(mut stream: tokio::net::TcpStream, max: usize) {
    use tokio::io::AsyncWriteExt;
    let body = format!("forkbox: this sandbox already has {max} connections open through the egress proxy\n");
    let head = format!("HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(head.as_bytes()).await;
        let _ = stream.write_all(body.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

fn text(status: StatusCode, msg: String) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(format!("forkbox: {msg}\n"))).map_err(|never| match never {}).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

/// The request head's size as sent: target and headers.
fn head_bytes<B>(req: &Request<B>) -> usize {
    req.uri().to_string().len() + req.headers().iter().map(|(k, v)| k.as_str().len() + v.len() + 4).sum::<usize>()
}

async fn route(req: Request<Incoming>, ctx: &Ctx, slot: Arc<tokio::sync::OwnedSemaphorePermit>) -> Response<Body> {
    if head_bytes(&req) > MAX_HEAD_BYTES {
        return text(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, format!("a request head has at most {} KiB", MAX_HEAD_BYTES >> 10));
    }
    let connect = req.method() == Method::CONNECT;
    let absolute_http = req.uri().scheme_str() == Some("http") && req.uri().authority().is_some();
    let Some(authority) = req.uri().authority().cloned().filter(|_| connect || absolute_http) else {
        let msg = if req.uri().scheme_str() == Some("https") {
            "send https:// requests through CONNECT (set HTTPS_PROXY)".to_string()
        } else {
            "this is the sandbox's egress proxy: use it as an HTTP proxy (HTTP_PROXY / HTTPS_PROXY)".to_string()
        };
        return text(StatusCode::BAD_REQUEST, msg);
    };
    let target = match Target::from_authority(&authority, (!connect).then_some(80)) {
        Ok(t) => t,
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("bad target: {e}")),
    };
    if !ctx.policy.allows(&target).await {
        tracing::info!(sandbox = %ctx.name, %target, "egress refused by the sandbox's policy");
        return text(StatusCode::FORBIDDEN, format!("{target} is not allowed by this sandbox's egress policy"));
    }
    tracing::debug!(sandbox = %ctx.name, %target, connect, "egress through the upstream proxy");
    if connect {
        tunnel(req, target, ctx, slot).await
    } else {
        forward(req, ctx).await
    }
}

/// A client connection to the upstream proxy, driven in a task of its own.
async fn upstream_sender(ctx: &Ctx) -> Result<hyper::client::conn::http1::SendRequest<Body>, Response<Body>> {
    let stream = ctx.upstream.connect(ctx.limits.upstream_timeout).await.map_err(|e| {
        tracing::warn!(sandbox = %ctx.name, upstream = %ctx.upstream, err = %e, "the upstream proxy cannot be reached");
        let status = if e.kind() == std::io::ErrorKind::TimedOut { StatusCode::GATEWAY_TIMEOUT } else { StatusCode::BAD_GATEWAY };
        text(status, "the upstream proxy cannot be reached".into())
    })?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|_| text(StatusCode::BAD_GATEWAY, "the upstream proxy cannot be reached".into()))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    Ok(sender)
}

/// What the upstream proxy's own refusal becomes: its 407 is about our
/// credentials, not the sandbox's, so it is a 502 here.
fn upstream_refused(status: StatusCode, ctx: &Ctx) -> Response<Body> {
    tracing::warn!(sandbox = %ctx.name, upstream = %ctx.upstream, %status, "the upstream proxy refused a request");
    if status == StatusCode::PROXY_AUTHENTICATION_REQUIRED {
        return text(StatusCode::BAD_GATEWAY, "the upstream proxy refused the server's credentials (407)".into());
    }
    text(status, format!("the upstream proxy answered {}", status.as_u16()))
}

async fn send(sender: &mut hyper::client::conn::http1::SendRequest<Body>, req: Request<Body>, ctx: &Ctx) -> Result<Response<Incoming>, Response<Body>> {
    match tokio::time::timeout(ctx.limits.upstream_timeout, sender.send_request(req)).await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(_)) => Err(text(StatusCode::BAD_GATEWAY, "the upstream proxy closed the connection without an answer".into())),
        Err(_) => Err(text(StatusCode::GATEWAY_TIMEOUT, "the upstream proxy did not answer in time".into())),
    }
}

async fn tunnel(req: Request<Incoming>, target: Target, ctx: &Ctx, slot: Arc<tokio::sync::OwnedSemaphorePermit>) -> Response<Body> {
    let mut sender = match upstream_sender(ctx).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let authority = target.to_string();
    let mut up = Request::builder().method(Method::CONNECT).uri(authority.as_str()).header(header::HOST, authority.as_str());
    if let Some(auth) = ctx.upstream.authorization() {
        up = up.header(header::PROXY_AUTHORIZATION, auth.clone());
    }
    let Ok(up) = up.body(Full::new(Bytes::new()).map_err(|never| match never {}).boxed()) else {
        return text(StatusCode::BAD_REQUEST, "bad target".into());
    };
    let answer = match send(&mut sender, up, ctx).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    if answer.status() != StatusCode::OK {
        return upstream_refused(answer.status(), ctx);
    }
    tokio::spawn(async move {
        let (Ok(upstream), Ok(client)) = (hyper::upgrade::on(answer).await, hyper::upgrade::on(req).await) else { return };
        let _ = tokio::io::copy_bidirectional(&mut TokioIo::new(client), &mut TokioIo::new(upstream)).await;
        drop(slot);
    });
    Response::new(Full::new(Bytes::new()).map_err(|never| match never {}).boxed())
}

async fn forward(req: Request<Incoming>, ctx: &Ctx) -> Response<Body> {
    let mut sender = match upstream_sender(ctx).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let (mut parts, body) = req.into_parts();
    // What `Connection` names is of this hop too.
    let named: Vec<String> = parts
        .headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|s| s.trim().to_ascii_lowercase()).collect::<Vec<_>>())
        .collect();
    for h in HOP_BY_HOP.iter().map(|s| s.to_string()).chain(named) {
        parts.headers.remove(h.as_str());
    }
    if let Some(auth) = ctx.upstream.authorization() {
        parts.headers.insert(header::PROXY_AUTHORIZATION, auth.clone());
    }
    parts.version = hyper::Version::HTTP_11;
    let up = Request::from_parts(parts, body.boxed());
    match send(&mut sender, up, ctx).await {
        Ok(r) if r.status() == StatusCode::PROXY_AUTHENTICATION_REQUIRED => upstream_refused(r.status(), ctx),
        Ok(r) => {
            let (mut parts, body) = r.into_parts();
            for h in HOP_BY_HOP {
                parts.headers.remove(h);
            }
            Response::from_parts(parts, body.boxed())
        }
        Err(r) => r,
    }
}
