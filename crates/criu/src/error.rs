use std::path::PathBuf;

use crate::version::Version;

/// Why criu cannot be used; each says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum CriuError {
    #[error("criu is not installed: no criu >= {minimum} on PATH and no tools root at {tools_root} (build it with `forkbox tools build criu`)")]
    NotFound { minimum: Version, tools_root: PathBuf },
    #[error(
        "criu {found} at {path} is older than {minimum}, the first release that works on this kernel (build the tools root with `forkbox tools build criu`)"
    )]
    TooOld { path: PathBuf, found: Version, minimum: Version },
    #[error("could not run {what}: {source}")]
    Spawn { what: String, source: std::io::Error },
    #[error("`criu --version` printed no version: {output:?}")]
    NoVersion { output: String },
    #[error("`criu check` failed on this kernel: {output}")]
    CheckFailed { output: String },
    #[error("criu {what} failed ({status}): {errors}")]
    Failed { what: String, status: String, errors: String },
    #[error("criu image {path}: {why}")]
    Image { path: PathBuf, why: String },
}
