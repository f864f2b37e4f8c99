//! The trust layer: a small read-only directory the overlay puts above a
//! template's layers, holding
//!
//! - `etc/ssl/certs/ca-certificates.crt`: the template's own bundle with
//!   the host's CAs after it (what OpenSSL, curl, git, pip and requests
//!   on Debian read);
//! - `etc/ssl/certs/forkbox-host-cas.pem`: the host's CAs alone (for
//!   `NODE_EXTRA_CA_CERTS`: Node keeps its own store otherwise);
//! - `usr/local/share/ca-certificates/forkbox-host/*.crt`: the same, where
//!   `update-ca-certificates` run inside a sandbox finds them again.
//!
//! A sandbox may change any of these (overlayfs copies them up), as it may
//! any file of its template.

use std::fs;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

use super::certs::HostCa;
use crate::error::{Error, Result};

pub const BUNDLE: &str = "etc/ssl/certs/ca-certificates.crt";
pub const HOST_ONLY: &str = "etc/ssl/certs/forkbox-host-cas.pem";
pub const LOCAL_DIR: &str = "usr/local/share/ca-certificates/forkbox-host";
/// Most bytes taken of a template's bundle.
const MAX_BUNDLE_BYTES: u64 = 16 << 20;

/// The bundle the sandbox would see without us: the one in the topmost of
/// `lowers` (top first) that has it, read without following any link
/// (a template built from a recipe is a sandbox's files, and a link there
/// must not make the server read a host file). A whiteout, an opaque
/// directory on the way, or anything but a regular file ends the search
/// with no bundle.
pub fn template_bundle(lowers: &[PathBuf]) -> Option<Vec<u8>> {
    for layer in lowers {
        match find_in_layer(layer) {
            Found::File(bytes) => return Some(bytes),
            Found::Hidden => return None,
            Found::Absent => {}
        }
    }
    None
}

enum Found {
    File(Vec<u8>),
    /// A whiteout or opaque directory hides the layers below.
    Hidden,
    Absent,
}

fn find_in_layer(layer: &Path) -> Found {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let Ok(root) = rustix::fs::open(layer, OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()) else { return Found::Absent };
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS | ResolveFlags::NO_XDEV;
    // An opaque directory (`trusted.overlay.opaque`) hides what is below it.
    for dir in ["etc", "etc/ssl", "etc/ssl/certs"] {
        match rustix::fs::openat2(root.as_fd(), dir, OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty(), resolve) {
            Ok(fd) => {
                let mut v = [0u8; 1];
                if rustix::fs::fgetxattr(&fd, "trusted.overlay.opaque", &mut v).is_ok_and(|n| n == 1 && v[0] == b'y') {
                    return Found::Hidden;
                }
            }
            Err(rustix::io::Errno::NOENT) => return Found::Absent,
            Err(_) => return Found::Hidden,
        }
    }
    let fd = match rustix::fs::openat2(root.as_fd(), BUNDLE, OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NONBLOCK, Mode::empty(), resolve) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Found::Absent,
        Err(_) => return Found::Hidden,
    };
    match rustix::fs::fstat(&fd) {
        Ok(st) if rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile => {}
        // A whiteout (a 0:0 character device), a fifo, a device: no bundle.
        _ => return Found::Hidden,
    }
    let mut bytes = Vec::new();
    match fs::File::from(fd).take(MAX_BUNDLE_BYTES).read_to_end(&mut bytes) {
        Ok(_) => Found::File(bytes),
        Err(_) => Found::Hidden,
    }
}

/// The layer's files: path (relative) → contents.
pub fn files(template_bundle: Option<&[u8]>, cas: &[HostCa]) -> Vec<(String, Vec<u8>)> {
    let host: String = cas.iter().map(HostCa::pem).collect();
    let mut bundle = template_bundle.map(<[u8]>::to_vec).unwrap_or_default();
    if !bundle.is_empty() && !bundle.ends_with(b"\n") {
        bundle.push(b'\n');
    }
    if !cas.is_empty() {
        bundle.extend_from_slice(b"# forkbox: the host's CAs (docs/network.md#host-cas)\n");
        bundle.extend_from_slice(host.as_bytes());
    }
    let mut out = vec![(BUNDLE.to_string(), bundle), (HOST_ONLY.to_string(), host.into_bytes())];
    for (i, ca) in cas.iter().enumerate() {
        out.push((format!("{LOCAL_DIR}/{i:03}-{}.crt", safe_name(&ca.file)), ca.pem().into_bytes()));
    }
    out
}

/// A file name made of the source file's stem, letters, digits, `-`, `_` and `.` only.
fn safe_name(file: &Path) -> String {
    let stem = file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let clean: String = stem.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' }).take(64).collect();
    if clean.is_empty() || clean.starts_with('.') {
        format!("ca{clean}")
    } else {
        clean
    }
}

/// The directory under `dir` holding `files`: named by their hash, made
/// once (written beside it, then renamed into place).
pub fn write(dir: &Path, files: &[(String, Vec<u8>)]) -> Result<PathBuf> {
    let mut hash = Sha256::new();
    for (path, bytes) in files {
        hash.update((path.len() as u64).to_le_bytes());
        hash.update(path.as_bytes());
        hash.update((bytes.len() as u64).to_le_bytes());
        hash.update(bytes);
    }
    let name = hex::encode(&hash.finalize()[..8]);
    let layer = dir.join(&name);
    if layer.is_dir() {
        return Ok(layer);
    }
    fs::DirBuilder::new().recursive(true).mode(0o755).create(dir).map_err(|e| Error::io("create the trust layers' directory", e))?;
    // Unique per call: a create and the pool's warming may make the same
    // layer at once, in this process or another server's sharing the dir.
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let partial = dir.join(format!(".{name}.{}.{}", std::process::id(), CALLS.fetch_add(1, Ordering::Relaxed)));
    let _ = fs::remove_dir_all(&partial);
    let made = (|| -> std::io::Result<()> {
        for (path, bytes) in files {
            let target = partial.join(path);
            if let Some(parent) = target.parent() {
                fs::DirBuilder::new().recursive(true).mode(0o755).create(parent)?;
            }
            let mut f = fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(&target)?;
            f.write_all(bytes)?;
        }
        // DirBuilder's mode is masked by the umask: set the modes the
        // template's own directories have, which the merged view shows.
        set_dir_modes(&partial)?;
        fs::rename(&partial, &layer)
    })();
    if let Err(e) = made {
        let _ = fs::remove_dir_all(&partial);
        if layer.is_dir() {
            return Ok(layer); // another thread made it meanwhile
        }
        return Err(Error::io("write a trust layer", e));
    }
    Ok(layer)
}

fn set_dir_modes(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755))?;
    for e in fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            set_dir_modes(&e.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca(name: &str) -> HostCa {
        HostCa { subject: format!("CN={name}"), file: PathBuf::from(format!("/x/{name}.crt")), der: name.as_bytes().to_vec() }
    }

    #[test]
    fn the_bundle_is_the_templates_then_the_hosts() {
        let f = files(Some(b"TEMPLATE"), &[ca("one"), ca("two")]);
        let bundle = String::from_utf8(f[0].1.clone()).unwrap();
        assert!(bundle.starts_with("TEMPLATE\n# forkbox"), "{bundle}");
        assert!(bundle.find("CN=one").unwrap() < bundle.find("CN=two").unwrap());
        assert_eq!(f[1].0, HOST_ONLY);
        assert!(!String::from_utf8(f[1].1.clone()).unwrap().contains("TEMPLATE"));
        assert_eq!(f[2].0, format!("{LOCAL_DIR}/000-one.crt"));
        // No CAs: the template's bundle, unchanged.
        assert_eq!(files(Some(b"T\n"), &[])[0].1, b"T\n");
    }

    #[test]
    fn names_of_source_files_cannot_climb_out() {
        assert_eq!(safe_name(Path::new("/a/../../etc/x y.crt")), "x_y");
        assert_eq!(safe_name(Path::new("/a/.hidden.crt")), "ca.hidden");
        assert_eq!(safe_name(Path::new("/a/..crt")), "ca.");
    }

    #[test]
    fn a_layer_is_made_once_per_content() {
        let dir = tempfile::tempdir().unwrap();
        let f = files(Some(b"T"), &[ca("one")]);
        let a = write(dir.path(), &f).unwrap();
        let b = write(dir.path(), &f).unwrap();
        assert_eq!(a, b);
        assert_eq!(fs::read(a.join(BUNDLE)).unwrap(), f[0].1);
        let c = write(dir.path(), &files(Some(b"T"), &[ca("two")])).unwrap();
        assert_ne!(a, c);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(fs::metadata(a.join("etc/ssl")).unwrap().permissions().mode() & 0o777, 0o755);
    }

    #[test]
    fn threads_making_the_same_layer_at_once_all_get_it() {
        // Found by bench/egress.py: a create and the warm pool's zygote
        // wrote one partial directory and one of them failed with EEXIST.
        let dir = tempfile::tempdir().unwrap();
        let big = vec![b'T'; 256 << 10];
        let f = files(Some(big.as_slice()), &[ca("one"), ca("two")]);
        let made: Vec<PathBuf> = std::thread::scope(|s| {
            let runs: Vec<_> = (0..16).map(|_| s.spawn(|| write(dir.path(), &f).unwrap())).collect();
            runs.into_iter().map(|r| r.join().unwrap()).collect()
        });
        assert!(made.iter().all(|m| *m == made[0]), "{made:?}");
        let entries: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(entries, [made[0].file_name().unwrap()], "no partial directory is left");
        assert_eq!(fs::read(made[0].join(&f[0].0)).unwrap(), f[0].1);
    }

    #[test]
    fn the_templates_bundle_is_read_without_following_links() {
        let dir = tempfile::tempdir().unwrap();
        let (top, bottom) = (dir.path().join("top"), dir.path().join("bottom"));
        let secret = dir.path().join("secret");
        fs::write(&secret, "HOST SECRET").unwrap();
        for l in [&top, &bottom] {
            fs::create_dir_all(l.join("etc/ssl/certs")).unwrap();
        }
        fs::write(bottom.join(BUNDLE), "BOTTOM").unwrap();
        assert_eq!(template_bundle(&[top.clone(), bottom.clone()]).as_deref(), Some(&b"BOTTOM"[..]));
        // A link to a host file in the upper layer: no bundle, never the file.
        std::os::unix::fs::symlink(&secret, top.join(BUNDLE)).unwrap();
        assert_eq!(template_bundle(&[top.clone(), bottom.clone()]), None);
        fs::remove_file(top.join(BUNDLE)).unwrap();
        // A link on the way (etc/ssl → elsewhere) is not followed either.
        fs::remove_dir_all(top.join("etc/ssl")).unwrap();
        fs::create_dir_all(dir.path().join("elsewhere/certs")).unwrap();
        fs::write(dir.path().join("elsewhere/certs/ca-certificates.crt"), "HOST SECRET").unwrap();
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), top.join("etc/ssl")).unwrap();
        assert_eq!(template_bundle(&[top.clone(), bottom.clone()]), None);
        // Missing in the upper layer: the lower one's.
        fs::remove_file(top.join("etc/ssl")).unwrap();
        assert_eq!(template_bundle(&[top, bottom]).as_deref(), Some(&b"BOTTOM"[..]));
    }
}
