//! Deleting rootfs trees without ever reaching into something mounted inside them.

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::TemplateError;

/// Removes the directory tree at `path` (absent is fine). Refuses if anything
/// is mounted under it: a leftover /dev bind would make this delete the host's
/// device nodes.
pub(crate) fn remove_tree(path: &Path) -> Result<(), TemplateError> {
    let context = || format!("removing {}", path.display());
    let absolute = match path.canonicalize() {
        Ok(p) => p,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(TemplateError::io(context())(e)),
    };
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").map_err(TemplateError::io(context()))?;
    if let Some(mount) = mounts_under(&mountinfo, &absolute).first() {
        return Err(TemplateError::io(context())(std::io::Error::other(format!("{} is still mounted; unmount it first", mount.display()))));
    }
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(TemplateError::io(context())(e)),
        _ => Ok(()),
    }
}

/// Mount points at or below `dir`, from /proc/self/mountinfo text.
fn mounts_under(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    mountinfo.lines().filter_map(|line| line.split(' ').nth(4)).map(|field| PathBuf::from(unescape(field))).filter(|mount| mount.starts_with(dir)).collect()
}

/// Undoes the kernel's octal escapes (`\040` for space and so on).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| {
            let d = std::str::from_utf8(d).ok()?;
            u8::from_str_radix(d, 8).ok()
        });
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
40 22 0:5 / /var/lib/t/x.partial/rootfs/dev rw shared:2 - devtmpfs udev rw
41 22 0:6 / /var/lib/t/my\\040dir/proc rw - proc proc rw
";

    #[test]
    fn finds_mounts_below_a_directory() {
        let under = |dir: &str| mounts_under(MOUNTINFO, Path::new(dir));
        assert_eq!(under("/var/lib/t/x.partial"), [PathBuf::from("/var/lib/t/x.partial/rootfs/dev")]);
        assert_eq!(under("/var/lib/t/my dir"), [PathBuf::from("/var/lib/t/my dir/proc")]);
        assert!(under("/var/lib/t/x.partia").is_empty(), "prefix of a name is not a parent");
        assert!(under("/var/lib/u").is_empty());
    }

    #[test]
    fn removes_trees_and_tolerates_missing_ones() {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("a");
        fs::create_dir_all(tree.join("b/c")).unwrap();
        fs::write(tree.join("b/c/f"), "x").unwrap();
        remove_tree(&tree).unwrap();
        assert!(!tree.exists());
        remove_tree(&tree).unwrap();
    }

    #[test]
    fn refuses_to_remove_a_tree_with_a_mount_inside() {
        // /proc always has mounts below it (e.g. binfmt_misc or at least itself).
        let err = remove_tree(Path::new("/proc")).unwrap_err();
        assert!(err.to_string().contains("is still mounted"), "{err}");
    }
}
