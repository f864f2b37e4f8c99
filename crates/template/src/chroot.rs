//! Running commands inside a rootfs being built, and preparing it for that.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use crate::error::TemplateError;
use crate::tools::{self, Tools};

/// Runs as `sh -c SCRIPT forkbox-chroot <rootfs> <command>` in a fresh private
/// mount namespace: the mounts vanish with the namespace, so nothing stays
/// mounted on the host even if the build is killed.
const SCRIPT: &str = r#"set -eu
root=$1
mkdir -p "$root/proc" "$root/sys" "$root/dev"
mount -t proc proc "$root/proc"
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$root/sys"
mount --rbind /dev "$root/dev"
# Private /dev/shm so the build can't litter the host's.
if [ -d "$root/dev/shm" ]; then mount -t tmpfs -o nosuid,nodev,mode=1777 tmpfs "$root/dev/shm"; fi
exec chroot "$root" /bin/sh -c "$2"
"#;

/// Keeps packages from starting services inside the build (see invoke-rc.d).
const POLICY_RC_D: &str = "#!/bin/sh\nexit 101\n";

/// A command that runs `command` with `/bin/sh -c` chrooted into `rootfs`.
pub(crate) fn command(tools: &Tools, rootfs: &Path, command: &str) -> Command {
    let mut cmd = tools::command(&tools.unshare);
    cmd.args(["--mount", "--propagation", "private", "--", "/bin/sh", "-c", SCRIPT, "forkbox-chroot"]).arg(rootfs).arg(command);
    cmd
}

/// Gets the rootfs ready for chroot steps: the host's DNS config so apt can
/// resolve the mirror, and no service starts.
pub(crate) fn prepare(rootfs: &Path) -> Result<(), TemplateError> {
    let resolv = fs::read("/etc/resolv.conf").unwrap_or_default();
    replace_file(&rootfs.join("etc/resolv.conf"), &resolv, 0o644)?;
    replace_file(&rootfs.join("usr/sbin/policy-rc.d"), POLICY_RC_D.as_bytes(), 0o755)
}

/// Undoes `prepare`: sandboxes get their own DNS config, and must be able to start services.
pub(crate) fn finish(rootfs: &Path) -> Result<(), TemplateError> {
    replace_file(&rootfs.join("etc/resolv.conf"), b"", 0o644)?;
    let policy = rootfs.join("usr/sbin/policy-rc.d");
    match fs::remove_file(&policy) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(TemplateError::io(format!("removing {}", policy.display()))(e)),
        _ => Ok(()),
    }
}

/// Writes a fresh regular file, first removing whatever is there: writing
/// through a symlink could land outside the rootfs.
fn replace_file(path: &Path, contents: &[u8], mode: u32) -> Result<(), TemplateError> {
    let context = || format!("writing {}", path.display());
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(TemplateError::io(context())(e)),
        _ => {}
    }
    fs::write(path, contents).map_err(TemplateError::io(context()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(TemplateError::io(context()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepare_and_finish_replace_symlinks_and_clean_up() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("etc")).unwrap();
        fs::create_dir_all(root.join("usr/sbin")).unwrap();
        let outside = root.join("outside");
        fs::write(&outside, "keep").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("etc/resolv.conf")).unwrap();

        prepare(root).unwrap();
        let resolv = root.join("etc/resolv.conf");
        assert!(!resolv.symlink_metadata().unwrap().is_symlink());
        assert_eq!(fs::read_to_string(&outside).unwrap(), "keep");
        let policy = root.join("usr/sbin/policy-rc.d");
        assert_eq!(policy.metadata().unwrap().permissions().mode() & 0o777, 0o755);

        finish(root).unwrap();
        assert_eq!(fs::read(&resolv).unwrap(), b"");
        assert!(!policy.exists());
        finish(root).unwrap();
    }
}
