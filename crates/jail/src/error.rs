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
    #[error("sandbox supervisor: {0}")]
    Shim(String),
    #[error("no free uid range for a new sandbox family")]
    NoUidRange,
    #[error("host does not support the jail engine: {0}")]
    Unsupported(String),
}

impl Error {
    pub fn io(what: &'static str, source: std::io::Error) -> Error {
        Error::Io { what, source }
    }
    pub fn sys(what: &'static str, source: nix::Error) -> Error {
        Error::Sys { what, source }
    }
}
