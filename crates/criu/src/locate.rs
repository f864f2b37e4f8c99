//! Which criu to run: the host's when it is new enough, else the tools root's.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::CriuError;
use crate::pivot::PivotedCommand;
use crate::version::{Version, MINIMUM};

/// Where criu sits in a tools root.
const CRIU_IN_ROOT: &str = "/usr/sbin/criu";
/// Left in a tools root whose criu carries forkbox's restorer patch
/// (tools/criu.toml): it restores a task of another user than the tree's
/// root, which criu 4.2.1 as released cannot when run unprivileged.
const RESTORES_OTHER_USERS_MARK: &str = "/usr/lib/forkbox/criu-restores-other-users";
/// Left in a tools root whose criu makes userfaultfds from a `/dev/userfaultfd`
/// handed to it ([`crate::USERFAULTFD_DEV_FD_ENV`]), so it restores lazily
/// when run unprivileged (tools/criu.toml).
const LAZY_PAGES_MARK: &str = "/usr/lib/forkbox/criu-lazy-pages-from-device";
/// Searched after PATH: the server's PATH may lack the sbin directories.
const SBIN_DIRS: [&str; 3] = ["/usr/local/sbin", "/usr/sbin", "/sbin"];

/// Where the criu in use comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The host's own criu, run as it is.
    Host(PathBuf),
    /// forkbox's tools root: criu runs pivoted into it.
    ToolsRoot(PathBuf),
}

/// A criu that is new enough for this kernel, and how to run it.
#[derive(Debug, Clone)]
pub struct Criu {
    pub source: Source,
    pub version: Version,
    /// Whether a restore brings back a task running as another user than
    /// the tree's root (a uid-1000 command in a sandbox). Only the tools
    /// root's patched criu does: criu run unprivileged sets such a task's
    /// uids without keeping the capabilities it then needs for its gids
    /// (criu issue #2047), and 4.2.1 then hangs.
    pub restores_other_users: bool,
    /// Whether `restore --lazy-pages` works run unprivileged, given
    /// `/dev/userfaultfd` (docs/state.md#lazy-resume). Only the tools root's
    /// patched criu: the released one makes a restored task's userfaultfd
    /// with the system call, which an unprivileged task may not use.
    pub lazy_pages: bool,
}

impl Criu {
    /// The host's criu if it is at least [`MINIMUM`], else the criu of
    /// `tools_root` (a built tools root, if any); `expected_root` is where
    /// one would be, for the error that says how to get it.
    pub fn find(tools_root: Option<&Path>, expected_root: &Path) -> Result<Criu, CriuError> {
        let host = host_binary();
        let mut too_old = None;
        if let Some(path) = &host {
            let version = version_of(Command::new(path), path)?;
            if version >= MINIMUM {
                return Ok(Criu { source: Source::Host(path.clone()), version, restores_other_users: false, lazy_pages: false });
            }
            too_old = Some(CriuError::TooOld { path: path.clone(), found: version, minimum: MINIMUM });
        }
        if let Some(root) = tools_root {
            let binary = root.join(CRIU_IN_ROOT.trim_start_matches('/'));
            if binary.is_file() {
                let version = version_of(PivotedCommand::new(root, Path::new(CRIU_IN_ROOT), &[]).into_command(), &binary)?;
                if version < MINIMUM {
                    return Err(CriuError::TooOld { path: binary, found: version, minimum: MINIMUM });
                }
                let marked = |mark: &str| root.join(mark.trim_start_matches('/')).is_file();
                let (restores_other_users, lazy_pages) = (marked(RESTORES_OTHER_USERS_MARK), marked(LAZY_PAGES_MARK));
                return Ok(Criu { source: Source::ToolsRoot(root.to_path_buf()), version, restores_other_users, lazy_pages });
            }
        }
        Err(too_old.unwrap_or(CriuError::NotFound { minimum: MINIMUM, tools_root: expected_root.to_path_buf() }))
    }

    /// `criu <subcommand>`, ready for more arguments. With `binds`, each
    /// host directory is reachable at the path paired with it (inside the
    /// tools root; on the host it is the host path itself, see [`Criu::seen`]).
    pub fn command(&self, subcommand: &str, binds: &[(&Path, &Path)]) -> Command {
        let mut command = match &self.source {
            Source::Host(path) => Command::new(path),
            Source::ToolsRoot(root) => PivotedCommand::new(root, Path::new(CRIU_IN_ROOT), binds).into_command(),
        };
        command.arg(subcommand);
        command
    }

    /// [`command`](Self::command) run as `id` (real, effective and saved
    /// uid and gid), keeping root's capabilities as ambient ones, with
    /// `--unprivileged`: criu then works as the owner of a family's user
    /// namespace. A tree dumped that way needs no CAP_SYS_RESOURCE over it
    /// (which some hosts withhold even from root), and the user namespace
    /// a restore creates belongs to `id`, not to host root, so what its
    /// processes hold is charged to the family's host root.
    pub fn command_as(&self, subcommand: &str, binds: &[(&Path, &Path)], id: u32) -> Command {
        let mut command = self.command(subcommand, binds);
        // SAFETY: the closure runs between fork and exec and only makes system calls.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, move || crate::identity::become_keeping_caps(id));
        }
        command.arg("--unprivileged");
        command
    }

    /// The path criu sees for host directory `host`, bound at `inside` when
    /// criu runs in the tools root.
    pub fn seen<'a>(&self, host: &'a Path, inside: &'a Path) -> &'a Path {
        match self.source {
            Source::Host(_) => host,
            Source::ToolsRoot(_) => inside,
        }
    }

    /// "criu 4.2.1 (tools root /var/lib/forkbox/tools/criu/…/rootfs, restores
    /// other users, lazy pages)", for logs and errors.
    pub fn describe(&self) -> String {
        let mut parts = vec![match &self.source {
            Source::Host(path) => path.display().to_string(),
            Source::ToolsRoot(root) => format!("tools root {}", root.display()),
        }];
        parts.extend(self.restores_other_users.then(|| "restores other users".to_string()));
        parts.extend(self.lazy_pages.then(|| "lazy pages".to_string()));
        format!("criu {} ({})", self.version, parts.join(", "))
    }
}

fn host_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).chain(SBIN_DIRS.iter().map(PathBuf::from)).map(|dir| dir.join("criu")).find(|p| p.is_file())
}

fn version_of(mut command: Command, path: &Path) -> Result<Version, CriuError> {
    let output = command.arg("--version").output().map_err(|source| CriuError::Spawn { what: format!("{} --version", path.display()), source })?;
    let text = printed(&output);
    Version::from_output(&text).ok_or_else(|| CriuError::NoVersion { output: text.trim().to_string() })
}

/// What a criu command printed, standard output then standard error.
pub(crate) fn printed(output: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}
