//! Forwarding one request to a node and its answer back, both streamed
//! (exec events, file transfers, PTY and watch streams pass through as
//! they come), and upgraded connections (WebSockets to a sandbox's port)
//! tunnelled both ways.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderName, HeaderValue, Response, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioIo;

/// The client to nodes: HTTP/1.1 with pooled keep-alive connections.
pub type NodeClient = Client<HttpConnector, Body>;

pub fn client() -> NodeClient {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.set_connect_timeout(Some(std::time::Duration::from_secs(3)));
    Client::builder(hyper_util::rt::TokioExecutor::new()).pool_idle_timeout(std::time::Duration::from_secs(30)).build(http)
}

/// Hop-by-hop headers (RFC 9110 §7.6.1): never forwarded; an upgrade's
/// are put back.
const HOP_BY_HOP: [&str; 9] =
    ["connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade"];

fn wants_upgrade(headers: &axum::http::HeaderMap) -> bool {
    headers.get_all(header::CONNECTION).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Why a request could not reach its node.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// Not sent: the node refused or did not take the connection (a
    /// create may try another node).
    #[error("node {node} is unreachable: {reason}")]
    Unreachable { node: String, reason: String },
    /// Sent, and the node did not answer.
    #[error("node {node} did not answer: {reason}")]
    NoAnswer { node: String, reason: String },
    #[error("{0}")]
    BadRequest(String),
}

/// Send `req` to the node `name` at `api` (`http://host:port`), showing
/// the cluster secret; its answer comes back as it streams.
pub async fn forward(client: &NodeClient, name: &str, api: &str, secret: &str, mut req: Request) -> Result<Response<Body>, ProxyError> {
    let path = req.uri().path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let uri: Uri = format!("{}{}", api.trim_end_matches('/'), path).parse().map_err(|e| ProxyError::BadRequest(format!("invalid path: {e}")))?;
    let upgrade = wants_upgrade(req.headers()).then(|| req.headers().get(header::UPGRADE).cloned()).flatten();
    let client_side = upgrade.is_some().then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    parts.uri = uri;
    parts.version = axum::http::Version::HTTP_11;
    let headers = &mut parts.headers;
    for h in HOP_BY_HOP {
        headers.remove(h);
    }
    // Only the gateway shows the secret; a client's is never passed on.
    headers.remove(crate::CLUSTER_HEADER);
    headers.insert(HeaderName::from_static(crate::CLUSTER_HEADER), HeaderValue::from_str(secret).map_err(|e| ProxyError::BadRequest(e.to_string()))?);
    if let Some(up) = &upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, up.clone());
    }
    let outgoing = axum::http::Request::from_parts(parts, body);
    let mut resp = client.request(outgoing).await.map_err(|e| {
        if e.is_connect() {
            ProxyError::Unreachable { node: name.to_string(), reason: e.to_string() }
        } else {
            ProxyError::NoAnswer { node: name.to_string(), reason: e.to_string() }
        }
    })?;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_side) = client_side {
            let node_side = hyper::upgrade::on(&mut resp);
            tokio::spawn(async move {
                if let (Ok(a), Ok(b)) = (client_side.await, node_side.await) {
                    let _ = tokio::io::copy_bidirectional(&mut TokioIo::new(a), &mut TokioIo::new(b)).await;
                }
            });
        }
        let (parts, _) = resp.into_parts();
        return Ok(Response::from_parts(parts, Body::empty()));
    }
    let (mut parts, body) = resp.into_parts();
    for h in HOP_BY_HOP {
        parts.headers.remove(h);
    }
    parts.headers.insert(HeaderName::from_static(crate::NODE_HEADER), HeaderValue::from_str(name).unwrap_or(HeaderValue::from_static("?")));
    Ok(Response::from_parts(parts, Body::new(body)))
}
