//! The control plane: E2B's sandbox lifecycle routes over
//! `service::Service`. Handlers parse, call the service, and answer in
//! E2B's shapes (201 for what they make, 204 for what they change).

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::{request::Parts, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::Router;
use protocol::{CreateSandbox, Egress, EgressAllow};
use serde::de::DeserializeOwned;
use service::keys::Caller;
use service::sandbox::SandboxEntry;

use crate::error::ApiError;
use crate::wire::{self, Detail, ForkItem, Metric, NewSandbox, Snapshot};
use crate::{E2b, ENVD_VERSION};

/// Answered as `clientID`: E2B's SDKs require it and use it for nothing.
const CLIENT_ID: &str = "forkbox";
/// Sandboxes a list page holds unless told (and at most).
const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 1000;
/// Most children of one fork call (E2B's limit).
const MAX_FORK: usize = 20;
/// The lifetime E2B gives a sandbox when the create names none.
const DEFAULT_TIMEOUT_SECS: u64 = 300;

pub fn router() -> Router<E2b> {
    Router::new()
        .route("/sandboxes", post(create).get(list_running))
        .route("/v2/sandboxes", post(create).get(list))
        .route("/sandboxes/{id}", get(info).delete(kill))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/resume", post(resume))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/refreshes", post(refresh))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/metrics", get(metrics))
        .route("/sandboxes/{id}/network", put(network))
        .route("/sandboxes/{id}/fork", post(fork))
        .route("/sandboxes/{id}/snapshots", post(snapshot))
        .route("/snapshots", get(snapshots))
        .route("/templates/{id}", delete(delete_snapshot))
        .fallback(|| async { ApiError::not_found("no such route") })
        .method_not_allowed_fallback(|| async { ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed") })
}

/// The caller an `X-API-KEY` stands for.
pub struct Key(pub Caller);

impl FromRequestParts<E2b> for Key {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, e2b: &E2b) -> Result<Self, Self::Rejection> {
        let key = parts.headers.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim);
        e2b.service.inner.keys.resolve(key).map(Key).ok_or_else(ApiError::unauthorized)
    }
}

/// A JSON body, E2B-shaped errors when it is not one; empty means defaults.
pub struct Body<T>(pub T);

impl<T: DeserializeOwned + Default> axum::extract::FromRequest<E2b> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &E2b) -> Result<Self, Self::Rejection> {
        let bytes = bytes::Bytes::from_request(req, state).await.map_err(|e| ApiError::new(e.status(), e.body_text()))?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Body(T::default()));
        }
        let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))?;
        if !v.is_object() {
            return Err(ApiError::bad_request("the request body must be a JSON object"));
        }
        serde_json::from_value(v).map(Body).map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
    }
}

/// E2B's template names for forkbox's built-ins, and back.
fn forkbox_template(e2b_name: &str) -> &str {
    match e2b_name {
        "base" => "default",
        "code-interpreter-v1" | "code-interpreter" => "python-datasci",
        other => other,
    }
}

fn e2b_template(forkbox_name: &str) -> &str {
    match forkbox_name {
        "default" => "base",
        "python-datasci" => "code-interpreter-v1",
        other => other,
    }
}

/// forkbox's egress for E2B's network settings: internet access on or
/// off, or (all traffic denied but an allow-list) the allow-list.
fn egress(allow_internet: Option<bool>, network: Option<&wire::Network>) -> Result<Option<Egress>, ApiError> {
    let allow_internet = allow_internet.or(network.and_then(|n| n.allow_internet_access));
    let Some(n) = network else { return Ok(allow_internet.map(Egress::On)) };
    if n.egress_proxy.is_some() || n.dns_servers.as_ref().is_some_and(|d| !d.is_empty()) {
        return Err(ApiError::bad_request("egressProxy and dnsServers are not offered: the server's operator sets the way out (docs/network.md)"));
    }
    let deny = n.deny_out.clone().unwrap_or_default();
    let allow = n.allow_out.clone().unwrap_or_default();
    let denies_all = deny.iter().any(|d| d == "0.0.0.0/0" || d == "::/0");
    if !deny.is_empty() && !denies_all {
        return Err(ApiError::bad_request(
            "denyOut takes only 0.0.0.0/0 (all traffic), with allowOut for what stays reachable: forkbox's egress is an allow-list",
        ));
    }
    Ok(match (denies_all, allow.is_empty(), allow_internet) {
        (_, _, Some(false)) => Some(Egress::On(false)),
        (true, true, _) => Some(Egress::On(false)),
        (true, false, _) => Some(Egress::Allow(EgressAllow { allow })),
        (false, _, on) => on.map(Egress::On),
    })
}

fn checked_env(vars: BTreeMap<String, String>) -> Result<Vec<(String, String)>, ApiError> {
    for (k, v) in &vars {
        service::sandbox::check_env_var(k, v)?;
    }
    Ok(vars.into_iter().collect())
}

fn rfc3339(unix_ms: u64) -> String {
    crate::wire::rfc3339(unix_ms.min(253_402_300_799_000) as i64) // year 9999: a lifetime without end
}

fn names(entry: &SandboxEntry) -> wire::Names {
    names_of(&entry.id, &entry.settings.template)
}

fn names_of(id: &str, template: &str) -> wire::Names {
    wire::Names { template_id: e2b_template(template).to_string(), sandbox_id: id.to_string(), client_id: CLIENT_ID.into(), alias: Some(template.to_string()) }
}

/// A sandbox as a list shows it: a live one, or one hibernating on disk
/// (which E2B calls paused).
struct Listed {
    info: protocol::SandboxInfo,
    metadata: BTreeMap<String, String>,
}

impl Listed {
    fn live(entry: &SandboxEntry) -> Listed {
        Listed { info: entry.info(), metadata: entry.settings.metadata.clone() }
    }

    fn hibernating(meta: service::spaces::SpaceMeta) -> Listed {
        Listed { info: meta.sandbox, metadata: meta.kept.metadata }
    }

    /// E2B's two states: paused in memory and hibernating are both `paused`.
    fn state(&self) -> &'static str {
        match self.info.state.as_str() {
            "paused" | "hibernated" => "paused",
            _ => "running",
        }
    }
}

impl E2b {
    fn sandbox(&self, entry: &SandboxEntry) -> wire::Sandbox {
        let token = self.tokens.token(&entry.id);
        wire::Sandbox { names: names(entry), envd_version: ENVD_VERSION.into(), envd_access_token: token.clone(), traffic_access_token: token, domain: None }
    }

    fn detail(&self, listed: &Listed) -> Detail {
        let info = &listed.info;
        Detail {
            names: names_of(&info.id, &info.template),
            started_at: rfc3339(info.created_at),
            end_at: rfc3339(info.expires_at),
            envd_version: ENVD_VERSION.into(),
            envd_access_token: self.tokens.token(&info.id),
            cpu_count: cpu_count(),
            memory_mb: info.ram_mib,
            disk_size_mb: info.rootfs_gb * 1024,
            metadata: listed.metadata.clone(),
            state: listed.state(),
            allow_internet_access: !info.egress.is_off(),
            domain: None,
        }
    }
}

/// CPUs a sandbox may use: the host's (forkbox shares them, weighted).
fn cpu_count() -> u32 {
    std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1)
}

async fn create(State(e2b): State<E2b>, Key(caller): Key, Body(req): Body<NewSandbox>) -> Result<Response, ApiError> {
    let asked = req.template_id.clone().unwrap_or_else(|| "base".into());
    let template = forkbox_template(&asked).to_string();
    if req.mcp.is_some() {
        return Err(ApiError::bad_request("the MCP gateway is not offered (docs/e2b.md#not-offered)"));
    }
    if req.volume_mounts.as_ref().is_some_and(|v| !v.is_empty()) {
        return Err(ApiError::bad_request("volume mounts are not offered (docs/e2b.md#not-offered)"));
    }
    let create = CreateSandbox {
        template: Some(template),
        timeout_seconds: Some(req.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS).max(1)),
        egress: egress(req.allow_internet_access, req.network.as_ref())?,
        // One made to pause keeps every process when it does, on disk
        // (hibernation, docs/e2b.md#pause), where the server has criu.
        keep_processes: Some(req.auto_pause && e2b.service.keeps_processes()),
        ..Default::default()
    };
    let mut settings = e2b.service.settings(&create, &caller)?;
    settings.env = checked_env(req.env_vars.unwrap_or_default())?;
    settings.metadata = req.metadata.unwrap_or_default();
    settings.pause_at_timeout = req.auto_pause;
    settings.public_ports = req.network.as_ref().and_then(|n| n.allow_public_traffic).unwrap_or(true);
    let entry = e2b.service.create_with(&caller, settings, None).await?;
    crate::interpreter::prepare(&entry).await;
    Ok((StatusCode::CREATED, axum::Json(e2b.sandbox(&entry))).into_response())
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListQuery {
    metadata: Option<String>,
    state: Option<String>,
    /// E2B's name or forkbox's for the template.
    template: Option<String>,
    /// RFC 3339: only sandboxes started at or after it.
    started_after: Option<String>,
    /// `asc` (oldest first, the default) or `desc`.
    order: Option<String>,
    limit: Option<usize>,
    next_token: Option<String>,
}

/// `k=v&k2=v2`, each part percent-encoded (the SDKs encode it twice; the
/// query extractor undid the outer layer).
fn metadata_filter(raw: Option<&str>) -> Result<Vec<(String, String)>, ApiError> {
    let Some(raw) = raw.filter(|r| !r.is_empty()) else { return Ok(Vec::new()) };
    raw.split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').ok_or_else(|| ApiError::bad_request(format!("metadata filter `{pair}` is not key=value")))?;
            let decode = |s: &str| percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned();
            Ok((decode(k), decode(v)))
        })
        .collect()
}

async fn matching(e2b: &E2b, caller: &Caller, q: &ListQuery, default_states: &[&str]) -> Result<Vec<Listed>, ApiError> {
    let filter = metadata_filter(q.metadata.as_deref())?;
    let states: Vec<String> = match &q.state {
        Some(s) => s.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect(),
        None => default_states.iter().map(|s| s.to_string()).collect(),
    };
    if let Some(bad) = states.iter().find(|s| *s != "running" && *s != "paused") {
        return Err(ApiError::bad_request(format!("state must be running or paused, not `{bad}`")));
    }
    let after_ms = match q.started_after.as_deref().filter(|s| !s.is_empty()) {
        Some(t) => Some(
            chrono::DateTime::parse_from_rfc3339(t)
                .map_err(|e| ApiError::bad_request(format!("startedAfter `{t}` is not an RFC 3339 time: {e}")))?
                .timestamp_millis(),
        ),
        None => None,
    };
    let descending = match q.order.as_deref() {
        None | Some("") | Some("asc") => false,
        Some("desc") => true,
        Some(other) => return Err(ApiError::bad_request(format!("order must be asc or desc, not `{other}`"))),
    };
    let template = q.template.as_deref().filter(|t| !t.is_empty());
    let mut all: Vec<Listed> = e2b.service.list(caller).await.iter().map(|e| Listed::live(e)).collect();
    if states.iter().any(|s| s == "paused") {
        all.extend(e2b.service.hibernating_all(caller).await.into_iter().map(Listed::hibernating));
    }
    all.retain(|e| {
        states.iter().any(|s| s == e.state())
            && filter.iter().all(|(k, v)| e.metadata.get(k) == Some(v))
            && template.is_none_or(|t| t == e.info.template || t == e2b_template(&e.info.template))
            && after_ms.is_none_or(|ms| e.info.created_at as i64 >= ms)
    });
    all.sort_by(|a, b| (a.info.created_at, &a.info.id).cmp(&(b.info.created_at, &b.info.id)));
    if descending {
        all.reverse();
    }
    Ok(all)
}

async fn list(State(e2b): State<E2b>, Key(caller): Key, q: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>) -> Result<Response, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let limit = q.limit.unwrap_or(DEFAULT_PAGE);
    if limit == 0 || limit > MAX_PAGE {
        return Err(ApiError::bad_request(format!("limit must be between 1 and {MAX_PAGE}")));
    }
    let all = matching(&e2b, &caller, &q, &["running", "paused"]).await?;
    // The token is the id the next page starts at.
    let start = match &q.next_token {
        Some(t) if !t.is_empty() => all.iter().position(|e| &e.info.id == t).ok_or_else(|| ApiError::bad_request("invalid nextToken"))?,
        _ => 0,
    };
    let page: Vec<Detail> = all.iter().skip(start).take(limit).map(|e| e2b.detail(e)).collect();
    let mut resp = axum::Json(page).into_response();
    if let Some(next) = all.get(start + limit) {
        if let Ok(v) = HeaderValue::from_str(&next.info.id) {
            resp.headers_mut().insert("x-next-token", v);
        }
    }
    Ok(resp)
}

/// The old `GET /sandboxes`: running sandboxes, one page.
async fn list_running(
    State(e2b): State<E2b>,
    Key(caller): Key,
    q: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let all = matching(&e2b, &caller, &ListQuery { state: None, ..q }, &["running"]).await?;
    Ok(axum::Json(all.iter().map(|e| e2b.detail(e)).collect::<Vec<_>>()).into_response())
}

async fn info(State(e2b): State<E2b>, Key(caller): Key, Path(id): Path<String>) -> Result<Response, ApiError> {
    // A hibernating sandbox is looked at, not woken.
    if let Some(meta) = e2b.service.hibernating(&caller, &id).await {
        return Ok(axum::Json(e2b.detail(&Listed::hibernating(meta))).into_response());
    }
    let entry = e2b.service.get(&caller, &id).await?;
    Ok(axum::Json(e2b.detail(&Listed::live(&entry))).into_response())
}

/// Whether sandbox `id` is paused, in memory or hibernating (looked at,
/// not woken).
async fn is_paused(e2b: &E2b, caller: &Caller, id: &str) -> Result<bool, ApiError> {
    if e2b.service.hibernating(caller, id).await.is_some() {
        return Ok(true);
    }
    Ok(e2b.service.get(caller, id).await?.engine.is_paused())
}

async fn kill(State(e2b): State<E2b>, Key(caller): Key, Path(id): Path<String>) -> Result<Response, ApiError> {
    e2b.service.destroy(&caller, &id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Connect (and resume): a paused sandbox runs again (201), a running one
/// is answered as it is (200); a timeout given becomes its new lifetime.
async fn connect(State(e2b): State<E2b>, Key(caller): Key, Path(id): Path<String>, Body(req): Body<wire::Connect>) -> Result<Response, ApiError> {
    let was_paused = is_paused(&e2b, &caller, &id).await?;
    // (A hibernating sandbox wakes here.)
    let entry = e2b.service.get(&caller, &id).await?;
    e2b.service.resume(&caller, &id).await?;
    if let Some(secs) = req.timeout {
        e2b.service.set_timeout(&caller, &id, Duration::from_secs(secs.max(1))).await?;
    } else if entry.expires_at() == u64::MAX {
        // Paused at the end of its lifetime: it gets a new one.
        e2b.service.set_timeout(&caller, &id, Duration::from_secs(DEFAULT_TIMEOUT_SECS)).await?;
    }
    let status = if was_paused { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, axum::Json(e2b.sandbox(&entry))).into_response())
}

/// The old resume: 409 unless it is paused.
async fn resume(state: State<E2b>, key: Key, Path(id): Path<String>, body: Body<wire::Connect>) -> Result<Response, ApiError> {
    if !is_paused(&state.0, &key.0, &id).await? {
        return Err(ApiError::new(StatusCode::CONFLICT, format!("sandbox {id} is not paused")));
    }
    let mut resp = connect(state, key, Path(id), body).await?;
    *resp.status_mut() = StatusCode::CREATED;
    Ok(resp)
}

async fn set_timeout(
    State(e2b): State<E2b>,
    Key(caller): Key,
    Path(id): Path<String>,
    body: Result<axum::Json<wire::Timeout>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    let axum::Json(req) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    e2b.service.set_timeout(&caller, &id, Duration::from_secs(req.timeout.max(1))).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Default, serde::Deserialize)]
struct Refresh {
    duration: Option<u64>,
}

async fn refresh(State(e2b): State<E2b>, Key(caller): Key, Path(id): Path<String>, Body(req): Body<Refresh>) -> Result<Response, ApiError> {
    let secs = req.duration.unwrap_or(60);
    if secs > 3600 {
        return Err(ApiError::bad_request("duration must be at most 3600 seconds"));
    }
    e2b.service.set_timeout(&caller, &id, Duration::from_secs(secs.max(1))).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Pause: a sandbox that keeps its processes hibernates (to disk, every
/// process kept, its memory freed) when criu can keep them all; else it is
/// paused in memory (docs/e2b.md#pause).
async fn pause(State(e2b): State<E2b>, Key(caller): Key, Path(id): Path<String>) -> Result<Response, ApiError> {
    if is_paused(&e2b, &caller, &id).await? {
        return Err(ApiError::new(StatusCode::CONFLICT, format!("sandbox {id} is already paused")));
    }
    e2b.service.pause_keeping_processes(&caller, &id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn metrics(State(e2b): State<E2b>, Key(caller): Key, Path(id): Path<String>) -> Result<Response, ApiError> {
    let entry = e2b.service.get(&caller, &id).await?;
    let now = chrono::Utc::now();
    let info = entry.info();
    let lived = (now.timestamp_millis() as u64).saturating_sub(entry.created_at).max(1) as f64 / 1000.0;
    let cpus = cpu_count();
    let metric = Metric {
        timestamp: now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        timestamp_unix: now.timestamp(),
        cpu_count: cpus,
        // Its average since it started, as a share of the host's CPUs.
        cpu_used_pct: (info.cpu_seconds / lived / cpus as f64 * 100.0).clamp(0.0, 100.0),
        mem_used: info.memory_bytes,
        mem_total: entry.settings.ram_mib << 20,
        mem_cache: 0,
        disk_used: 0,
        disk_total: entry.settings.rootfs_gb << 30,
    };
    Ok(axum::Json(vec![metric]).into_response())
}

async fn network(State(e2b): State<E2b>, Key(caller): Key, Path(id): Path<String>, Body(req): Body<wire::Network>) -> Result<Response, ApiError> {
    // The whole configuration is replaced: what it leaves out means the default (on).
    let egress = egress(None, Some(&req))?.unwrap_or(Egress::On(true));
    e2b.service.set_egress(&caller, &id, &egress).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn fork(State(e2b): State<E2b>, Key(caller): Key, Path(id): Path<String>, Body(req): Body<wire::Fork>) -> Result<Response, ApiError> {
    let n = req.count.unwrap_or(1);
    if !(1..=MAX_FORK).contains(&n) {
        return Err(ApiError::bad_request(format!("count must be between 1 and {MAX_FORK}")));
    }
    let ids = e2b.service.fork(&caller, &id, n).await?;
    let mut items = Vec::with_capacity(ids.len());
    for child in ids {
        let item = match e2b.service.get(&caller, &child).await {
            Ok(entry) => {
                if let Some(secs) = req.timeout {
                    let _ = e2b.service.set_timeout(&caller, &child, Duration::from_secs(secs.max(1))).await;
                }
                ForkItem { sandbox: Some(e2b.sandbox(&entry)), error: None }
            }
            Err(e) => {
                let e = ApiError::from(e);
                ForkItem { sandbox: None, error: Some(serde_json::json!({"code": e.status.as_u16(), "message": e.message})) }
            }
        };
        items.push(item);
    }
    Ok((StatusCode::CREATED, axum::Json(items)).into_response())
}

/// A snapshot is a template saved from the sandbox: `Sandbox.create(snapshotID)` starts from it.
async fn snapshot(State(e2b): State<E2b>, Key(caller): Key, Path(id): Path<String>, Body(req): Body<wire::NewSnapshot>) -> Result<Response, ApiError> {
    let name = match req.name {
        Some(n) if !n.is_empty() => n,
        _ => format!("snapshot-{}", &service::ids::new_id()[3..15]),
    };
    let description = format!("E2B snapshot of {id}");
    let saved = e2b.service.save_template(&caller, &id, protocol::SaveTemplate { name, description }).await?;
    Ok((StatusCode::CREATED, axum::Json(Snapshot { snapshot_id: saved.name.clone(), names: vec![saved.name] })).into_response())
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct SnapshotQuery {
    #[serde(rename = "sandboxID")]
    sandbox_id: Option<String>,
    name: Option<String>,
}

async fn snapshots(
    State(e2b): State<E2b>,
    Key(caller): Key,
    q: Result<Query<SnapshotQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let from = q.sandbox_id.map(|id| format!("E2B snapshot of {id}"));
    let list: Vec<Snapshot> = e2b
        .service
        .template_list(&caller)
        .await?
        .into_iter()
        .filter(|t| t.kind == "saved" && t.description.starts_with("E2B snapshot of "))
        .filter(|t| from.as_ref().is_none_or(|f| &t.description == f) && q.name.as_ref().is_none_or(|n| &t.name == n))
        .map(|t| Snapshot { snapshot_id: t.name.clone(), names: vec![t.name] })
        .collect();
    Ok(axum::Json(list).into_response())
}

async fn delete_snapshot(State(e2b): State<E2b>, Key(caller): Key, Path(id): Path<String>) -> Result<Response, ApiError> {
    e2b.service.delete_template(&caller, &id, false).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_map_both_ways() {
        assert_eq!(forkbox_template("base"), "default");
        assert_eq!(forkbox_template("code-interpreter-v1"), "python-datasci");
        assert_eq!(forkbox_template("mine"), "mine");
        assert_eq!(e2b_template("python-datasci"), "code-interpreter-v1");
    }

    #[test]
    fn networks_become_egress() {
        let net = |allow: &[&str], deny: &[&str]| wire::Network {
            allow_out: Some(allow.iter().map(|s| s.to_string()).collect()),
            deny_out: Some(deny.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        };
        assert_eq!(egress(None, None).unwrap(), None);
        assert_eq!(egress(Some(false), None).unwrap(), Some(Egress::On(false)));
        assert_eq!(egress(None, Some(&net(&["pypi.org"], &["0.0.0.0/0"]))).unwrap(), Some(Egress::Allow(EgressAllow { allow: vec!["pypi.org".into()] })));
        assert_eq!(egress(None, Some(&net(&[], &["0.0.0.0/0"]))).unwrap(), Some(Egress::On(false)));
        assert!(egress(None, Some(&net(&[], &["10.0.0.0/8"]))).is_err());
        assert_eq!(egress(Some(false), Some(&net(&["pypi.org"], &["0.0.0.0/0"]))).unwrap(), Some(Egress::On(false)));
    }

    #[test]
    fn metadata_filters_decode_each_part() {
        assert_eq!(metadata_filter(Some("a%3Db=1&user=x%26y")).unwrap(), vec![("a=b".into(), "1".into()), ("user".into(), "x&y".into())]);
        assert!(metadata_filter(Some("novalue")).is_err());
        assert!(metadata_filter(None).unwrap().is_empty());
    }

    #[test]
    fn times_are_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert!(rfc3339(u64::MAX).starts_with("9999-12-31"));
    }
}
