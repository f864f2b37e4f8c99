//! The crate's single error type.

use std::io;

/// Everything that can go wrong parsing, keying, building or removing a template.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("invalid recipe: {0}")]
    Parse(#[from] toml::de::Error),

    #[error("invalid recipe: {0}")]
    Invalid(String),

    #[error("unknown base template {0:?}")]
    UnknownBase(String),

    #[error("template {0:?}: base chain loops or is too deep")]
    BaseCycle(String),

    #[error("{tool} not found: install it with `apt-get install {package}`")]
    MissingTool { tool: &'static str, package: &'static str },

    #[error("building templates needs root (debootstrap, chroot and mount do)")]
    NotRoot,

    /// A build step exited unsuccessfully; `tail` holds its last output lines.
    #[error("template {template:?}: {step} failed ({status}); last output:\n{tail}")]
    StepFailed { template: String, step: String, status: String, tail: String },

    #[error("{context}: {error}")]
    Io { context: String, error: io::Error },
}

impl TemplateError {
    /// Adapter for `map_err` that attaches what we were doing to an io error.
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(io::Error) -> TemplateError {
        let context = context.into();
        move |error| TemplateError::Io { context, error }
    }
}
