//! The host's way into a sandbox's files (the files API).
//!
//! Every operation starts from a descriptor of the sandbox's root (its
//! init's `/proc/<pid>/root`) and resolves paths with `openat2`:
//! `RESOLVE_IN_ROOT` makes `..` and absolute symlinks stop at the sandbox's
//! `/`, `RESOLVE_NO_MAGICLINKS` refuses `/proc/*/fd`-style jumps, and
//! `RESOLVE_NO_XDEV` keeps a path on the sandbox's own overlay (never the
//! sandbox's `/proc`, `/sys` or `/dev`, which the host's root must not write
//! through). The kernel does the resolution in one step, so a symlink swapped
//! in mid-request cannot send the host anywhere else. Final components are
//! acted on relative to a held parent directory descriptor and are never
//! followed for writes.
//!
//! The server runs as the host's root, so what it creates is chowned to the
//! sandbox's root (the family's first host uid), as if the REPL had made it.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, RenameFlags, ResolveFlags};
use rustix::io::Errno;

/// Name prefix of an upload's temporary file (hidden from watches).
pub const UPLOAD_TEMP_PREFIX: &str = ".forkbox-upload-";

/// Longest path the API accepts (Linux's PATH_MAX).
pub const MAX_PATH: usize = 4096;

/// Linux's limits on one file's list of xattr names and on one value.
const XATTR_LIST_MAX: usize = 65536;
const XATTR_VALUE_MAX: usize = 65536;

/// What went wrong, by kind (the server maps kinds to HTTP statuses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsErrorKind {
    Invalid,
    NotFound,
    Exists,
    NotADirectory,
    IsADirectory,
    NotEmpty,
    /// The path leaves the sandbox's filesystem (a mount such as /proc).
    OtherFilesystem,
    NoSpace,
    Busy,
    Other,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct FsError {
    pub kind: FsErrorKind,
    pub message: String,
}

impl FsError {
    pub fn invalid(message: impl Into<String>) -> FsError {
        FsError { kind: FsErrorKind::Invalid, message: message.into() }
    }

    /// An errno from acting on `path`, said the way a shell would say it.
    fn at(path: &str, errno: Errno) -> FsError {
        let kind = match errno {
            Errno::NOENT => FsErrorKind::NotFound,
            Errno::EXIST => FsErrorKind::Exists,
            Errno::NOTDIR => FsErrorKind::NotADirectory,
            Errno::ISDIR => FsErrorKind::IsADirectory,
            Errno::NOTEMPTY => FsErrorKind::NotEmpty,
            Errno::XDEV => FsErrorKind::OtherFilesystem,
            Errno::NOSPC | Errno::DQUOT => FsErrorKind::NoSpace,
            Errno::BUSY | Errno::TXTBSY => FsErrorKind::Busy,
            Errno::LOOP | Errno::NAMETOOLONG | Errno::INVAL => FsErrorKind::Invalid,
            _ => FsErrorKind::Other,
        };
        let what = match errno {
            Errno::XDEV => "is on another filesystem (/proc, /sys and /dev are out of the files API's reach)".to_string(),
            Errno::LOOP => "has too many levels of symbolic links, or a /proc magic link".to_string(),
            Errno::NOSPC | Errno::DQUOT => "no space left on the sandbox's disk".to_string(),
            other => io::Error::from_raw_os_error(other.raw_os_error()).to_string().to_lowercase(),
        };
        FsError { kind, message: format!("{path}: {what}") }
    }
}

pub type FsResult<T> = Result<T, FsError>;

/// A path inside the sandbox, normalised lexically: absolute, no `.` or
/// `..` components (`..` never goes above `/`), no empty components.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxPath {
    parts: Vec<String>,
}

impl SandboxPath {
    /// Parse a path from the API; relative paths are taken from `home`.
    pub fn parse(raw: &str, home: &str) -> FsResult<SandboxPath> {
        if raw.is_empty() {
            return Err(FsError::invalid("the path is empty"));
        }
        if raw.len() > MAX_PATH {
            return Err(FsError::invalid(format!("the path is longer than {MAX_PATH} bytes")));
        }
        if raw.contains('\0') {
            return Err(FsError::invalid("the path contains a NUL byte"));
        }
        let joined = if raw.starts_with('/') { raw.to_string() } else { format!("{home}/{raw}") };
        let mut parts: Vec<String> = Vec::new();
        for part in joined.split('/') {
            match part {
                "" | "." => {}
                ".." => {
                    parts.pop();
                }
                name if name.len() > 255 => return Err(FsError::invalid(format!("`{}…`: a path component is longer than 255 bytes", &name[..32]))),
                name => parts.push(name.to_string()),
            }
        }
        Ok(SandboxPath { parts })
    }

    pub fn is_root(&self) -> bool {
        self.parts.is_empty()
    }

    /// The last component (None for `/`).
    pub fn name(&self) -> Option<&str> {
        self.parts.last().map(String::as_str)
    }

    pub fn parent(&self) -> SandboxPath {
        SandboxPath { parts: self.parts[..self.parts.len().saturating_sub(1)].to_vec() }
    }

    pub fn join(&self, name: &str) -> SandboxPath {
        let mut parts = self.parts.clone();
        parts.push(name.to_string());
        SandboxPath { parts }
    }

    /// Relative form for `openat2` against the root descriptor ("." for `/`).
    fn relative(&self) -> String {
        if self.parts.is_empty() {
            ".".into()
        } else {
            self.parts.join("/")
        }
    }

    pub fn starts_with(&self, other: &SandboxPath) -> bool {
        self.parts.starts_with(&other.parts)
    }
}

impl std::fmt::Display for SandboxPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "/{}", self.parts.join("/"))
    }
}

pub use protocol::files::{FileInfo as Metadata, FileType as EntryType};

/// The flags every resolution uses; see the module comment.
const RESOLVE: ResolveFlags = ResolveFlags::IN_ROOT.union(ResolveFlags::NO_MAGICLINKS).union(ResolveFlags::NO_XDEV);

/// One sandbox's root, opened for the host.
pub struct SandboxFs {
    root: OwnedFd,
    /// Host uid/gid of the sandbox's root (files the API makes belong to it).
    id_base: u32,
    id_count: u32,
}

impl SandboxFs {
    /// `root` must be an `O_PATH` descriptor of the sandbox's `/`.
    pub fn new(root: OwnedFd, id_base: u32, id_count: u32) -> SandboxFs {
        SandboxFs { root, id_base, id_count }
    }

    pub(crate) fn root(&self) -> &OwnedFd {
        &self.root
    }

    /// Host uid and gid of the sandbox's root user.
    pub(crate) fn root_ids(&self) -> (u32, u32) {
        (self.id_base, self.id_base)
    }

    fn open(&self, path: &SandboxPath, flags: OFlags) -> FsResult<OwnedFd> {
        rustix::fs::openat2(&self.root, path.relative(), flags | OFlags::CLOEXEC, Mode::empty(), RESOLVE).map_err(|e| FsError::at(&path.to_string(), e))
    }

    /// The directory a path's last component lives in (followed inside the
    /// root), and that component.
    fn parent_dir<'p>(&self, path: &'p SandboxPath) -> FsResult<(OwnedFd, &'p str)> {
        let name = path.name().ok_or_else(|| FsError::invalid("this needs a path below /"))?;
        let dir = self.open(&path.parent(), OFlags::PATH | OFlags::DIRECTORY)?;
        Ok((dir, name))
    }

    /// The sandbox's view of a host id.
    fn inside(&self, host: u32) -> u32 {
        if host >= self.id_base && host - self.id_base < self.id_count {
            host - self.id_base
        } else {
            65534
        }
    }

    fn metadata(&self, path: &SandboxPath, st: &rustix::fs::Stat, target: Option<String>) -> Metadata {
        let kind = match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => EntryType::File,
            FileType::Directory => EntryType::Dir,
            FileType::Symlink => EntryType::Symlink,
            _ => EntryType::Other,
        };
        Metadata {
            name: path.name().unwrap_or("/").to_string(),
            path: path.to_string(),
            kind,
            size: st.st_size as u64,
            mode: st.st_mode & 0o7777,
            mtime_ms: st.st_mtime * 1000 + (st.st_mtime_nsec / 1_000_000) as i64,
            uid: self.inside(st.st_uid),
            gid: self.inside(st.st_gid),
            target,
        }
    }

    /// `stat` (following symlinks inside the root when `follow`).
    pub fn stat(&self, path: &SandboxPath, follow: bool) -> FsResult<Metadata> {
        let flags = if follow { OFlags::PATH } else { OFlags::PATH | OFlags::NOFOLLOW };
        let fd = self.open(path, flags)?;
        let st = rustix::fs::fstat(&fd).map_err(|e| FsError::at(&path.to_string(), e))?;
        let target = if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
            rustix::fs::readlinkat(&fd, "", Vec::new()).ok().map(|t| t.to_string_lossy().into_owned())
        } else {
            None
        };
        Ok(self.metadata(path, &st, target))
    }

    /// A directory's entries, sorted by name; at most `limit` (and whether
    /// there were more).
    pub fn list(&self, path: &SandboxPath, limit: usize) -> FsResult<(Vec<Metadata>, bool)> {
        let fd = self.open(path, OFlags::RDONLY | OFlags::DIRECTORY)?;
        let mut names = Vec::new();
        let dir = Dir::read_from(&fd).map_err(|e| FsError::at(&path.to_string(), e))?;
        for entry in dir {
            let entry = entry.map_err(|e| FsError::at(&path.to_string(), e))?;
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                names.push(String::from_utf8_lossy(name).into_owned());
            }
        }
        names.sort();
        let truncated = names.len() > limit;
        names.truncate(limit);
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let child = path.join(&name);
            // Raced with a removal: skip it, as `ls` would.
            let Ok(st) = rustix::fs::statat(&fd, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) else { continue };
            let target = if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
                rustix::fs::readlinkat(&fd, name.as_str(), Vec::new()).ok().map(|t| t.to_string_lossy().into_owned())
            } else {
                None
            };
            out.push(self.metadata(&child, &st, target));
        }
        Ok((out, truncated))
    }

    /// Open a regular file for reading (symlinks followed inside the root).
    pub fn open_read(&self, path: &SandboxPath) -> FsResult<(File, Metadata)> {
        // NONBLOCK: opening a FIFO must not hang; the type check refuses it.
        let fd = self.open(path, OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY)?;
        let st = rustix::fs::fstat(&fd).map_err(|e| FsError::at(&path.to_string(), e))?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => {}
            FileType::Directory => return Err(FsError { kind: FsErrorKind::IsADirectory, message: format!("{path}: is a directory (list it with ?list=1)") }),
            _ => return Err(FsError::invalid(format!("{path}: not a regular file"))),
        }
        rustix::fs::fcntl_setfl(&fd, OFlags::empty()).map_err(|e| FsError::at(&path.to_string(), e))?;
        let meta = self.metadata(path, &st, None);
        Ok((File::from(fd), meta))
    }

    /// Start writing `path`. Without `append` the data goes to a temporary
    /// file beside it that `PendingWrite::commit` renames over the path
    /// (atomic; a symlink at the path is replaced, not followed). With
    /// `append` the file is opened for appending (created if missing).
    /// Missing parent directories are created when `parents`.
    pub fn write(&self, path: &SandboxPath, append: bool, mode: Option<u32>, parents: bool) -> FsResult<PendingWrite> {
        if let Some(m) = mode {
            check_mode(m)?;
        }
        if parents && !path.is_root() {
            self.mkdir_all(&path.parent(), None)?;
        }
        let (dir, name) = self.parent_dir(path)?;
        let dir = self.reopen_dir(&dir, &path.parent())?;
        // What the new file inherits from the one it replaces.
        let existing = match rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Some(st),
            Err(Errno::NOENT) => None,
            Err(e) => return Err(FsError::at(&path.to_string(), e)),
        };
        if let Some(st) = &existing {
            match FileType::from_raw_mode(st.st_mode) {
                FileType::Directory => return Err(FsError { kind: FsErrorKind::IsADirectory, message: format!("{path}: is a directory") }),
                FileType::Symlink if append => return Err(FsError::invalid(format!("{path}: is a symbolic link (appending does not follow it)"))),
                FileType::RegularFile => {}
                _ if append => return Err(FsError::invalid(format!("{path}: not a regular file"))),
                // Replacing renames over the name: whatever it was is gone.
                _ => {}
            }
        }
        let regular = existing.as_ref().filter(|st| FileType::from_raw_mode(st.st_mode) == FileType::RegularFile);
        let perm = mode.or(regular.map(|st| st.st_mode & 0o7777)).unwrap_or(0o644);
        let owner = regular.map(|st| (st.st_uid, st.st_gid)).unwrap_or((self.id_base, self.id_base));
        if append {
            let fd = rustix::fs::openat(
                &dir,
                name,
                OFlags::WRONLY | OFlags::APPEND | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                Mode::from_raw_mode(perm),
            )
            .map_err(|e| FsError::at(&path.to_string(), e))?;
            if existing.is_none() {
                chown_fd(&fd, owner).map_err(|e| FsError::at(&path.to_string(), e))?;
                rustix::fs::fchmod(&fd, Mode::from_raw_mode(perm)).map_err(|e| FsError::at(&path.to_string(), e))?;
            } else if let Some(m) = mode {
                rustix::fs::fchmod(&fd, Mode::from_raw_mode(m)).map_err(|e| FsError::at(&path.to_string(), e))?;
            }
            rustix::fs::fcntl_setfl(&fd, OFlags::APPEND).map_err(|e| FsError::at(&path.to_string(), e))?;
            return Ok(PendingWrite { file: Some(File::from(fd)), dir, temp: None, name: name.to_string(), path: path.to_string() });
        }
        let temp = format!("{UPLOAD_TEMP_PREFIX}{:016x}", rand::random::<u64>());
        let fd = rustix::fs::openat(
            &dir,
            temp.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| FsError::at(&path.to_string(), e))?;
        let pending = PendingWrite { file: Some(File::from(fd)), dir, temp: Some(temp), name: name.to_string(), path: path.to_string() };
        let file = pending.file.as_ref().map(|f| f.as_fd());
        if let Some(fd) = file {
            chown_fd(fd, owner).map_err(|e| FsError::at(&path.to_string(), e))?;
            rustix::fs::fchmod(fd, Mode::from_raw_mode(perm)).map_err(|e| FsError::at(&path.to_string(), e))?;
        }
        Ok(pending)
    }

    /// A directory descriptor from an `O_PATH` one, for the *at calls that
    /// create or remove entries (they accept `O_PATH` dirs, but an explicit
    /// read descriptor also proves it is still a directory).
    fn reopen_dir(&self, dir: &OwnedFd, path: &SandboxPath) -> FsResult<OwnedFd> {
        rustix::fs::openat(dir, ".", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).map_err(|e| FsError::at(&path.to_string(), e))
    }

    /// `mkdir -p`; directories it makes belong to the sandbox's root.
    /// Returns whether the last component was created.
    pub fn mkdir_all(&self, path: &SandboxPath, mode: Option<u32>) -> FsResult<bool> {
        if let Some(m) = mode {
            check_mode(m)?;
        }
        let perm = Mode::from_raw_mode(mode.unwrap_or(0o755));
        let mut dir = self.open(&SandboxPath { parts: vec![] }, OFlags::PATH | OFlags::DIRECTORY)?;
        let mut created = false;
        for i in 0..path.parts.len() {
            let name = path.parts[i].as_str();
            let here = SandboxPath { parts: path.parts[..=i].to_vec() };
            created = match rustix::fs::mkdirat(&dir, name, perm) {
                Ok(()) => {
                    // Owner and exact mode (mkdir applies the umask).
                    rustix::fs::chownat(&dir, name, Some(uid(self.id_base)), Some(gid(self.id_base)), AtFlags::SYMLINK_NOFOLLOW)
                        .and_then(|_| rustix::fs::chmodat(&dir, name, perm, AtFlags::empty()))
                        .map_err(|e| FsError::at(&here.to_string(), e))?;
                    true
                }
                Err(Errno::EXIST) => false,
                Err(e) => return Err(FsError::at(&here.to_string(), e)),
            };
            // Re-resolve from the root: a symlink here is followed inside it.
            dir = self.open(&here, OFlags::PATH | OFlags::DIRECTORY)?;
        }
        Ok(created)
    }

    /// Remove a file, symlink or empty directory; a whole tree if `recursive`.
    pub fn remove(&self, path: &SandboxPath, recursive: bool) -> FsResult<()> {
        if path.is_root() {
            return Err(FsError::invalid("refusing to remove /"));
        }
        let (dir, name) = self.parent_dir(path)?;
        let dir = self.reopen_dir(&dir, &path.parent())?;
        match rustix::fs::unlinkat(&dir, name, AtFlags::empty()) {
            Ok(()) => Ok(()),
            Err(Errno::ISDIR) | Err(Errno::PERM) => match rustix::fs::unlinkat(&dir, name, AtFlags::REMOVEDIR) {
                Ok(()) => Ok(()),
                Err(Errno::NOTEMPTY) if recursive => {
                    remove_tree(&dir, name).map_err(|e| FsError::at(&path.to_string(), e))?;
                    rustix::fs::unlinkat(&dir, name, AtFlags::REMOVEDIR).map_err(|e| FsError::at(&path.to_string(), e))
                }
                Err(Errno::NOTEMPTY) => Err(FsError { kind: FsErrorKind::NotEmpty, message: format!("{path}: directory not empty (pass recursive=1)") }),
                Err(e) => Err(FsError::at(&path.to_string(), e)),
            },
            Err(e) => Err(FsError::at(&path.to_string(), e)),
        }
    }

    /// Rename `from` to `to` (both inside the sandbox); an existing `to` is
    /// replaced only when `overwrite`.
    pub fn rename(&self, from: &SandboxPath, to: &SandboxPath, overwrite: bool) -> FsResult<()> {
        if from.is_root() || to.is_root() {
            return Err(FsError::invalid("cannot rename /"));
        }
        if to.starts_with(from) && to != from {
            return Err(FsError::invalid(format!("cannot move {from} into itself")));
        }
        let (from_dir, from_name) = self.parent_dir(from)?;
        let (to_dir, to_name) = self.parent_dir(to)?;
        let from_dir = self.reopen_dir(&from_dir, &from.parent())?;
        let to_dir = self.reopen_dir(&to_dir, &to.parent())?;
        let flags = if overwrite { RenameFlags::empty() } else { RenameFlags::NOREPLACE };
        rustix::fs::renameat_with(&from_dir, from_name, &to_dir, to_name, flags).map_err(|e| match e {
            Errno::EXIST => FsError { kind: FsErrorKind::Exists, message: format!("{to}: already exists (pass overwrite=true)") },
            Errno::NOENT => FsError::at(&from.to_string(), e),
            e => FsError::at(&to.to_string(), e),
        })
    }

    /// `chmod` (follows a symlink inside the root, as chmod(1) does).
    pub fn chmod(&self, path: &SandboxPath, mode: u32) -> FsResult<()> {
        check_mode(mode)?;
        let fd = self.open(path, OFlags::PATH)?;
        // fchmod refuses O_PATH descriptors; the descriptor's own /proc link
        // names exactly the inode resolved above.
        let via = format!("/proc/self/fd/{}", fd.as_raw_fd());
        rustix::fs::chmodat(rustix::fs::CWD, via.as_str(), Mode::from_raw_mode(mode), AtFlags::empty()).map_err(|e| FsError::at(&path.to_string(), e))
    }

    /// Give `path` (not a symlink's target) to the sandbox's user `uid` and
    /// group `gid`: what a front end writes as a user belongs to it.
    pub fn chown(&self, path: &SandboxPath, uid_inside: u32, gid_inside: u32) -> FsResult<()> {
        if uid_inside >= self.id_count || gid_inside >= self.id_count {
            return Err(FsError::invalid(format!("owner {uid_inside}:{gid_inside} is outside the sandbox's ids")));
        }
        let fd = self.open(path, OFlags::PATH | OFlags::NOFOLLOW)?;
        rustix::fs::chownat(
            &fd,
            "",
            Some(uid(self.id_base + uid_inside)),
            Some(gid(self.id_base + gid_inside)),
            AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|e| FsError::at(&path.to_string(), e))
    }

    /// The user extended attributes of `path` (followed inside the root)
    /// whose names start with `prefix` (e.g. `user.e2b.`), the prefix cut:
    /// a front end's per-file metadata. Values that are not UTF-8 are skipped.
    pub fn xattrs(&self, path: &SandboxPath, prefix: &str) -> FsResult<Vec<(String, String)>> {
        let fd = self.open(path, OFlags::PATH)?;
        // The *xattr calls refuse O_PATH descriptors; its /proc link names
        // exactly the inode resolved above (as in `chmod`).
        let via = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let at = |e| FsError::at(&path.to_string(), e);
        let names = match read_growing(XATTR_LIST_MAX, |buf| rustix::fs::listxattr(via.as_str(), buf)) {
            Ok(n) => n,
            Err(Errno::NOTSUP) => return Ok(Vec::new()),
            Err(e) => return Err(at(e)),
        };
        let mut out = Vec::new();
        for name in names.split(|b| *b == 0).filter_map(|n| std::str::from_utf8(n).ok()) {
            let Some(key) = name.strip_prefix(prefix) else { continue };
            // Raced with a removal: skip it.
            let Ok(value) = read_growing(XATTR_VALUE_MAX, |buf| rustix::fs::getxattr(via.as_str(), name, buf)) else { continue };
            if let Ok(v) = String::from_utf8(value) {
                out.push((key.to_string(), v));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Set user extended attribute `name` of `path` (followed inside the root).
    pub fn set_xattr(&self, path: &SandboxPath, name: &str, value: &[u8]) -> FsResult<()> {
        if !name.starts_with("user.") {
            return Err(FsError::invalid(format!("{name}: only user.* attributes are set through the API")));
        }
        let fd = self.open(path, OFlags::PATH)?;
        let via = format!("/proc/self/fd/{}", fd.as_raw_fd());
        rustix::fs::setxattr(via.as_str(), name, value, rustix::fs::XattrFlags::empty()).map_err(|e| match e {
            Errno::NOTSUP | Errno::PERM => FsError::invalid(format!("{path}: this file cannot carry extended attributes")),
            Errno::RANGE | Errno::TOOBIG => FsError::invalid(format!("{path}: attribute {name} is too long")),
            e => FsError::at(&path.to_string(), e),
        })
    }

    /// A directory descriptor for watching (see `watch`).
    pub fn open_dir(&self, path: &SandboxPath) -> FsResult<OwnedFd> {
        self.open(path, OFlags::RDONLY | OFlags::DIRECTORY)
    }

    /// A directory below an open one, without following symlinks or leaving
    /// its filesystem (for walking a watched tree).
    pub fn open_subdir(dir: BorrowedFd<'_>, name: &str) -> Result<OwnedFd, Errno> {
        rustix::fs::openat2(
            dir,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_XDEV,
        )
    }
}

/// What `call` fills into a buffer: a small one first (most files carry
/// few or no xattrs), the kernel's maximum if that is too short.
fn read_growing(max: usize, call: impl Fn(&mut [u8]) -> Result<usize, Errno>) -> Result<Vec<u8>, Errno> {
    let mut buf = vec![0u8; 1024];
    let n = match call(&mut buf) {
        Err(Errno::RANGE) => {
            buf = vec![0u8; max];
            call(&mut buf)?
        }
        r => r?,
    };
    buf.truncate(n);
    Ok(buf)
}

fn check_mode(mode: u32) -> FsResult<()> {
    if mode > 0o7777 {
        return Err(FsError::invalid(format!("mode {mode:#o} has bits beyond 0o7777")));
    }
    Ok(())
}

fn uid(raw: u32) -> rustix::fs::Uid {
    rustix::fs::Uid::from_raw(raw)
}

fn gid(raw: u32) -> rustix::fs::Gid {
    rustix::fs::Gid::from_raw(raw)
}

fn chown_fd<Fd: AsFd>(fd: Fd, (u, g): (u32, u32)) -> Result<(), Errno> {
    rustix::fs::fchown(fd, Some(uid(u)), Some(gid(g)))
}

/// Empty the directory `name` under `parent` (never following symlinks or
/// leaving the filesystem).
fn remove_tree(parent: &OwnedFd, name: &str) -> Result<(), Errno> {
    let dir = SandboxFs::open_subdir(parent.as_fd(), name)?;
    let mut names = Vec::new();
    for entry in Dir::read_from(&dir)? {
        let entry = entry?;
        let n = entry.file_name().to_bytes();
        if n != b"." && n != b".." {
            names.push(String::from_utf8_lossy(n).into_owned());
        }
    }
    for n in names {
        match rustix::fs::unlinkat(&dir, n.as_str(), AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(Errno::ISDIR) | Err(Errno::PERM) => {
                remove_tree(&dir, &n)?;
                rustix::fs::unlinkat(&dir, n.as_str(), AtFlags::REMOVEDIR)?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A write in progress (see `SandboxFs::write`). Dropping it without
/// `commit` removes the temporary file: a failed upload leaves nothing.
pub struct PendingWrite {
    file: Option<File>,
    dir: OwnedFd,
    temp: Option<String>,
    name: String,
    path: String,
}

impl PendingWrite {
    /// The file to write the data to.
    pub fn file(&mut self) -> &mut File {
        self.file.as_mut().expect("a pending write has its file until commit")
    }

    /// Finish: rename the temporary file over the path.
    pub fn commit(mut self) -> FsResult<()> {
        self.file.take();
        if let Some(temp) = self.temp.take() {
            if let Err(e) = rustix::fs::renameat(&self.dir, temp.as_str(), &self.dir, self.name.as_str()) {
                let _ = rustix::fs::unlinkat(&self.dir, temp.as_str(), AtFlags::empty());
                return Err(FsError::at(&self.path, e));
            }
        }
        Ok(())
    }

    /// Map a write error on the file to an `FsError` about the path.
    pub fn error(&self, e: &io::Error) -> FsError {
        FsError::at(&self.path, e.raw_os_error().map(Errno::from_raw_os_error).unwrap_or(Errno::IO))
    }
}

impl Drop for PendingWrite {
    fn drop(&mut self) {
        if let Some(temp) = self.temp.take() {
            let _ = rustix::fs::unlinkat(&self.dir, temp.as_str(), AtFlags::empty());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> String {
        SandboxPath::parse(s, "/root").unwrap().to_string()
    }

    #[test]
    fn paths_normalise_inside_the_root() {
        assert_eq!(p("/a/b/../c"), "/a/c");
        assert_eq!(p("../../../etc/passwd"), "/etc/passwd");
        assert_eq!(p("/../.."), "/");
        assert_eq!(p("x/./y//z"), "/root/x/y/z");
        assert_eq!(p("/"), "/");
    }

    #[test]
    fn bad_paths_are_refused() {
        assert!(SandboxPath::parse("", "/root").is_err());
        assert!(SandboxPath::parse("a\0b", "/root").is_err());
        assert!(SandboxPath::parse(&"a/".repeat(2100), "/root").is_err());
        assert!(SandboxPath::parse(&format!("/{}", "n".repeat(256)), "/root").is_err());
        assert!(SandboxPath::parse(&format!("/{}", "n".repeat(255)), "/root").is_ok());
    }

    /// A SandboxFs over a temporary directory (the root needs no namespace).
    fn fs_over(dir: &std::path::Path) -> SandboxFs {
        let root = rustix::fs::open(dir, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).unwrap();
        let me = rustix::process::getuid().as_raw();
        SandboxFs::new(root, me, 1)
    }

    #[test]
    fn symlinks_resolve_inside_the_root() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "host").unwrap();
        std::fs::write(tmp.path().join("inner"), "sandbox").unwrap();
        std::os::unix::fs::symlink("/inner", tmp.path().join("abs")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), tmp.path().join("escape")).unwrap();
        std::os::unix::fs::symlink("../../../../../../", tmp.path().join("up")).unwrap();
        let fs = fs_over(tmp.path());
        let read = |s: &str| {
            use std::io::Read;
            let (mut f, _) = fs.open_read(&SandboxPath::parse(s, "/")?)?;
            let mut out = String::new();
            f.read_to_string(&mut out).unwrap();
            Ok::<_, FsError>(out)
        };
        assert_eq!(read("/abs").unwrap(), "sandbox");
        assert_eq!(read("/escape").unwrap_err().kind, FsErrorKind::NotFound);
        assert_eq!(read("/up/inner").unwrap(), "sandbox");
    }

    #[test]
    fn writes_are_atomic_and_replace_symlinks() {
        use std::io::Write;
        let tmp = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("target"), "host").unwrap();
        std::os::unix::fs::symlink(outside.path().join("target"), tmp.path().join("link")).unwrap();
        let fs = fs_over(tmp.path());
        let path = SandboxPath::parse("/link", "/").unwrap();
        let mut w = fs.write(&path, false, None, false).unwrap();
        w.file().write_all(b"new").unwrap();
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 2, "the temporary file sits beside the target");
        w.commit().unwrap();
        assert_eq!(std::fs::read_to_string(outside.path().join("target")).unwrap(), "host");
        assert_eq!(std::fs::read_to_string(tmp.path().join("link")).unwrap(), "new");
        // An abandoned write leaves nothing behind.
        let mut w = fs.write(&SandboxPath::parse("/d/e/f", "/").unwrap(), false, Some(0o600), true).unwrap();
        w.file().write_all(b"half").unwrap();
        drop(w);
        assert_eq!(std::fs::read_dir(tmp.path().join("d/e")).unwrap().count(), 0);
    }

    #[test]
    fn remove_and_rename_refuse_what_they_should() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("a/b/c")).unwrap();
        std::fs::write(tmp.path().join("a/b/c/f"), "x").unwrap();
        std::fs::write(tmp.path().join("g"), "y").unwrap();
        let fs = fs_over(tmp.path());
        let sp = |s: &str| SandboxPath::parse(s, "/").unwrap();
        assert_eq!(fs.remove(&sp("/a"), false).unwrap_err().kind, FsErrorKind::NotEmpty);
        assert_eq!(fs.rename(&sp("/a"), &sp("/a/b/x"), false).unwrap_err().kind, FsErrorKind::Invalid);
        assert_eq!(fs.rename(&sp("/g"), &sp("/a"), false).unwrap_err().kind, FsErrorKind::Exists);
        assert!(fs.remove(&sp("/"), true).is_err());
        fs.remove(&sp("/a"), true).unwrap();
        assert!(!tmp.path().join("a").exists());
        let (entries, truncated) = fs.list(&sp("/"), 10).unwrap();
        assert_eq!(entries.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["g"]);
        assert!(!truncated);
    }

    #[test]
    fn user_xattrs_round_trip_and_stay_inside() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("f"), "x").unwrap();
        std::fs::write(outside.path().join("host"), "h").unwrap();
        std::os::unix::fs::symlink(outside.path().join("host"), tmp.path().join("escape")).unwrap();
        let fs = fs_over(tmp.path());
        let sp = |s: &str| SandboxPath::parse(s, "/").unwrap();
        let long = "v".repeat(2000); // past the first, small read buffer (and within ext4's one block)
        fs.set_xattr(&sp("/f"), "user.e2b.a", b"1").unwrap();
        fs.set_xattr(&sp("/f"), "user.e2b.long", long.as_bytes()).unwrap();
        fs.set_xattr(&sp("/f"), "user.other", b"no").unwrap();
        assert_eq!(fs.xattrs(&sp("/f"), "user.e2b.").unwrap(), vec![("a".to_string(), "1".to_string()), ("long".to_string(), long)]);
        assert_eq!(fs.set_xattr(&sp("/f"), "trusted.overlay.opaque", b"y").unwrap_err().kind, FsErrorKind::Invalid);
        assert_eq!(fs.set_xattr(&sp("/escape"), "user.e2b.a", b"1").unwrap_err().kind, FsErrorKind::NotFound);
        assert_eq!(fs.xattrs(&sp("/escape"), "user.").unwrap_err().kind, FsErrorKind::NotFound);
    }
}
