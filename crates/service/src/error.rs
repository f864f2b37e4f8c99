//! `Error`: why the service refused or failed a call, as kinds a front end
//! maps to its protocol (the HTTP crate to status codes, in one place).
//!
//! Every message here may be shown to the client. What is not for the
//! client (paths on the host, errno strings from the engine) goes to the
//! log through [`Error::internal`], which keeps only its context.

use crate::keys::Refusal;

#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The request is malformed or out of range: the client's to fix.
    #[error("{0}")]
    Invalid(String),
    /// No such sandbox, Space, checkpoint, template… for this caller.
    #[error("{0}")]
    NotFound(String),
    /// The thing exists but its state does not allow the call (paused,
    /// busy, frozen, exists already…).
    #[error("{0}")]
    Conflict(String),
    /// A body or value larger than its limit.
    #[error("{0}")]
    TooLarge(String),
    /// The server's own caps (sandboxes, memory, disk headroom).
    #[error("{0}")]
    Capacity(String),
    /// A key's quota (src/keys.rs), with when to try again.
    #[error("{}", .0.message)]
    Quota(Refusal),
    /// Not done by this server (its configuration or platform).
    #[error("{0}")]
    Unsupported(String),
    /// The sandbox's disk is full.
    #[error("{0}")]
    NoSpace(String),
    /// Not yet: a template still building, the server draining.
    #[error("{message}")]
    Unavailable { message: String, progress: Option<f32> },
    /// Something failed inside; the message is only its context.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// An engine failure: logged in full, answered without host details.
    pub fn internal(context: &str, err: impl std::fmt::Display) -> Error {
        tracing::error!(%err, "{context}");
        Error::Internal(context.to_string())
    }
}

impl From<jail::fs::FsError> for Error {
    fn from(e: jail::fs::FsError) -> Error {
        use jail::fs::FsErrorKind as K;
        match e.kind {
            K::Invalid | K::OtherFilesystem => Error::Invalid(e.message),
            K::NotFound => Error::NotFound(e.message),
            K::Exists | K::NotADirectory | K::IsADirectory | K::NotEmpty | K::Busy => Error::Conflict(e.message),
            K::NoSpace => Error::NoSpace(e.message),
            K::Other => Error::Internal(e.message),
        }
    }
}

/// A bad egress policy is the client's to fix.
impl From<jail::egress::PolicyError> for Error {
    fn from(e: jail::egress::PolicyError) -> Error {
        Error::Invalid(e.to_string())
    }
}
