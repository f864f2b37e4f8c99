//! A directory tree as one tar stream and back, faithfully enough for a
//! Space's overlay layer: owners, modes, mtimes (seconds), extended
//! attributes (`trusted.overlay.*` opaque dirs, `user.*`), symlinks, hard
//! links, and the character devices 0:0 overlayfs uses for whiteouts.
//!
//! Unpacking trusts nothing in the archive (the object store is outside
//! the node): paths must be plain relative names, every parent is reached
//! with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, so no entry can
//! be written through a symlink or outside the destination, and hard links
//! may only point at entries inside it.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags, XattrFlags, CWD};
use tar::{EntryType, Header, HeaderMode};

const XATTR_PAX: &str = "SCHILY.xattr.";

/// Write the tree under `src` (its entries, not `src` itself) to `out`.
pub fn pack(src: &Path, out: impl Write) -> io::Result<()> {
    pack_except(src, out, &[])
}

/// `pack`, leaving out the entries of `src` named in `skip` (and what is
/// under them: a mount point's contents are not the tree's).
pub fn pack_except(src: &Path, out: impl Write, skip: &[&str]) -> io::Result<()> {
    let mut builder = tar::Builder::new(out);
    builder.follow_symlinks(false);
    let mut linked: HashMap<(u64, u64), PathBuf> = HashMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let mut names: Vec<_> = fs::read_dir(src.join(&rel))?.collect::<io::Result<Vec<_>>>()?.into_iter().map(|e| e.file_name()).collect();
        names.sort();
        // Directories are pushed in reverse so they come out in order.
        let mut dirs = Vec::new();
        for name in names {
            if rel.as_os_str().is_empty() && skip.iter().any(|s| OsStr::new(s) == name) {
                continue;
            }
            let path = rel.join(&name);
            let full = src.join(&path);
            let meta = fs::symlink_metadata(&full)?;
            let xattrs = read_xattrs(&full)?;
            if !xattrs.is_empty() {
                builder.append_pax_extensions(xattrs.iter().map(|(k, v)| (k.as_str(), v.as_slice())))?;
            }
            let mut header = Header::new_gnu();
            header.set_metadata_in_mode(&meta, HeaderMode::Complete);
            let ft = meta.file_type();
            if ft.is_dir() {
                header.set_entry_type(EntryType::Directory);
                header.set_size(0);
                builder.append_data(&mut header, &path, io::empty())?;
                dirs.push(path);
            } else if ft.is_file() {
                let id = (meta.dev(), meta.ino());
                match linked.get(&id) {
                    Some(first) if meta.nlink() > 1 => {
                        header.set_entry_type(EntryType::Link);
                        header.set_size(0);
                        builder.append_link(&mut header, &path, first)?;
                    }
                    _ => {
                        if meta.nlink() > 1 {
                            linked.insert(id, path.clone());
                        }
                        header.set_entry_type(EntryType::Regular);
                        builder.append_data(&mut header, &path, File::open(&full)?)?;
                    }
                }
            } else if ft.is_symlink() {
                header.set_entry_type(EntryType::Symlink);
                header.set_size(0);
                builder.append_link(&mut header, &path, fs::read_link(&full)?)?;
            } else if ft.is_char_device() || ft.is_block_device() || ft.is_fifo() {
                header.set_entry_type(if ft.is_char_device() {
                    EntryType::Char
                } else if ft.is_block_device() {
                    EntryType::Block
                } else {
                    EntryType::Fifo
                });
                header.set_size(0);
                let rdev = meta.rdev();
                header.set_device_major(rustix::fs::major(rdev))?;
                header.set_device_minor(rustix::fs::minor(rdev))?;
                builder.append_data(&mut header, &path, io::empty())?;
            }
            // Sockets are not kept (nothing listens on them any more).
        }
        stack.extend(dirs.into_iter().rev());
    }
    builder.into_inner()?.flush()
}

/// Every extended attribute of `path` (not following a symlink), as PAX
/// records.
fn read_xattrs(path: &Path) -> io::Result<Vec<(String, Vec<u8>)>> {
    let mut names = vec![0u8; 4096];
    let n = match rustix::fs::llistxattr(path, &mut names[..]) {
        Ok(n) => n,
        Err(rustix::io::Errno::NOTSUP) => return Ok(Vec::new()),
        Err(rustix::io::Errno::RANGE) => {
            names = vec![0u8; rustix::fs::llistxattr_query(path)?];
            rustix::fs::llistxattr(path, &mut names[..])?
        }
        Err(e) => return Err(e.into()),
    };
    let mut out = Vec::new();
    for name in names[..n].split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let name_str = String::from_utf8_lossy(name).into_owned();
        let size = rustix::fs::lgetxattr_query(path, name)?;
        let mut value = vec![0u8; size];
        let got = rustix::fs::lgetxattr(path, name, &mut value[..])?;
        value.truncate(got);
        out.push((format!("{XATTR_PAX}{name_str}"), value));
    }
    Ok(out)
}

/// Where an entry goes: its parent (opened beneath the destination) and
/// its own name.
struct Place {
    parent: OwnedFd,
    name: Vec<u8>,
}

/// A directory whose metadata is set once everything in it is written.
struct DirMeta {
    rel: PathBuf,
    uid: u32,
    gid: u32,
    mode: u32,
    mtime: i64,
}

/// Unpack `archive` into `dest`, which must not exist yet.
pub fn unpack(archive: impl Read, dest: &Path) -> io::Result<()> {
    fs::create_dir(dest)?;
    let root = rustix::fs::openat(CWD, dest, OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())?;
    let mut tar = tar::Archive::new(archive);
    let mut dirs: Vec<DirMeta> = Vec::new();
    for entry in tar.entries()? {
        let mut entry = entry?;
        let rel = plain_path(&entry.path()?)?;
        let xattrs: Vec<(Vec<u8>, Vec<u8>)> = match entry.pax_extensions()? {
            Some(exts) => exts
                .filter_map(|e| e.ok())
                .filter_map(|e| Some((e.key_bytes().strip_prefix(XATTR_PAX.as_bytes())?.to_vec(), e.value_bytes().to_vec())))
                .collect(),
            None => Vec::new(),
        };
        let h = entry.header().clone();
        let (uid, gid, mode, mtime) = (h.uid()? as u32, h.gid()? as u32, h.mode()? & 0o7777, h.mtime()? as i64);
        let place = place(&root, &rel)?;
        let name = OsStr::from_bytes(&place.name);
        match h.entry_type() {
            EntryType::Directory => {
                rustix::fs::mkdirat(&place.parent, name, Mode::from_raw_mode(0o700))?;
                set_xattrs(&place, &xattrs)?;
                dirs.push(DirMeta { rel, uid, gid, mode, mtime });
                continue;
            }
            EntryType::Regular | EntryType::Continuous => {
                let fd = rustix::fs::openat(
                    &place.parent,
                    name,
                    OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )?;
                let mut file = File::from(fd);
                io::copy(&mut entry, &mut file)?;
            }
            EntryType::Symlink => {
                let target = entry.link_name_bytes().ok_or_else(|| invalid("a symlink without a target"))?.into_owned();
                rustix::fs::symlinkat(OsStr::from_bytes(&target), &place.parent, name)?;
            }
            EntryType::Link => {
                let target = plain_path(&entry.link_name()?.ok_or_else(|| invalid("a hard link without a target"))?)?;
                let from = self::place(&root, &target)?;
                rustix::fs::linkat(&from.parent, OsStr::from_bytes(&from.name), &place.parent, name, AtFlags::empty())?;
                // A hard link shares its first name's metadata.
                continue;
            }
            kind @ (EntryType::Char | EntryType::Block | EntryType::Fifo) => {
                let file_type = match kind {
                    EntryType::Char => rustix::fs::FileType::CharacterDevice,
                    EntryType::Block => rustix::fs::FileType::BlockDevice,
                    _ => rustix::fs::FileType::Fifo,
                };
                let dev = rustix::fs::makedev(h.device_major()?.unwrap_or(0), h.device_minor()?.unwrap_or(0));
                rustix::fs::mknodat(&place.parent, name, file_type, Mode::from_raw_mode(0o600), dev)?;
            }
            // PAX and GNU long-name records were read with their entry.
            _ => continue,
        }
        let symlink = h.entry_type() == EntryType::Symlink;
        set_xattrs(&place, &xattrs)?;
        set_meta(&place, uid, gid, (!symlink).then_some(mode), mtime)?;
    }
    // Deepest first, so setting a directory's mtime is its last change.
    for d in dirs.iter().rev() {
        let place = place(&root, &d.rel)?;
        set_meta(&place, d.uid, d.gid, Some(d.mode), d.mtime)?;
    }
    Ok(())
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("unsafe archive: {what}"))
}

/// `p` as plain relative components (no `..`, no root, not empty).
fn plain_path(p: &Path) -> io::Result<PathBuf> {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            _ => return Err(invalid(&format!("path {}", p.display()))),
        }
    }
    if out.as_os_str().is_empty() {
        return Err(invalid("an empty path"));
    }
    Ok(out)
}

/// Open `rel`'s parent beneath `root`, through no symlink.
fn place(root: &OwnedFd, rel: &Path) -> io::Result<Place> {
    let name = rel.file_name().ok_or_else(|| invalid("a path without a name"))?.as_bytes().to_vec();
    let parent = match rel.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(p) => rustix::fs::openat2(
            root,
            p,
            OFlags::DIRECTORY | OFlags::PATH | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )?,
        None => rustix::io::dup(root)?,
    };
    Ok(Place { parent, name })
}

fn set_meta(place: &Place, uid: u32, gid: u32, mode: Option<u32>, mtime: i64) -> io::Result<()> {
    let name = OsStr::from_bytes(&place.name);
    // Owner first: a chown clears set-id bits the mode then puts back.
    rustix::fs::chownat(&place.parent, name, Some(rustix::fs::Uid::from_raw(uid)), Some(rustix::fs::Gid::from_raw(gid)), AtFlags::SYMLINK_NOFOLLOW)?;
    if let Some(mode) = mode {
        rustix::fs::chmodat(&place.parent, name, Mode::from_raw_mode(mode), AtFlags::empty())?;
    }
    let t = rustix::fs::Timespec { tv_sec: mtime, tv_nsec: 0 };
    rustix::fs::utimensat(&place.parent, name, &rustix::fs::Timestamps { last_access: t, last_modification: t }, AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(())
}

fn set_xattrs(place: &Place, xattrs: &[(Vec<u8>, Vec<u8>)]) -> io::Result<()> {
    if xattrs.is_empty() {
        return Ok(());
    }
    // The parent is an O_PATH descriptor: name the entry through it, with
    // the l- calls, which do not follow the entry itself.
    let path = PathBuf::from(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&place.parent.as_fd()))).join(OsStr::from_bytes(&place.name));
    for (k, v) in xattrs {
        rustix::fs::lsetxattr(&path, OsStr::from_bytes(k), v, XattrFlags::empty())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    fn tree(root: &Path) {
        fs::create_dir_all(root.join("a/b")).unwrap();
        fs::write(root.join("a/b/f"), b"hello").unwrap();
        fs::set_permissions(root.join("a/b/f"), fs::Permissions::from_mode(0o4751)).unwrap();
        fs::hard_link(root.join("a/b/f"), root.join("a/hard")).unwrap();
        symlink("/etc/passwd", root.join("a/link")).unwrap();
        rustix::fs::mknodat(CWD, root.join("gone"), rustix::fs::FileType::CharacterDevice, Mode::empty(), 0).unwrap();
        rustix::fs::lsetxattr(root.join("a"), "trusted.overlay.opaque", b"y", XattrFlags::empty()).unwrap();
        rustix::fs::lsetxattr(root.join("a/b/f"), "user.note", b"\x00bin", XattrFlags::empty()).unwrap();
        rustix::fs::chownat(CWD, root.join("a/b"), Some(rustix::fs::Uid::from_raw(1000)), Some(rustix::fs::Gid::from_raw(1001)), AtFlags::empty()).unwrap();
    }

    #[test]
    fn a_layer_comes_back_whole() {
        // Devices, trusted.* attributes and owners need root, as the server has.
        assert!(rustix::process::geteuid().is_root(), "this test runs as root, as the server does");
        let dir = tempfile::tempdir().unwrap();
        let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
        fs::create_dir(&src).unwrap();
        tree(&src);
        let mut bytes = Vec::new();
        pack(&src, &mut bytes).unwrap();
        unpack(&bytes[..], &dst).unwrap();
        assert_eq!(fs::read(dst.join("a/b/f")).unwrap(), b"hello");
        let f = fs::metadata(dst.join("a/b/f")).unwrap();
        assert_eq!(f.mode() & 0o7777, 0o4751);
        assert_eq!(f.ino(), fs::metadata(dst.join("a/hard")).unwrap().ino(), "hard links stay links");
        assert_eq!(fs::read_link(dst.join("a/link")).unwrap(), Path::new("/etc/passwd"));
        let gone = fs::symlink_metadata(dst.join("gone")).unwrap();
        assert!(gone.file_type().is_char_device() && gone.rdev() == 0, "whiteouts stay whiteouts");
        let xattr = |path: &str, name: &str| {
            let mut v = [0u8; 8];
            let n = rustix::fs::lgetxattr(dst.join(path), name, &mut v[..]).unwrap();
            v[..n].to_vec()
        };
        assert_eq!(xattr("a", "trusted.overlay.opaque"), b"y");
        assert_eq!(xattr("a/b/f", "user.note"), b"\x00bin");
        let b = fs::metadata(dst.join("a/b")).unwrap();
        assert_eq!((b.uid(), b.gid()), (1000, 1001));
        assert_eq!(b.mtime(), fs::metadata(src.join("a/b")).unwrap().mtime());
    }

    fn archive_with(path: &str, kind: EntryType, link: Option<&str>) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(0);
        h.set_mode(0o644);
        // Written raw: the builder itself refuses `..` in names.
        h.as_gnu_mut().unwrap().name[..path.len()].copy_from_slice(path.as_bytes());
        if let Some(l) = link {
            h.set_link_name(l).unwrap();
        }
        h.set_cksum();
        b.append(&h, io::empty()).unwrap();
        b.into_inner().unwrap()
    }

    #[test]
    fn unsafe_archives_write_nothing_outside() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        fs::create_dir(&outside).unwrap();
        // Up and out, and an absolute name.
        for (i, bad) in ["../outside/x", "/tmp/forkbox-archive-abs"].iter().enumerate() {
            let err = unpack(&archive_with(bad, EntryType::Regular, None)[..], &dir.path().join(format!("d{i}"))).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{bad}: {err}");
        }
        // Through a symlink the archive made itself.
        let mut b = tar::Builder::new(Vec::new());
        let mut h = Header::new_gnu();
        h.set_entry_type(EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, "l", &outside).unwrap();
        let mut h = Header::new_gnu();
        h.set_entry_type(EntryType::Regular);
        h.set_size(1);
        b.append_data(&mut h, "l/x", &b"x"[..]).unwrap();
        assert!(unpack(&b.into_inner().unwrap()[..], &dir.path().join("d3")).is_err());
        // A hard link to a file outside.
        assert!(unpack(&archive_with("h", EntryType::Link, Some("../outside/y"))[..], &dir.path().join("d4")).is_err());
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
        assert!(!Path::new("/tmp/forkbox-archive-abs").exists());
    }
}
