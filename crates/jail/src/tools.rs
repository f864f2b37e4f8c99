//! Host tools the engine shells out to, with one-line errors naming the apt package.

use crate::error::{Error, Result};

/// Where `tool` is: on `PATH`, or in the sbin directories a non-login
/// root shell may lack.
pub fn find_tool(tool: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].iter().map(std::path::PathBuf::from))
        .map(|dir| dir.join(tool))
        .find(|p| p.is_file())
}

/// Fail with "`tool` not found: install it with `apt-get install package`".
pub fn require_tool(tool: &str, package: &str) -> Result<()> {
    match find_tool(tool) {
        Some(_) => Ok(()),
        None => Err(Error::MissingTool { tool: tool.to_string(), package: package.to_string() }),
    }
}
