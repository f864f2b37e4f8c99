//! `criu check`: whether this kernel lets criu dump and restore at all.

use std::path::Path;

use crate::error::CriuError;
use crate::locate::{printed, Criu};

/// What the server can promise about freezes that keep processes.
#[derive(Debug, Clone)]
pub enum Readiness {
    /// criu passed `criu check` on this kernel.
    Ready(Criu),
    /// Why not: criu missing, too old, or refused by the kernel.
    Unavailable(String),
}

impl Readiness {
    /// Finds criu (see [`Criu::find`]) and runs `criu check` with it.
    pub fn probe(tools_root: Option<&Path>, expected_root: &Path) -> Readiness {
        match Criu::find(tools_root, expected_root).and_then(|criu| criu.check().map(|()| criu)) {
            Ok(criu) => Readiness::Ready(criu),
            Err(e) => Readiness::Unavailable(e.to_string()),
        }
    }

    /// One line for `forkbox serve`'s log and `forkbox tools check`.
    pub fn describe(&self) -> String {
        match self {
            Readiness::Ready(criu) => format!("{} passed `criu check`", criu.describe()),
            Readiness::Unavailable(why) => why.clone(),
        }
    }
}

impl Criu {
    /// `criu check`: exit 0 and "Looks good." when the kernel has what a dump needs.
    pub fn check(&self) -> Result<(), CriuError> {
        let output = self.command("check", &[]).output().map_err(|source| CriuError::Spawn { what: self.describe(), source })?;
        if output.status.success() {
            return Ok(());
        }
        let text = printed(&output);
        let last: Vec<&str> = text.lines().rev().take(5).collect();
        Err(CriuError::CheckFailed { output: last.into_iter().rev().collect::<Vec<_>>().join(" | ") })
    }
}
