//! The engine's error type.

use thiserror::Error;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Error)]
pub enum Error {
    #[error("{tool} not found: install it with `apt-get install {package}`")]
    MissingTool { tool: String, package: String },
    #[error("{what}: {source}")]
    Io { what: &'static str, source: std::io::Error },
    #[error("{what}: {source}")]
    Sys { what: &'static str, source: nix::Error },
    #[error("{what} failed: {stderr}")]
    Command { what: String, stderr: String },
    #[error("invalid: {0}")]
    Invalid(String),
    /// The family's supervisor (the shim) closed its socket: it died.
    #[error("sandbox supervisor: sandbox supervisor is gone")]
    SupervisorGone,
    /// The supervisor did the request and it failed there; its message.
    #[error("sandbox supervisor: {0}")]
    Failed(String),
    /// A message on a supervisor's or init's socket could not be encoded,
    /// decoded or was not the one expected.
    #[error("sandbox supervisor: {0}")]
    Protocol(String),
    /// A sandbox's init could not set it up (its message).
    #[error("sandbox supervisor: sandbox setup: {0}")]
    Setup(String),
    /// A process the engine started died or stopped before it was ready.
    #[error("sandbox supervisor: {0}")]
    Died(String),
    /// A sandbox a predecessor left could not be taken over (why).
    #[error("sandbox supervisor: {0}")]
    NotAdopted(String),
    /// The seccomp filters or capability sets could not be built.
    #[error("sandbox supervisor: {0}")]
    Policy(String),
    /// A helper thread of the engine panicked or was cancelled.
    #[error("sandbox supervisor: {0}")]
    Thread(String),
    #[error("no free uid range for a new sandbox family")]
    NoUidRange,
    #[error("host does not support the jail engine: {0}")]
    Unsupported(String),
    /// A sandbox criu must not dump as it is (engine/tree_creds.rs).
    #[error("criu cannot dump this sandbox as it is: {0}")]
    NotDumpable(String),
}

impl Error {
    pub fn io(what: &'static str, source: std::io::Error) -> Error {
        Error::Io { what, source }
    }
    pub fn sys(what: &'static str, source: nix::Error) -> Error {
        Error::Sys { what, source }
    }

    /// The errno behind this error, if it came from the kernel.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Io { source, .. } => source.raw_os_error(),
            Error::Sys { source, .. } => Some(*source as i32),
            _ => None,
        }
    }
}

/// Keep the errno when an engine error travels as an `io::Error`.
impl From<Error> for std::io::Error {
    fn from(e: Error) -> std::io::Error {
        match e.errno() {
            Some(code) => std::io::Error::from_raw_os_error(code),
            None => std::io::Error::other(e),
        }
    }
}
