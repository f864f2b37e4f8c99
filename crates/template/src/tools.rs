//! Finding the host tools a build shells out to.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::TemplateError;

/// PATH for build commands, host and chroot alike; the caller's PATH may lack sbin.
pub(crate) const BUILD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Proxy settings pass through so builds work behind one.
const PASSTHROUGH_ENV: &[&str] = &["http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"];

/// debootstrap verifies the Release file against this keyring.
const DEBIAN_KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// Absolute paths of the tools a build runs.
#[derive(Debug, Clone)]
pub(crate) struct Tools {
    pub debootstrap: PathBuf,
    pub unshare: PathBuf,
    pub cp: PathBuf,
}

impl Tools {
    pub(crate) fn find() -> Result<Tools, TemplateError> {
        let tools = Tools { debootstrap: find("debootstrap", "debootstrap")?, unshare: find("unshare", "util-linux")?, cp: find("cp", "coreutils")? };
        // Used by debootstrap or by the chroot script, found through BUILD_PATH.
        find("chroot", "coreutils")?;
        find("mount", "mount")?;
        find("gpgv", "gpgv")?;
        if !Path::new(DEBIAN_KEYRING).is_file() {
            return Err(TemplateError::MissingTool { tool: "debian-archive-keyring", package: "debian-archive-keyring" });
        }
        Ok(tools)
    }
}

/// Checks that every tool a build needs is installed; the error names the
/// first missing one and the apt package that provides it.
pub fn check_tools() -> Result<(), TemplateError> {
    Tools::find().map(|_| ())
}

/// A command with the build environment: nothing inherited from the caller
/// except proxy settings, non-interactive apt, a UTF-8 locale.
pub(crate) fn command(program: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_clear()
        .env("PATH", BUILD_PATH)
        .env("HOME", "/root")
        .env("LANG", "C.UTF-8")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .env("DEBCONF_NONINTERACTIVE_SEEN", "true");
    for var in PASSTHROUGH_ENV {
        if let Some(value) = std::env::var_os(var) {
            cmd.env(var, value);
        }
    }
    cmd
}

fn find(tool: &'static str, package: &'static str) -> Result<PathBuf, TemplateError> {
    let caller_path = std::env::var("PATH").unwrap_or_default();
    caller_path
        .split(':')
        .chain(BUILD_PATH.split(':'))
        .filter(|dir| !dir.is_empty())
        .map(|dir| Path::new(dir).join(tool))
        .find(|path| is_executable(path))
        .ok_or(TemplateError::MissingTool { tool, package })
}

fn is_executable(path: &Path) -> bool {
    path.metadata().map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_tool_error_is_one_line_naming_the_package() {
        let err = find("forkbox-no-such-tool", "forkbox-pkg").unwrap_err();
        assert_eq!(err.to_string(), "forkbox-no-such-tool not found: install it with `apt-get install forkbox-pkg`");
    }

    #[test]
    fn finds_tools_outside_the_callers_path() {
        assert!(find("sh", "dash").unwrap().is_absolute());
    }
}
