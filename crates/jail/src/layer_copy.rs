//! Copy an overlay upper layer from one place to another, exactly: regular
//! files, directories, symlinks, hard links, device nodes (overlayfs's
//! whiteouts are 0:0 character devices), modes, owners, timestamps and
//! extended attributes (overlayfs marks opaque directories with one).
//!
//! Owners are mapped on the way: a layer's files belong to its family's
//! host uid range, so a Space stores them relative to the range (uid 0 is
//! the sandbox's root) and a resumed sandbox gets them in its own range.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, Timespec, Timestamps, XattrFlags, CWD};

use crate::error::{Error, Result};

/// How host owners change on the way: `shift(uid)` → the new uid.
pub trait IdMap {
    fn map(&self, id: u32) -> u32;
}

/// `id - from + to` for ids inside `[from, from + count)`; ids outside the
/// range (there should be none) become the range's root.
pub struct Shift {
    pub from: u32,
    pub to: u32,
    pub count: u32,
}

impl IdMap for Shift {
    fn map(&self, id: u32) -> u32 {
        match id.checked_sub(self.from) {
            Some(rel) if rel < self.count => self.to + rel,
            _ => self.to,
        }
    }
}

/// What a copy moved.
#[derive(Debug, Default, Clone, Copy)]
pub struct Copied {
    pub entries: u64,
    pub bytes: u64,
}

/// Copy the tree at `src` to `dst` (which must not exist yet, or be an
/// empty directory), mapping owners with `ids`.
pub fn copy_tree(src: &Path, dst: &Path, ids: &dyn IdMap) -> Result<Copied> {
    let mut copier = Copier { ids, links: HashMap::new(), copied: Copied::default() };
    let meta = fs::symlink_metadata(src).map_err(|e| Error::io("stat layer", e))?;
    if !meta.is_dir() {
        return Err(Error::Invalid(format!("{} is not a directory", src.display())));
    }
    match fs::create_dir(dst) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::io("create layer copy", e)),
    }
    copier.walk(src, dst)?;
    copier.finish(src, dst, &meta)?;
    Ok(copier.copied)
}

/// Copy a regular file's contents, holes kept as holes: a sandbox's sparse
/// file (free inside it) must not become one written out in full on the
/// host's disk. Data ranges are found with `SEEK_DATA`/`SEEK_HOLE` and
/// copied by the kernel.
fn copy_sparse(from: &Path, to: &Path) -> std::io::Result<()> {
    use rustix::fs::SeekFrom;
    let src = fs::File::open(from)?;
    let dst = fs::OpenOptions::new().write(true).create_new(true).open(to)?;
    let len = src.metadata()?.len();
    let mut at = 0u64;
    while at < len {
        let data = match rustix::fs::seek(&src, SeekFrom::Data(at)) {
            Ok(d) => d,
            Err(rustix::io::Errno::NXIO) => break, // only a hole is left
            Err(e) => return Err(e.into()),
        };
        let hole = rustix::fs::seek(&src, SeekFrom::Hole(data))?.min(len);
        let (mut off_in, mut off_out) = (data, data);
        while off_in < hole {
            let want = (hole - off_in) as usize;
            match rustix::fs::copy_file_range(&src, Some(&mut off_in), &dst, Some(&mut off_out), want) {
                Ok(0) => break, // the file shrank meanwhile
                Ok(_) => {}
                // Across file systems (the volume to the state dir's disk)
                // some kernels refuse: copy through a buffer.
                Err(rustix::io::Errno::XDEV | rustix::io::Errno::INVAL | rustix::io::Errno::NOSYS | rustix::io::Errno::OPNOTSUPP) => {
                    copy_range(&src, &dst, off_in, hole)?;
                    break;
                }
                Err(e) => return Err(e.into()),
            }
        }
        at = hole;
    }
    dst.set_len(len)
}

fn copy_range(src: &fs::File, dst: &fs::File, from: u64, to: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; 1 << 20];
    let mut at = from;
    while at < to {
        let n = src.read_at(&mut buf[..((to - at) as usize).min(1 << 20)], at)?;
        if n == 0 {
            break;
        }
        dst.write_all_at(&buf[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

struct Copier<'a> {
    ids: &'a dyn IdMap,
    /// (dev, inode) of files with more than one link → their first copy.
    links: HashMap<(u64, u64), std::path::PathBuf>,
    copied: Copied,
}

impl Copier<'_> {
    fn walk(&mut self, src: &Path, dst: &Path) -> Result<()> {
        let entries = fs::read_dir(src).map_err(|e| Error::io("read layer dir", e))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io("read layer dir", e))?;
            let (from, to) = (entry.path(), dst.join(entry.file_name()));
            let meta = fs::symlink_metadata(&from).map_err(|e| Error::io("stat layer entry", e))?;
            self.copied.entries += 1;
            let ft = meta.file_type();
            if ft.is_dir() {
                fs::create_dir(&to).map_err(|e| Error::io("copy a directory", e))?;
                self.walk(&from, &to)?;
                self.finish(&from, &to, &meta)?;
            } else if ft.is_file() {
                if meta.nlink() > 1 {
                    if let Some(first) = self.links.get(&(meta.dev(), meta.ino())) {
                        fs::hard_link(first, &to).map_err(|e| Error::io("copy a hard link", e))?;
                        continue;
                    }
                    self.links.insert((meta.dev(), meta.ino()), to.clone());
                }
                copy_sparse(&from, &to).map_err(|e| Error::io("copy a file", e))?;
                self.copied.bytes += meta.len();
            } else if ft.is_symlink() {
                let target = fs::read_link(&from).map_err(|e| Error::io("read a symlink", e))?;
                std::os::unix::fs::symlink(target, &to).map_err(|e| Error::io("copy a symlink", e))?;
            } else if ft.is_char_device() || ft.is_block_device() || ft.is_fifo() {
                let kind = if ft.is_char_device() {
                    FileType::CharacterDevice
                } else if ft.is_block_device() {
                    FileType::BlockDevice
                } else {
                    FileType::Fifo
                };
                rustix::fs::mknodat(CWD, &to, kind, Mode::from_raw_mode(meta.mode() & 0o7777), meta.rdev()).map_err(|e| errno("copy a device node", e))?;
            } else {
                // A socket left in the layer: nothing can use it later.
                self.copied.entries -= 1;
                continue;
            }
            if !ft.is_dir() {
                self.finish(&from, &to, &meta)?;
            }
        }
        Ok(())
    }

    /// Owner, mode, xattrs and times of `to`, from `from` (directories
    /// after their contents, so copying those does not touch the mtime).
    fn finish(&self, from: &Path, to: &Path, meta: &fs::Metadata) -> Result<()> {
        std::os::unix::fs::lchown(to, Some(self.ids.map(meta.uid())), Some(self.ids.map(meta.gid()))).map_err(|e| Error::io("set a copied file's owner", e))?;
        let symlink = meta.file_type().is_symlink();
        if !symlink {
            // After chown, which clears setuid bits.
            fs::set_permissions(to, fs::Permissions::from_mode(meta.mode() & 0o7777)).map_err(|e| Error::io("set a copied file's mode", e))?;
        }
        copy_xattrs(from, to)?;
        let times = Timestamps {
            last_access: Timespec { tv_sec: meta.atime(), tv_nsec: meta.atime_nsec() as _ },
            last_modification: Timespec { tv_sec: meta.mtime(), tv_nsec: meta.mtime_nsec() as _ },
        };
        rustix::fs::utimensat(CWD, to, &times, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| errno("set a copied file's times", e))?;
        Ok(())
    }
}

fn errno(what: &'static str, e: rustix::io::Errno) -> Error {
    Error::sys(what, nix::errno::Errno::from_raw(e.raw_os_error()))
}

fn copy_xattrs(from: &Path, to: &Path) -> Result<()> {
    // 64 KiB: the longest name list Linux returns.
    let mut names = vec![0u8; 64 * 1024];
    let n = match rustix::fs::llistxattr(from, &mut names[..]) {
        Ok(n) => n,
        Err(rustix::io::Errno::NOTSUP) => return Ok(()),
        Err(e) => return Err(errno("list xattrs", e)),
    };
    for name in names[..n].split(|b| *b == 0).filter(|s| !s.is_empty()) {
        let name = std::ffi::CString::new(name).map_err(|_| Error::Invalid("bad xattr name".into()))?;
        // 64 KiB: the largest value Linux allows.
        let mut value = vec![0u8; 64 * 1024];
        let got = match rustix::fs::lgetxattr(from, name.as_c_str(), &mut value[..]) {
            Ok(n) => n,
            Err(rustix::io::Errno::NODATA) => continue,
            Err(e) => return Err(errno("read an xattr", e)),
        };
        rustix::fs::lsetxattr(to, name.as_c_str(), &value[..got], XattrFlags::empty()).map_err(|e| errno("copy an xattr", e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Plus1000;
    impl IdMap for Plus1000 {
        fn map(&self, id: u32) -> u32 {
            id + 1000
        }
    }

    #[test]
    fn copies_every_kind_of_entry_with_owners_mapped() {
        let tmp = tempfile::tempdir().unwrap();
        let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
        fs::create_dir_all(src.join("d/e")).unwrap();
        fs::write(src.join("d/f"), b"data").unwrap();
        fs::hard_link(src.join("d/f"), src.join("d/e/link")).unwrap();
        std::os::unix::fs::symlink("../nowhere", src.join("d/s")).unwrap();
        rustix::fs::mknodat(CWD, src.join("wh"), FileType::CharacterDevice, Mode::empty(), 0).unwrap();
        std::os::unix::fs::lchown(src.join("d/f"), Some(5), Some(6)).unwrap();
        fs::set_permissions(src.join("d/f"), fs::Permissions::from_mode(0o4750)).unwrap();
        rustix::fs::lsetxattr(src.join("d"), c"trusted.overlay.opaque", b"y", XattrFlags::empty()).unwrap();

        let copied = copy_tree(&src, &dst, &Plus1000).unwrap();
        assert_eq!(copied.bytes, 4);
        assert_eq!(fs::read(dst.join("d/e/link")).unwrap(), b"data");
        let f = fs::metadata(dst.join("d/f")).unwrap();
        assert_eq!((f.uid(), f.gid(), f.mode() & 0o7777, f.nlink()), (1005, 1006, 0o4750, 2));
        assert_eq!(fs::read_link(dst.join("d/s")).unwrap(), Path::new("../nowhere"));
        let wh = fs::symlink_metadata(dst.join("wh")).unwrap();
        assert!(wh.file_type().is_char_device() && wh.rdev() == 0);
        let mut v = [0u8; 4];
        assert_eq!(rustix::fs::lgetxattr(dst.join("d"), c"trusted.overlay.opaque", &mut v).unwrap(), 1);
        assert_eq!(fs::symlink_metadata(dst.join("d")).unwrap().mtime(), fs::symlink_metadata(src.join("d")).unwrap().mtime());
    }

    #[test]
    fn sparse_files_stay_sparse() {
        use std::os::unix::fs::FileExt;
        let tmp = tempfile::tempdir().unwrap();
        let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
        fs::create_dir(&src).unwrap();
        let f = fs::File::create(src.join("sparse")).unwrap();
        f.set_len(8 << 30).unwrap();
        f.write_all_at(b"middle", 3 << 30).unwrap();
        f.write_all_at(b"end", (8 << 30) - 3).unwrap();
        copy_tree(&src, &dst, &Plus1000).unwrap();
        let copy = fs::File::open(dst.join("sparse")).unwrap();
        let meta = copy.metadata().unwrap();
        assert_eq!(meta.len(), 8 << 30);
        assert!(meta.blocks() * 512 < 16 << 20, "{} bytes allocated", meta.blocks() * 512);
        let mut buf = [0u8; 6];
        copy.read_exact_at(&mut buf, 3 << 30).unwrap();
        assert_eq!(&buf, b"middle");
        copy.read_exact_at(&mut buf[..3], (8 << 30) - 3).unwrap();
        assert_eq!(&buf[..3], b"end");
    }

    #[test]
    fn shift_maps_a_range_and_clamps_outsiders_to_its_root() {
        let s = Shift { from: 100_000, to: 200_000, count: 65536 };
        assert_eq!((s.map(100_000), s.map(100_005), s.map(7)), (200_000, 200_005, 200_000));
    }
}
