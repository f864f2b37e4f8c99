//! Running a program of the tools root with that root as its mount
//! namespace's root: criu restores a mount namespace only from there.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::unistd::{chdir, pivot_root};

/// PATH inside the root, for criu's own helpers.
const ROOT_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// `program` of `root`, run in a private mount namespace pivoted into
/// `root`, with `/proc` (a new instance of the host's pid namespace), `/sys`
/// and `/dev` and each bind `(host directory, path inside)` mounted.
pub(crate) struct PivotedCommand {
    program: PathBuf,
    mounts: Mounts,
}

/// Every path the child needs, made before the fork: the child only makes
/// system calls.
struct Mounts {
    root: CString,
    proc: CString,
    /// `(source, target)`, bound recursively in order.
    binds: Vec<(CString, CString)>,
}

impl PivotedCommand {
    pub(crate) fn new(root: &Path, program: &Path, binds: &[(&Path, &Path)]) -> PivotedCommand {
        let inside = |path: &Path| root.join(path.strip_prefix("/").unwrap_or(path));
        let mut pairs: Vec<(PathBuf, PathBuf)> = ["/sys", "/dev"].iter().map(|d| (PathBuf::from(d), inside(Path::new(d)))).collect();
        pairs.extend(binds.iter().map(|(host, within)| (host.to_path_buf(), inside(within))));
        let mounts = Mounts {
            root: c_path(root),
            proc: c_path(&inside(Path::new("/proc"))),
            binds: pairs.iter().map(|(source, target)| (c_path(source), c_path(target))).collect(),
        };
        PivotedCommand { program: program.to_path_buf(), mounts }
    }

    /// The command; a bind's target directory is made in the root when missing.
    pub(crate) fn into_command(self) -> Command {
        let mut command = Command::new(&self.program);
        command.env_clear().env("PATH", ROOT_PATH).env("LANG", "C.UTF-8");
        for (_, target) in &self.mounts.binds {
            // A failure shows as the child's mount error.
            let _ = std::fs::create_dir_all(OsStr::from_bytes(target.as_bytes()));
        }
        let mounts = self.mounts;
        // SAFETY: the closure runs between fork and exec; it only makes system
        // calls on strings made before the fork, and allocates nothing.
        unsafe {
            command.pre_exec(move || mounts.enter().map_err(io::Error::from));
        }
        command
    }
}

impl Mounts {
    fn enter(&self) -> nix::Result<()> {
        unshare(CloneFlags::CLONE_NEWNS)?;
        // Nothing mounted here may reach the host's mount namespace.
        mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)?;
        // pivot_root wants the new root to be a mount point.
        mount(Some(self.root.as_c_str()), self.root.as_c_str(), None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REC, None::<&str>)?;
        let proc_flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
        mount(Some("proc"), self.proc.as_c_str(), Some("proc"), proc_flags, None::<&str>)?;
        for (source, target) in &self.binds {
            mount(Some(source.as_c_str()), target.as_c_str(), None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REC, None::<&str>)?;
        }
        chdir(self.root.as_c_str())?;
        // Stack the old root under the new one, then detach it: no put_old directory needed.
        pivot_root(".", ".")?;
        umount2(".", MntFlags::MNT_DETACH)?;
        chdir("/")
    }
}

fn c_path(path: &Path) -> CString {
    // Paths from the filesystem hold no NUL byte.
    CString::new(path.as_os_str().as_bytes()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_land_inside_the_root_after_sys_and_dev() {
        let pivoted = PivotedCommand::new(Path::new("/r"), Path::new("/usr/sbin/criu"), &[(Path::new("/var/img"), Path::new("/forkbox/images"))]);
        let targets: Vec<&[u8]> = pivoted.mounts.binds.iter().map(|(_, t)| t.as_bytes()).collect();
        assert_eq!(targets, [&b"/r/sys"[..], b"/r/dev", b"/r/forkbox/images"]);
        assert_eq!(pivoted.mounts.binds[2].0.as_bytes(), b"/var/img");
        assert_eq!(pivoted.mounts.proc.as_bytes(), b"/r/proc");
    }
}
