//! `forkbox gateway`: the stateless front of a cluster (docs/cluster.md).
//!
//! It speaks every API a forkbox server speaks (podflare/forkbox and E2B)
//! by passing each request to the node that can answer it (`route`):
//! calls naming a sandbox go to the node holding it (looked up in etcd),
//! creates and resumes to a node with room (`placement`), lists to every
//! node (merged), the rest to any node. Answers stream back as they come
//! (`proxy`). It keeps nothing but what it follows in etcd (the live
//! nodes and the API keys), so any number of gateways can run, and one can
//! restart at any time: its clients' open streams end, nothing else.

pub mod placement;
pub mod proxy;
pub mod route;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use cluster::registry::Found;
use cluster::{Cluster, ClusterConfig, NodeRecord};
use sha2::Digest;
use tokio::sync::watch;

use route::{Dialect, Target};

/// The header nodes want the cluster secret in.
pub const CLUSTER_HEADER: &str = "x-forkbox-cluster";
/// The header the gateway names the answering node in.
pub const NODE_HEADER: &str = "x-forkbox-node";
/// Largest create or resume body the gateway reads to place it.
const MAX_PLACE_BODY: usize = 1 << 20;

pub struct GatewayConfig {
    pub listen: SocketAddr,
    pub cluster: ClusterConfig,
    pub secret: cluster::secret::Secret,
}

#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    cluster: Cluster,
    nodes: watch::Receiver<Vec<NodeRecord>>,
    keys: watch::Receiver<Vec<cluster::keys::ClusterKey>>,
    client: proxy::NodeClient,
    secret: cluster::secret::Secret,
    /// Creates this gateway sent each node lately: nodes publish their load
    /// every two seconds, and creates in between must not all pick the
    /// node that looked emptiest.
    placed: std::sync::Mutex<std::collections::HashMap<String, Vec<std::time::Instant>>>,
}

/// How long a placement counts on top of a node's published load.
const PLACED_FOR: std::time::Duration = std::time::Duration::from_secs(3);

impl Gateway {
    /// Connect to the cluster and start following it.
    pub async fn new(config: &ClusterConfig, secret: cluster::secret::Secret) -> anyhow::Result<Gateway> {
        let cluster = Cluster::connect(config).await?;
        let keys = cluster.follow_keys().await?;
        let nodes = cluster.follow_nodes(false);
        Ok(Gateway { inner: Arc::new(Inner { cluster, nodes, keys, client: proxy::client(), secret, placed: Default::default() }) })
    }

    /// The live nodes, each counting the creates this gateway sent it since
    /// its last published load.
    fn nodes_for_placement(&self) -> Vec<NodeRecord> {
        let mut nodes = self.nodes();
        if let Ok(mut placed) = self.inner.placed.lock() {
            for n in &mut nodes {
                if let Some(at) = placed.get_mut(&n.name) {
                    at.retain(|t| t.elapsed() < PLACED_FOR);
                    n.load.sandboxes += at.len() as u64;
                }
            }
        }
        nodes
    }

    fn placed(&self, node: &str) {
        if let Ok(mut placed) = self.inner.placed.lock() {
            placed.entry(node.to_string()).or_default().push(std::time::Instant::now());
        }
    }

    fn nodes(&self) -> Vec<NodeRecord> {
        self.inner.nodes.borrow().clone()
    }

    fn node(&self, name: &str) -> Option<NodeRecord> {
        self.inner.nodes.borrow().iter().find(|n| n.name == name).cloned()
    }

    /// The key a request shows (podflare/forkbox: `Authorization: Bearer`;
    /// E2B: `X-API-Key`): Ok(None) when the cluster has no keys, Err when
    /// it has and this is none of them.
    fn caller(&self, headers: &HeaderMap) -> Result<Option<String>, ()> {
        let keys = self.inner.keys.borrow();
        if keys.is_empty() {
            return Ok(None);
        }
        let bearer = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")).map(str::trim);
        let shown = bearer.or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok())).ok_or(())?;
        let hash = hex::encode(sha2::Sha256::digest(shown.as_bytes()));
        keys.iter().find(|k| k.sha256 == hash).map(|k| Some(k.name.clone())).ok_or(())
    }
}

/// Serve until SIGTERM or SIGINT.
pub async fn serve(config: GatewayConfig) -> anyhow::Result<()> {
    let gateway = Gateway::new(&config.cluster, config.secret).await?;
    if !config.listen.ip().is_loopback() && gateway.inner.keys.borrow().is_empty() {
        anyhow::bail!(
            "refusing to listen on {} while the cluster has no API keys: add one with `forkbox key add --cluster-etcd …`, or listen on 127.0.0.1",
            config.listen
        );
    }
    use axum::serve::ListenerExt;
    let listener = tokio::net::TcpListener::bind(config.listen).await?.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tracing::info!(listen = %config.listen, "forkbox gateway serving");
    axum::serve(listener, app(gateway)).with_graceful_shutdown(shutdown()).await?;
    Ok(())
}

async fn shutdown() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// The router, separate from any socket so tests can drive it.
pub fn app(gateway: Gateway) -> Router {
    Router::new().fallback(handle).with_state(gateway)
}

/// An error in the request's own protocol's shape.
fn error(dialect: Dialect, status: StatusCode, message: impl Into<String>) -> Response {
    let message = message.into();
    let body = match dialect {
        Dialect::Forkbox => serde_json::json!({ "error": message }),
        Dialect::E2b => serde_json::json!({ "code": status.as_u16(), "message": message }),
    };
    let mut r = (status, axum::Json(body)).into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("2"));
    }
    r
}

fn unavailable(dialect: Dialect, e: impl std::fmt::Display) -> Response {
    error(dialect, StatusCode::SERVICE_UNAVAILABLE, e.to_string())
}

async fn handle(State(gw): State<Gateway>, req: Request) -> Response {
    let (target, dialect) = route::route(req.method(), req.uri().path(), req.headers());
    match target {
        Target::Health => health(&gw).await,
        Target::Nodes => match gw.caller(req.headers()) {
            Ok(_) => nodes(&gw),
            Err(()) => error(dialect, StatusCode::UNAUTHORIZED, "missing or invalid API key"),
        },
        Target::Drain { node } => drain(&gw, &node, req.headers()).await,
        Target::Undrain { node } => undrain(&gw, &node, req.headers()).await,
        Target::Sandbox { id } => to_sandbox(&gw, &id, dialect, req).await,
        Target::Place => place(&gw, dialect, req).await,
        Target::Every => every(&gw, dialect, req).await,
        Target::Any => any_node(&gw, dialect, req).await,
        Target::Whichever => whichever(&gw, dialect, req).await,
        Target::Unknown => error(dialect, StatusCode::NOT_FOUND, format!("no route for {} {}", req.method(), req.uri().path())),
    }
}

async fn health(gw: &Gateway) -> Response {
    if let Err(e) = gw.inner.cluster.healthy().await {
        return unavailable(Dialect::Forkbox, e);
    }
    if gw.nodes().is_empty() {
        return error(Dialect::Forkbox, StatusCode::SERVICE_UNAVAILABLE, "the cluster has no live node");
    }
    (StatusCode::OK, axum::Json(serde_json::json!({"status": "ok", "nodes": gw.nodes().len()}))).into_response()
}

/// `GET /v1/cluster/nodes`: the live nodes and their load.
fn nodes(gw: &Gateway) -> Response {
    let list: Vec<serde_json::Value> =
        gw.nodes().into_iter().map(|n| serde_json::json!({"name": n.name, "started_ms": n.started_ms, "draining": n.draining, "load": n.load})).collect();
    (StatusCode::OK, axum::Json(serde_json::json!({ "nodes": list }))).into_response()
}

/// Longest a drain is waited for before the gateway answers without its
/// report (the drain goes on).
const DRAIN_WAIT: std::time::Duration = std::time::Duration::from_secs(900);

/// Why an operator's request may not act on `node`, if it may not: it
/// shows no cluster secret, or the node is not live.
fn refuse_operator(gw: &Gateway, node: &str, headers: &HeaderMap) -> Option<Response> {
    let shown = headers.get(CLUSTER_HEADER).map(|v| v.as_bytes()).unwrap_or_default();
    if !gw.inner.secret.matches(shown) {
        return Some(error(Dialect::Forkbox, StatusCode::UNAUTHORIZED, "draining a node needs the cluster secret (X-Forkbox-Cluster)"));
    }
    if gw.node(node).is_none() {
        return Some(error(Dialect::Forkbox, StatusCode::NOT_FOUND, format!("no live node `{node}`")));
    }
    None
}

/// `DELETE /v1/cluster/nodes/{node}/drain`: the node takes work again.
async fn undrain(gw: &Gateway, node: &str, headers: &HeaderMap) -> Response {
    if let Some(r) = refuse_operator(gw, node, headers) {
        return r;
    }
    match gw.inner.cluster.cancel_drain(node).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => unavailable(Dialect::Forkbox, e),
    }
}

/// `POST /v1/cluster/nodes/{node}/drain`: an operator's (it shows the
/// cluster secret). Answers the node's report once every sandbox moved.
async fn drain(gw: &Gateway, node: &str, headers: &HeaderMap) -> Response {
    if let Some(r) = refuse_operator(gw, node, headers) {
        return r;
    }
    let ticket = match gw.inner.cluster.request_drain(node).await {
        Ok(t) => t,
        Err(e) => return unavailable(Dialect::Forkbox, e),
    };
    let deadline = std::time::Instant::now() + DRAIN_WAIT;
    loop {
        match gw.inner.cluster.drain_report(node, &ticket).await {
            Ok(Some(report)) => return (StatusCode::OK, axum::Json(report)).into_response(),
            Ok(None) if std::time::Instant::now() < deadline => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
            Ok(None) => {
                return error(Dialect::Forkbox, StatusCode::GATEWAY_TIMEOUT, format!("node `{node}` is still draining; GET /v1/cluster/nodes shows it"))
            }
            Err(e) => return unavailable(Dialect::Forkbox, e),
        }
    }
}

/// Longest a call waits for its sandbox to finish moving between nodes.
const MOVE_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

fn proxy_failed(dialect: Dialect, e: proxy::ProxyError) -> Response {
    match e {
        proxy::ProxyError::BadRequest(m) => error(dialect, StatusCode::BAD_REQUEST, m),
        e => unavailable(dialect, e),
    }
}

/// A call naming sandbox `id`: to its node, or why not.
async fn to_sandbox(gw: &Gateway, id: &str, dialect: Dialect, req: Request) -> Response {
    // A sandbox moving off a draining node: its calls wait for it.
    let deadline = std::time::Instant::now() + MOVE_WAIT;
    let found = loop {
        match gw.inner.cluster.find(id).await {
            Ok(Found::Moving(_)) if std::time::Instant::now() < deadline => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
            Ok(Found::Moving(m)) => return unavailable(dialect, format!("sandbox `{id}` is still moving off node {}", m.from)),
            Ok(f) => break f,
            Err(e) => return unavailable(dialect, e),
        }
    };
    let caller = gw.caller(req.headers());
    let lost = |owner: &Option<String>, why: &str| {
        // Another key's sandbox answers as an unknown id.
        let mine = match &caller {
            Ok(caller) => caller.is_none() || caller == owner,
            Err(()) => false,
        };
        if mine {
            error(dialect, StatusCode::NOT_FOUND, format!("sandbox `{id}` was lost: {why}"))
        } else {
            error(dialect, StatusCode::NOT_FOUND, format!("no sandbox `{id}`"))
        }
    };
    let node = match found {
        Found::Live(record) => match gw.node(&record.node) {
            Some(node) => node,
            // Gone, not yet reaped.
            None => return lost(&record.owner, &format!("node {} left", record.node)),
        },
        // On disk in the store: any node can wake it (or, frozen, say how
        // to resume it), best the one that froze it.
        Found::Frozen(f) => match placement::wake_on(&gw.nodes(), &f.node, id) {
            Some(node) => node.clone(),
            None => return error(dialect, StatusCode::SERVICE_UNAVAILABLE, format!("no node has room to wake sandbox `{id}`")),
        },
        Found::Lost(l) => return lost(&l.owner, &l.reason),
        Found::Unknown | Found::Moving(_) => return error(dialect, StatusCode::NOT_FOUND, format!("no sandbox `{id}`")),
    };
    let info = req.method() == Method::GET && req.uri().path().trim_end_matches('/') == format!("/v1/sandboxes/{id}");
    match proxy::forward(&gw.inner.client, &node.name, &node.api, gw.inner.secret.expose(), req).await {
        Ok(resp) if info => with_node(resp, &node.name).await,
        Ok(resp) => resp,
        // Down or cut off, but not yet taken for lost (its lease runs): it
        // may come back.
        Err(e) => proxy_failed(dialect, e),
    }
}

/// A sandbox's info with the node holding it (`node`).
async fn with_node(resp: Response, node: &str) -> Response {
    if resp.status() != StatusCode::OK {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 16 << 20).await else {
        return error(Dialect::Forkbox, StatusCode::BAD_GATEWAY, "the node's answer was cut off");
    };
    let out = match serde_json::from_slice::<serde_json::Value>(&bytes) {
        // (A hibernating sandbox is on no node.)
        Ok(serde_json::Value::Object(mut m)) if m.get("state").and_then(|s| s.as_str()) != Some("hibernated") => {
            m.insert("node".into(), serde_json::Value::String(node.to_string()));
            Bytes::from(serde_json::to_vec(&m).unwrap_or_default())
        }
        _ => bytes,
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(out))
}

/// A create or a Space's resume: to a node with room, another if that
/// one cannot be reached (the request was not sent).
async fn place(gw: &Gateway, dialect: Dialect, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_PLACE_BODY).await else {
        return error(dialect, StatusCode::PAYLOAD_TOO_LARGE, format!("a create's body is at most {MAX_PLACE_BODY} bytes"));
    };
    let template = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v.get("template").or_else(|| v.get("templateID")).and_then(|t| t.as_str()).map(|t| t.to_string()).or(Some("default".into())));
    let resume = parts.uri.path().starts_with("/v1/spaces/");
    let mut tried = Vec::new();
    loop {
        let nodes = gw.nodes_for_placement();
        let Some(node) = placement::choose(&nodes, if resume { None } else { template.as_deref() }, &tried).cloned() else {
            let why = if tried.is_empty() { "no node has room for a new sandbox" } else { "no node with room could be reached" };
            return error(dialect, StatusCode::SERVICE_UNAVAILABLE, why);
        };
        let req = Request::from_parts(parts.clone(), Body::from(bytes.clone()));
        gw.placed(&node.name);
        match proxy::forward(&gw.inner.client, &node.name, &node.api, gw.inner.secret.expose(), req).await {
            Ok(resp) if dialect == Dialect::Forkbox => return with_node(resp, &node.name).await,
            Ok(resp) => return resp,
            Err(proxy::ProxyError::Unreachable { node: n, reason }) => {
                tracing::warn!(node = %n, %reason, "a node could not be reached for a create; trying another");
                tried.push(n);
            }
            Err(e) => return proxy_failed(dialect, e),
        }
    }
}

/// A list of sandboxes: every node's, merged, oldest first. A node that
/// does not answer is left out and named in `X-Forkbox-Missing-Nodes`.
async fn every(gw: &Gateway, dialect: Dialect, req: Request) -> Response {
    let (parts, _) = req.into_parts();
    let nodes = gw.nodes();
    let asks = nodes.iter().map(|n| {
        let req = Request::from_parts(parts.clone(), Body::empty());
        async move { (n.name.clone(), proxy::forward(&gw.inner.client, &n.name, &n.api, gw.inner.secret.expose(), req).await) }
    });
    let answers = futures::future::join_all(asks).await;
    let mut items: Vec<serde_json::Value> = Vec::new();
    let mut missing = Vec::new();
    for (node, answer) in answers {
        let resp = match answer {
            Ok(r) if r.status() == StatusCode::OK => r,
            // An auth failure is the same on every node: answer it.
            Ok(r) if r.status() == StatusCode::UNAUTHORIZED || r.status() == StatusCode::BAD_REQUEST => return r,
            _ => {
                missing.push(node);
                continue;
            }
        };
        let Ok(bytes) = axum::body::to_bytes(resp.into_body(), 64 << 20).await else {
            missing.push(node);
            continue;
        };
        let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
        let list = match (dialect, value) {
            (Dialect::Forkbox, serde_json::Value::Object(mut m)) => {
                m.remove("sandboxes").and_then(|v| if let serde_json::Value::Array(a) = v { Some(a) } else { None })
            }
            (Dialect::E2b, serde_json::Value::Array(a)) => Some(a),
            _ => None,
        };
        for mut item in list.unwrap_or_default() {
            // (A hibernating one is on no node.)
            if let (Dialect::Forkbox, Some(m)) = (dialect, item.as_object_mut()) {
                if m.get("state").and_then(|s| s.as_str()) != Some("hibernated") {
                    m.insert("node".into(), serde_json::Value::String(node.clone()));
                }
            }
            items.push(item);
        }
    }
    // Every node lists the cluster's hibernating sandboxes (they are in
    // the store, not on a node): each once.
    let mut seen = std::collections::HashSet::new();
    items.retain(|v| match v.get("id").or_else(|| v.get("sandboxID")).and_then(|i| i.as_str()) {
        Some(id) => seen.insert(id.to_string()),
        None => true,
    });
    // Oldest first, as one server lists them (E2B's lists have no order).
    items.sort_by_key(|v| v.get("created_at").and_then(|c| c.as_u64()).unwrap_or(0));
    let body = match dialect {
        Dialect::Forkbox => serde_json::json!({ "sandboxes": items }),
        Dialect::E2b => serde_json::Value::Array(items),
    };
    let mut resp = (StatusCode::OK, axum::Json(body)).into_response();
    if !missing.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&missing.join(",")) {
            resp.headers_mut().insert("x-forkbox-missing-nodes", v);
        }
    }
    resp
}

/// Largest upload through a signed link that names no sandbox (it is
/// held to be offered to each node in turn).
const MAX_SIGNED_BODY: usize = 64 << 20;

/// An E2B signed `/files` link that names no sandbox: only the node whose
/// sandbox signed it accepts it (the others answer `401`), so each is
/// asked in turn.
async fn whichever(gw: &Gateway, dialect: Dialect, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_SIGNED_BODY).await else {
        return error(dialect, StatusCode::PAYLOAD_TOO_LARGE, format!("through a cluster, an upload by a signed link is at most {MAX_SIGNED_BODY} bytes"));
    };
    let mut last = None;
    let found = walk_nodes(gw, gw.nodes(), &parts, &bytes, |answer| match answer {
        Ok(resp) if resp.status() == StatusCode::UNAUTHORIZED => {
            last = Some(resp);
            None
        }
        Ok(resp) => Some(resp),
        Err(_) => None,
    })
    .await;
    found.or(last).unwrap_or_else(|| error(dialect, StatusCode::UNAUTHORIZED, "invalid signature, or no sandbox signed this link"))
}

/// What any node answers alike: the first that takes it.
async fn any_node(gw: &Gateway, dialect: Dialect, req: Request) -> Response {
    let mut nodes = gw.nodes();
    if nodes.is_empty() {
        return error(dialect, StatusCode::SERVICE_UNAVAILABLE, "the cluster has no live node");
    }
    // Spread over the nodes; fall back in order if one is away.
    let start = rand::random::<u32>() as usize % nodes.len();
    nodes.rotate_left(start);
    let (parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 64 << 20).await else {
        return error(dialect, StatusCode::PAYLOAD_TOO_LARGE, "body too large for the gateway");
    };
    let mut last = None;
    let found = walk_nodes(gw, nodes, &parts, &bytes, |answer| match answer {
        Ok(resp) => Some(resp),
        Err(e @ proxy::ProxyError::Unreachable { .. }) => {
            last = Some(e);
            None
        }
        Err(e) => Some(proxy_failed(dialect, e)),
    })
    .await;
    found.unwrap_or_else(|| proxy_failed(dialect, last.unwrap_or(proxy::ProxyError::BadRequest("no node".into()))))
}

/// Forward one buffered request to `nodes` in turn until `settle`, shown
/// each node's outcome, returns the answer that ends the walk.
async fn walk_nodes(
    gw: &Gateway,
    nodes: Vec<NodeRecord>,
    parts: &axum::http::request::Parts,
    bytes: &Bytes,
    mut settle: impl FnMut(Result<Response, proxy::ProxyError>) -> Option<Response>,
) -> Option<Response> {
    for node in nodes {
        let req = Request::from_parts(parts.clone(), Body::from(bytes.clone()));
        if let Some(resp) = settle(proxy::forward(&gw.inner.client, &node.name, &node.api, gw.inner.secret.expose(), req).await) {
            return Some(resp);
        }
    }
    None
}
