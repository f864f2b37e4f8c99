//! Properties of request-body parsing (docs/reliability.md#fuzzing): any
//! body, of any content type, gives the handler a value or a 4xx JSON error,
//! never a panic or a 5xx. The extractors are driven directly, without a
//! server or an engine.

use axum::body::Body;
use axum::extract::{FromRequest, Request};
use axum::http::header;
use axum::response::IntoResponse;
use proptest::prelude::*;
use serde_json::{Map, Value};

use super::{optional_body, parse_object, Json};
use crate::error::ApiError;

/// Every field name of every request body, so random objects often hit real fields.
const FIELDS: &[&str] = &[
    "template",
    "timeout_seconds",
    "idle_timeout_seconds",
    "ram_mib",
    "rootfs_gb",
    "persistent",
    "egress",
    "allow",
    "code",
    "language",
    "timeout_ms",
    "n",
    "checkpoint",
    "path",
    "mode",
    "from",
    "to",
    "overwrite",
    "shellCmd",
    "argv",
    "cols",
    "rows",
    "env",
    "cwd",
    "data_b64",
    "since_seq",
    "max_bytes",
];

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (0u64..100).prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
        prop_oneof![Just("python"), Just("bash"), Just("default"), Just("644"), Just("0o755"), Just("/tmp/x"), Just("aGk=")].prop_map(Value::from),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![4 => proptest::sample::select(FIELDS).prop_map(str::to_string), 1 => ".{0,8}"]
}

/// Any JSON value, objects weighted towards the request bodies' fields.
fn json_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            proptest::collection::btree_map(key(), inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// A request body's bytes: JSON (maybe cut short), or anything.
fn body_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        json_value().prop_map(|v| serde_json::to_vec(&v).unwrap_or_default()),
        (json_value(), any::<proptest::sample::Index>()).prop_map(|(v, at)| {
            let b = serde_json::to_vec(&v).unwrap_or_default();
            b[..at.index(b.len() + 1)].to_vec()
        }),
        proptest::collection::vec(any::<u8>(), 0..64),
        Just(b" \n\t".to_vec()),
    ]
}

fn content_type() -> impl Strategy<Value = Option<&'static str>> {
    proptest::sample::select(vec![
        Some("application/json"),
        Some("application/json; charset=utf-8"),
        Some("application/vnd.api+json"),
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        None,
    ])
}

/// A rejection must be the client's fault, answered as such.
fn assert_client_error(e: ApiError) -> Result<(), TestCaseError> {
    let status = e.into_response().status();
    prop_assert!(status == 400 || status == 413, "a body was answered {}", status);
    Ok(())
}

/// Run the `Json<T>` extractor of the handlers on one request.
fn extract<T: serde::de::DeserializeOwned>(body: &[u8], ct: Option<&str>) -> Result<T, ApiError> {
    let mut req = Request::builder().method("POST").uri("/");
    if let Some(ct) = ct {
        req = req.header(header::CONTENT_TYPE, ct);
    }
    let req = req.body(Body::from(body.to_vec())).expect("a valid request");
    futures::executor::block_on(Json::<T>::from_request(req, &())).map(|Json(v)| v)
}

/// Every `Json<T>` body type of the routes: Ok or a client error.
fn check_all(body: &[u8], ct: Option<&str>) -> Result<(), TestCaseError> {
    macro_rules! each {
        ($($t:ty),*) => {$(
            if let Err(e) = extract::<$t>(body, ct) {
                assert_client_error(e)?;
            }
        )*};
    }
    each!(
        protocol::ExecRequest,
        protocol::ForkRequest,
        protocol::RestoreRequest,
        protocol::EgressBody,
        protocol::MkdirRequest,
        protocol::RenameRequest,
        protocol::ChmodRequest,
        crate::routes::pty::PtyCreate,
        crate::routes::pty::PtyInput,
        crate::routes::pty::PtyResize,
        crate::routes::pty::PtyRead
    );
    Ok(())
}

/// A CreateSandbox-shaped object: the right fields, mostly the right types.
fn create_object() -> impl Strategy<Value = Value> {
    let egress =
        prop_oneof![any::<bool>().prop_map(Value::from), proptest::collection::vec(".{0,12}", 0..3).prop_map(|a| serde_json::json!({ "allow": a })), leaf(),];
    let field = prop_oneof![
        ".{0,12}".prop_map(|t| ("template".to_string(), Value::from(t))),
        (proptest::sample::select(&["timeout_seconds", "idle_timeout_seconds", "ram_mib", "rootfs_gb"][..]), any::<u64>())
            .prop_map(|(k, n)| (k.to_string(), Value::from(n))),
        any::<bool>().prop_map(|b| ("persistent".to_string(), Value::from(b))),
        egress.prop_map(|e| ("egress".to_string(), e)),
        (key(), leaf()),
    ];
    proptest::collection::vec(field, 0..7).prop_map(|f| Value::Object(f.into_iter().collect()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn any_body_is_a_value_or_a_client_error(body in body_bytes(), ct in content_type()) {
        check_all(&body, ct)?;
        // The bodies that may be left out (create, resume).
        let bytes = Ok(bytes::Bytes::from(body.clone()));
        if let Err(e) = optional_body::<protocol::CreateSandbox>(bytes) {
            assert_client_error(e)?;
        }
        if let Err(e) = optional_body::<protocol::ResumeSpace>(Ok(bytes::Bytes::from(body))) {
            assert_client_error(e)?;
        }
    }

    #[test]
    fn any_json_value_is_a_value_or_a_client_error(v in json_value()) {
        check_all(&serde_json::to_vec(&v).unwrap_or_default(), Some("application/json"))?;
        if let Err(e) = parse_object::<protocol::CreateSandbox>(v) {
            assert_client_error(e)?;
        }
    }

    #[test]
    fn an_accepted_create_round_trips(v in create_object()) {
        let Ok(req) = parse_object::<protocol::CreateSandbox>(v.clone()) else { return Ok(()) };
        // What was accepted means what was sent: nothing dropped or altered...
        let sent: Map<String, Value> = v.as_object().into_iter().flatten().filter(|(_, x)| !x.is_null()).map(|(k, x)| (k.clone(), x.clone())).collect();
        let back = serde_json::to_value(&req).expect("serializable");
        let kept: Map<String, Value> = back.as_object().into_iter().flatten().filter(|(_, x)| !x.is_null()).map(|(k, x)| (k.clone(), x.clone())).collect();
        prop_assert_eq!(&kept, &sent);
        // ...and it parses again to the same request.
        let again = parse_object::<protocol::CreateSandbox>(back.clone()).expect("a serialized request parses");
        prop_assert_eq!(serde_json::to_value(&again).expect("serializable"), back);
    }

    #[test]
    fn octal_modes_parse_or_fail_cleanly(s in ".{0,12}", n in 0u32..0o10000) {
        let _ = protocol::parse_octal_mode(&s);
        prop_assert_eq!(protocol::parse_octal_mode(&format!("{n:o}")), Ok(n));
        prop_assert_eq!(protocol::parse_octal_mode(&format!("0o{n:o}")), Ok(n));
    }
}
