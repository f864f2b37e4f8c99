//! Host tools the engine shells out to, with one-line errors naming the apt package.

use crate::error::{Error, Result};

/// Fail with "`tool` not found: install it with `apt-get install package`".
pub fn require_tool(tool: &str, package: &str) -> Result<()> {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).is_file()))
        .unwrap_or(false);
    if found {
        Ok(())
    } else {
        Err(Error::MissingTool { tool: tool.to_string(), package: package.to_string() })
    }
}
