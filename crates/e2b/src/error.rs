//! The E2B front end's two error shapes, each mapped from the service's
//! errors in one place: the control plane answers `{"code": <status>,
//! "message"}` (the SDKs read `code` to tell 404 and 409 apart), envd
//! answers Connect errors (`{"code": "not_found", "message"}`), as a unary
//! response's status and body or inside a stream's end frame.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use service::Error;

/// A control-plane or envd REST failure: its HTTP status and message.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into() }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, "missing or invalid API key (X-API-KEY)")
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> ApiError {
        let status = match &e {
            Error::Invalid(_) => StatusCode::BAD_REQUEST,
            Error::NotFound(_) => StatusCode::NOT_FOUND,
            Error::Conflict(_) => StatusCode::CONFLICT,
            Error::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Error::Capacity(_) | Error::Quota(_) => StatusCode::TOO_MANY_REQUESTS,
            Error::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
            Error::NoSpace(_) => StatusCode::INSUFFICIENT_STORAGE,
            Error::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Error::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError { status, message: e.to_string() }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"code": self.status.as_u16(), "message": self.message});
        let mut resp = (self.status, axum::Json(body)).into_response();
        // The SDKs retry 429/502/503/504 unless told not to; a create the
        // server refused for its caps or a key's quota will not succeed
        // a few hundred milliseconds later.
        if matches!(self.status, StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE) {
            resp.headers_mut().insert("should-retry", HeaderValue::from_static("false"));
        }
        resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        resp
    }
}

/// Connect's error codes (connectrpc.com/docs/protocol#error-codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Unimplemented,
    Internal,
    Unavailable,
    Unauthenticated,
}

impl Code {
    pub fn name(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error with this code.
    pub fn status(self) -> StatusCode {
        match self {
            Code::Canceled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            Code::Unknown | Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }
}

/// An envd RPC failure.
#[derive(Debug)]
pub struct RpcError {
    pub code: Code,
    pub message: String,
}

impl RpcError {
    pub fn new(code: Code, message: impl Into<String>) -> RpcError {
        RpcError { code, message: message.into() }
    }

    pub fn invalid(message: impl Into<String>) -> RpcError {
        RpcError::new(Code::InvalidArgument, message)
    }

    /// The JSON a stream's end frame or a unary body carries.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({"code": self.code.name(), "message": self.message})
    }
}

impl From<Error> for RpcError {
    fn from(e: Error) -> RpcError {
        let code = match &e {
            Error::Invalid(_) => Code::InvalidArgument,
            Error::NotFound(_) => Code::NotFound,
            // envd's own words for "exists already" (MakeDir, Move).
            Error::Conflict(m) if m.contains("exists") => Code::AlreadyExists,
            Error::Conflict(_) => Code::FailedPrecondition,
            Error::TooLarge(_) | Error::Capacity(_) | Error::Quota(_) | Error::NoSpace(_) => Code::ResourceExhausted,
            Error::Unsupported(_) => Code::Unimplemented,
            Error::Unavailable { .. } => Code::Unavailable,
            Error::Internal(_) => Code::Internal,
        };
        RpcError { code, message: e.to_string() }
    }
}

impl IntoResponse for RpcError {
    fn into_response(self) -> Response {
        (self.code.status(), axum::Json(self.json())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_errors_carry_their_status_as_code() {
        let e = ApiError::from(Error::NotFound("sandbox `x` not found".into()));
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        let resp = e.into_response();
        assert_eq!(resp.status(), 404);
        let quota = ApiError::from(Error::Capacity("full".into())).into_response();
        assert_eq!(quota.headers()["should-retry"], "false");
    }

    #[test]
    fn rpc_codes_map_as_connect_says() {
        assert_eq!(RpcError::from(Error::NotFound("x".into())).code, Code::NotFound);
        assert_eq!(RpcError::from(Error::Conflict("/a: exists already".into())).code, Code::AlreadyExists);
        assert_eq!(Code::NotFound.status(), 404);
        assert_eq!(Code::Unimplemented.status(), 501);
        assert_eq!(RpcError::invalid("bad").json(), serde_json::json!({"code": "invalid_argument", "message": "bad"}));
    }
}
