//! `ApiError`: every failure a handler can answer, mapped to a status and a
//! JSON body `{"error": "..."}`. Engine internals are logged, not leaked.

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
            ApiError::TooMany(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
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

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let progress = match &self {
            ApiError::Unavailable { progress, .. } => *progress,
            _ => None,
        };
        (self.status(), Json(ErrorBody { error: self.to_string(), progress })).into_response()
    }
}
