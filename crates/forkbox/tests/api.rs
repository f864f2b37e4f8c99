//! The HTTP API driven through `server::app` (no socket) against a real
//! engine and real sandboxes: routes, status codes, JSON errors at every
//! limit's edge, auth, and the OpenAPI description.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

struct Fixture {
    state: server::AppState,
}

static F: OnceLock<Fixture> = OnceLock::new();

extern "C" fn close_engine() {
    if let Some(f) = F.get() {
        let _ = f.state.inner.engine.close();
    }
}

/// One engine per test binary (it locks its state directory, and is closed
/// when the process exits); templates come from the machine's built ones
/// (`forkbox template build default`).
fn fixture() -> &'static Fixture {
    F.get_or_init(|| {
        // SAFETY: registering a plain extern "C" function.
        unsafe { libc::atexit(close_engine) };
        let state_dir = PathBuf::from("/var/lib/forkbox-test-api");
        let templates_dir = PathBuf::from(std::env::var("FORKBOX_TEMPLATES_DIR").unwrap_or_else(|_| "/var/lib/forkbox/templates".into()));
        let config = server::ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            state_dir: state_dir.clone(),
            templates_dir: templates_dir.clone(),
            debian: Default::default(),
            api_keys: vec![],
            key_limits: Default::default(),
            limits: server::SandboxLimits { max_ram_mib: 4096, ..Default::default() },
            // Allocated in full and kept between runs: small, as the e2e servers' are.
            volume: jail::volume::VolumeSize::up_to_gib(4),
            host_cas: None,
            egress_proxy: None,
            build_templates: false,
            shim_exe: PathBuf::from(env!("CARGO_BIN_EXE_forkbox")),
            warm_pool: false,
            pool_idle: Duration::from_secs(600),
            max_pools: 32,
            default_egress: false,
            idle_pause: None,
            orphan_grace: std::time::Duration::ZERO,
            cpu_boost: 1,
            lazy_resume: false,
            directory: Default::default(),
            cluster_secret_sha256: None,
            criu: criu::Readiness::Unavailable("not probed in tests".into()),
            drain: std::time::Duration::from_secs(30),
        };
        let jail =
            jail::Jail::open_clean(jail::JailConfig { volume: config.volume, ..jail::JailConfig::new(state_dir, config.shim_exe.clone(), 4) }).expect("engine");
        let templates = server::Templates::new(templates_dir, &config.state_dir.join("custom-templates"), config.debian);
        templates.scan();
        assert!(templates.is_ready("default"), "build the default template first: forkbox template build default");
        Fixture { state: server::AppState::new(config, jail, templates) }
    })
}

fn app() -> axum::Router {
    server::app(fixture().state.clone())
}

async fn call(app: axum::Router, method: &str, uri: &str, body: Option<Body>) -> (StatusCode, Vec<u8>) {
    let mut req = Request::builder().method(method).uri(uri);
    if body.is_some() {
        req = req.header("content-type", "application/json");
    }
    let resp = app.oneshot(req.body(body.unwrap_or_else(Body::empty)).unwrap()).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes().to_vec();
    (status, bytes)
}

async fn call_json(method: &str, uri: &str, body: Value) -> (StatusCode, Value) {
    let (s, b) = call(app(), method, uri, Some(Body::from(body.to_string()))).await;
    (s, serde_json::from_slice(&b).unwrap_or(Value::Null))
}

async fn create() -> String {
    let (s, v) = call_json("POST", "/v1/sandboxes", json!({})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["state"], "ready");
    v["id"].as_str().unwrap().to_string()
}

async fn exec(id: &str, body: Value) -> (StatusCode, Vec<Value>) {
    let (s, b) = call(app(), "POST", &format!("/v1/sandboxes/{id}/exec"), Some(Body::from(body.to_string()))).await;
    let events = b.split(|c| *c == b'\n').filter(|l| !l.is_empty()).filter_map(|l| serde_json::from_slice(l).ok()).collect();
    (s, events)
}

fn assert_json_error(status: StatusCode, body: &Value, expected: StatusCode) {
    assert_eq!(status, expected, "{body}");
    assert!(body["error"].as_str().is_some_and(|e| !e.is_empty()), "not a JSON error: {body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn create_exec_delete_round_trip() {
    let id = create().await;
    let (s, events) = exec(&id, json!({"code": "x = 2\nprint('hi')\nx * 21"})).await;
    assert_eq!(s, StatusCode::OK);
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["stdout", "result", "exit"]);
    assert_eq!(events[0]["data"], "hi");
    assert_eq!(events[0]["nl"], true);
    assert_eq!(events[1]["data"], "42");
    assert_eq!(events[2]["data"], 0);
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["seq"], i as u64);
        assert!(e["ts"].as_u64().unwrap() > 1_700_000_000_000);
    }
    let (s, info) = call_json("GET", &format!("/v1/sandboxes/{id}"), Value::Null).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(info["execs"], 1);
    assert_eq!(info["template"], "default");
    let (s, replay) = call(app(), "GET", &format!("/v1/sandboxes/{id}/replay"), None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(String::from_utf8_lossy(&replay).lines().count(), 3);
    let (s, _) = call(app(), "DELETE", &format!("/v1/sandboxes/{id}"), None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    for (m, u) in [("GET", format!("/v1/sandboxes/{id}")), ("DELETE", format!("/v1/sandboxes/{id}")), ("GET", format!("/v1/sandboxes/{id}/replay"))] {
        let (s, b) = call(app(), m, &u, None).await;
        assert_json_error(s, &serde_json::from_slice(&b).unwrap(), StatusCode::NOT_FOUND);
    }
    let (s, events) = exec(&id, json!({"code": "1"})).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{events:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_create_requests_get_clear_errors() {
    for (body, expected) in [
        (json!({"ram_mib": 63}), StatusCode::BAD_REQUEST),
        (json!({"ram_mib": 4097}), StatusCode::BAD_REQUEST),
        (json!({"rootfs_gb": 0}), StatusCode::BAD_REQUEST),
        (json!({"timeout_seconds": 0}), StatusCode::BAD_REQUEST),
        (json!({"template": "no-such-template"}), StatusCode::NOT_FOUND),
        (json!({"nonsense": 1}), StatusCode::BAD_REQUEST),
        (json!({"ram_mib": "lots"}), StatusCode::BAD_REQUEST),
        (json!({"egress": "yes"}), StatusCode::BAD_REQUEST),
        (json!({"egress": {"allow": ["not a domain"]}}), StatusCode::BAD_REQUEST),
        (json!({"egress": {"allow": [], "deny": []}}), StatusCode::BAD_REQUEST),
        (json!({"persistent": "yes"}), StatusCode::BAD_REQUEST),
    ] {
        let (s, v) = call_json("POST", "/v1/sandboxes", body.clone()).await;
        assert_json_error(s, &v, expected);
    }
    let (s, b) = call(app(), "POST", "/v1/sandboxes", Some(Body::from("{not json"))).await;
    assert_json_error(s, &serde_json::from_slice(&b).unwrap(), StatusCode::BAD_REQUEST);
    // The lower edge of ram_mib is accepted.
    let (s, v) = call_json("POST", "/v1/sandboxes", json!({"ram_mib": 64, "egress": false})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let (s, _) = call(app(), "DELETE", &format!("/v1/sandboxes/{id}"), None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_exec_requests_get_clear_errors() {
    let id = create().await;
    let uri = format!("/v1/sandboxes/{id}/exec");
    for (body, expected) in [
        (json!({"code": "1", "language": "cobol"}), StatusCode::BAD_REQUEST),
        (json!({"language": "python"}), StatusCode::BAD_REQUEST),
        (json!({"code": 5}), StatusCode::BAD_REQUEST),
        (json!({"code": "1", "timeout_ms": 0}), StatusCode::BAD_REQUEST),
        (json!({"code": "1", "extra": true}), StatusCode::BAD_REQUEST),
        (json!(["print(1)"]), StatusCode::BAD_REQUEST),
    ] {
        let (s, v) = call_json("POST", &uri, body).await;
        assert_json_error(s, &v, expected);
    }
    let (s, b) = call(app(), "POST", &uri, Some(Body::from("]"))).await;
    assert_json_error(s, &serde_json::from_slice(&b).unwrap(), StatusCode::BAD_REQUEST);
    // Code limit: 10 MiB is accepted and runs; one byte more is 413.
    let limit = protocol::MAX_CODE_BYTES;
    let at_limit = format!("x = 1\n#{}", "a".repeat(limit - 7));
    assert_eq!(at_limit.len(), limit);
    let (s, events) = exec(&id, json!({"code": at_limit})).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(events.last().unwrap()["data"], 0, "{:?}", events.last());
    let over = "#".repeat(limit + 1);
    let (s, v) = call_json("POST", &uri, json!({"code": over})).await;
    assert_json_error(s, &v, StatusCode::PAYLOAD_TOO_LARGE);
    // A body far beyond any code limit is refused before it is parsed.
    let huge = vec![b' '; protocol::MAX_CODE_BYTES * 3];
    let (s, b) = call(app(), "POST", &uri, Some(Body::from(huge))).await;
    assert_json_error(s, &serde_json::from_slice(&b).unwrap(), StatusCode::PAYLOAD_TOO_LARGE);
    // Ids: malformed is 400, well-formed but unknown is 404.
    let (s, v) = call_json("POST", &format!("/v1/sandboxes/{}/exec", "x".repeat(100)), json!({"code": "1"})).await;
    assert_json_error(s, &v, StatusCode::BAD_REQUEST);
    let (s, v) = call_json("POST", "/v1/sandboxes/sb-doesnotexist/exec", json!({"code": "1"})).await;
    assert_json_error(s, &v, StatusCode::NOT_FOUND);
    // After all that the sandbox and server still work.
    let (s, events) = exec(&id, json!({"code": "print(x)"})).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(events[0]["data"], "1");
    call(app(), "DELETE", &format!("/v1/sandboxes/{id}"), None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_routes_and_methods_answer_json() {
    let (s, b) = call(app(), "GET", "/v1/nope", None).await;
    assert_json_error(s, &serde_json::from_slice(&b).unwrap(), StatusCode::NOT_FOUND);
    let (s, b) = call(app(), "PUT", "/v1/sandboxes", None).await;
    assert_json_error(s, &serde_json::from_slice(&b).unwrap(), StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test(flavor = "multi_thread")]
async fn openapi_describes_every_route() {
    let (s, b) = call(app(), "GET", "/v1/openapi.json", None).await;
    assert_eq!(s, StatusCode::OK);
    let doc: Value = serde_json::from_slice(&b).unwrap();
    let paths = doc["paths"].as_object().unwrap();
    for p in [
        "/v1/healthz",
        "/v1/sandboxes",
        "/v1/sandboxes/{id}",
        "/v1/sandboxes/{id}/exec",
        "/v1/sandboxes/{id}/replay",
        "/v1/sandboxes/{id}/fork",
        "/v1/sandboxes/{id}/merge_into/{winner}",
        "/v1/sandboxes/{id}/diff/{other}",
        "/v1/templates",
        "/v1/pool",
        "/v1/sandboxes/{id}/ports/{port}/{path}",
    ] {
        assert!(paths.contains_key(p), "{p} missing from openapi.json");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn api_keys_are_required_when_configured() {
    let f = fixture();
    let mut config = f.state.inner.config.clone();
    config.api_keys = vec![server::keys::KeyHash::of("s3cret")];
    // Same engine and templates, a router that demands the key.
    let state = server::AppState { inner: f.state.inner.clone() };
    let keyed = server::app(server::AppState::with_config(&state, config));
    for auth in [None, Some("Bearer wrong"), Some("s3cret")] {
        let mut req = Request::builder().uri("/v1/sandboxes");
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let resp = keyed.clone().oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{auth:?}");
    }
    let req = Request::builder().uri("/v1/sandboxes").header("authorization", "Bearer s3cret").body(Body::empty()).unwrap();
    assert_eq!(keyed.clone().oneshot(req).await.unwrap().status(), StatusCode::OK);
    let req = Request::builder().uri("/v1/healthz").body(Body::empty()).unwrap();
    assert_eq!(keyed.oneshot(req).await.unwrap().status(), StatusCode::OK);
    assert!(server::check_exposure(&"0.0.0.0:7070".parse().unwrap(), false).is_err());
    assert!(server::check_exposure(&"0.0.0.0:7070".parse().unwrap(), true).is_ok());
    assert!(server::check_exposure(&"127.0.0.1:7070".parse().unwrap(), false).is_ok());
}

#[tokio::test(flavor = "multi_thread")]
async fn bash_and_python_share_files_but_not_shell_state() {
    let id = create().await;
    let (_, ev) = exec(&id, json!({"code": "export X=1; echo data > /root/f.txt; pwd", "language": "bash"})).await;
    assert_eq!(ev[0]["data"], "/root");
    let (_, ev) = exec(&id, json!({"code": "echo \"[$X]\"", "language": "bash"})).await;
    assert_eq!(ev[0]["data"], "[]");
    let (_, ev) = exec(&id, json!({"code": "open('/root/f.txt').read().strip()"})).await;
    assert_eq!(ev[0]["data"], "'data'");
    let started = std::time::Instant::now();
    let (_, ev) = exec(&id, json!({"code": "sleep 30 & echo bg", "language": "bash"})).await;
    assert_eq!(ev.last().unwrap()["data"], 0);
    assert!(started.elapsed() < Duration::from_secs(10), "a background child held the call open");
    call(app(), "DELETE", &format!("/v1/sandboxes/{id}"), None).await;
}
