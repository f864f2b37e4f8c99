//! `ApiError`: every failure a handler can answer, mapped to a status and a
//! JSON body `{"error": "..."}`: the service's errors (converted here, in
//! one place) and the HTTP side's own (auth, bodies, the port proxy).
//! Engine internals are logged, not leaked.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use protocol::ErrorBody;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("missing or invalid API key")]
    Unauthorized,
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    TooMany(String),
    #[error("{0}")]
    NotImplemented(String),
    #[error("{0}")]
    RangeNotSatisfiable(String),
    /// The sandbox's disk is full (507).
    #[error("{0}")]
    NoSpace(String),
    /// The port proxy's service could not be reached or answered badly (502).
    #[error("{0}")]
    BadGateway(String),
    /// The port proxy's service did not connect or answer in time (504).
    #[error("{0}")]
    GatewayTimeout(String),
    /// A key's quota (service::keys): 429 with the refusal's `Retry-After`.
    #[error("{}", .0.message)]
    Quota(service::keys::Refusal),
    #[error("{message}")]
    Unavailable { message: String, progress: Option<f32> },
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::TooMany(_) | ApiError::Quota(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
            ApiError::RangeNotSatisfiable(_) => StatusCode::RANGE_NOT_SATISFIABLE,
            ApiError::NoSpace(_) => StatusCode::INSUFFICIENT_STORAGE,
            ApiError::BadGateway(_) => StatusCode::BAD_GATEWAY,
            ApiError::GatewayTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// An engine failure: logged in full, answered without host details.
    pub fn engine(context: &str, err: impl std::fmt::Display) -> ApiError {
        tracing::error!(%err, "{context}");
        ApiError::Internal(context.to_string())
    }
}

/// The one place the service's errors become HTTP statuses.
impl From<service::Error> for ApiError {
    fn from(e: service::Error) -> ApiError {
        use service::Error as E;
        match e {
            E::Invalid(m) => ApiError::BadRequest(m),
            E::NotFound(m) => ApiError::NotFound(m),
            E::Conflict(m) => ApiError::Conflict(m),
            E::TooLarge(m) => ApiError::TooLarge(m),
            E::Capacity(m) => ApiError::TooMany(m),
            E::Quota(r) => ApiError::Quota(r),
            E::Unsupported(m) => ApiError::NotImplemented(m),
            E::NoSpace(m) => ApiError::NoSpace(m),
            E::Unavailable { message, progress } => ApiError::Unavailable { message, progress },
            // Logged where it happened; the message is its context only.
            E::Internal(m) => ApiError::Internal(m),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let progress = match &self {
            ApiError::Unavailable { progress, .. } => *progress,
            _ => None,
        };
        // When to try again: a cap frees up as sandboxes end; a template
        // takes a while to build; a key's forks per minute as its window
        // slides.
        let retry_after = match (&self, self.status()) {
            (ApiError::Quota(r), _) => Some(r.retry_after_s.max(1)),
            (_, StatusCode::TOO_MANY_REQUESTS) => Some(1),
            (_, StatusCode::SERVICE_UNAVAILABLE) => Some(5),
            _ => None,
        };
        let mut response = (self.status(), Json(ErrorBody { error: self.to_string(), progress })).into_response();
        if let Some(secs) = retry_after {
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from(secs));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use service::Error as E;

    /// Every kind the service returns, with the status and body it gets.
    #[test]
    fn each_service_error_maps_to_its_status_with_its_message() {
        let cases = [
            (E::Invalid("bad".into()), StatusCode::BAD_REQUEST),
            (E::NotFound("no sandbox `x`".into()), StatusCode::NOT_FOUND),
            (E::Conflict("busy".into()), StatusCode::CONFLICT),
            (E::TooLarge("big".into()), StatusCode::PAYLOAD_TOO_LARGE),
            (E::Capacity("full".into()), StatusCode::TOO_MANY_REQUESTS),
            (E::Unsupported("no".into()), StatusCode::NOT_IMPLEMENTED),
            (E::NoSpace("disk".into()), StatusCode::INSUFFICIENT_STORAGE),
            (E::Unavailable { message: "building".into(), progress: Some(0.5) }, StatusCode::SERVICE_UNAVAILABLE),
            (E::Internal("could not fork the sandbox".into()), StatusCode::INTERNAL_SERVER_ERROR),
        ];
        for (service_error, status) in cases {
            let message = service_error.to_string();
            let api = ApiError::from(service_error);
            assert_eq!(api.status(), status, "{message}");
            assert_eq!(api.to_string(), message, "the message reaches the client unchanged");
        }
    }

    #[test]
    fn capacity_and_unavailable_say_when_to_retry() {
        let retry = |e: E| ApiError::from(e).into_response().headers().get(axum::http::header::RETRY_AFTER).cloned();
        assert_eq!(retry(E::Capacity("full".into())), Some(axum::http::HeaderValue::from(1)));
        assert_eq!(retry(E::Unavailable { message: "later".into(), progress: None }), Some(axum::http::HeaderValue::from(5)));
        assert_eq!(retry(E::NotFound("gone".into())), None);
    }
}
