//! Diff two sandboxes' files from their overlay layers, on the host.
//!
//! [`diff`] answers what podflare's client-side `Sandbox.diff` computes by
//! running `find <paths> -type f -exec sha256sum {} + | sort` in both
//! sandboxes, without entering either: it reads each sandbox's merged view
//! (upper layer over the template) straight from the layers. When both
//! sandboxes run on the same template, what neither of them changed is never
//! looked at, so the cost follows the changes, not the template's size.
//!
//! Only the overlay is read: paths under mounts made inside a sandbox (/proc,
//! /dev, /sys, masked paths) show what the layers hold there instead. Paths
//! are taken literally (podflare pastes them into a shell command line).
//! Names podflare's parser folds into one key (trailing whitespace, Python
//! line breaks, invalid UTF-8) match it only while all such names lie in
//! what the sandboxes changed: where several files share a key, podflare
//! keeps whichever hash sorts last.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::CStr;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{open, openat2, readlinkat, AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, fstatat, FileStat, Mode};

use crate::error::{Error, Result};

/// Paths podflare's `diff` looks at when given none.
const DEFAULT_PATHS: [&str; 2] = ["/root", "/tmp"];
const MAX_PATHS: usize = 64;
/// The kernel refuses paths this long or longer (`ENAMETOOLONG`), so `find`
/// cannot start there and `sha256sum` cannot open what it would print.
const PATH_MAX: usize = 4096;
/// Symlinks one path walk may follow before the kernel says `ELOOP`.
const MAX_HOPS: usize = 40;

const OPAQUE: &CStr = c"trusted.overlay.opaque";
const REDIRECT: &CStr = c"trusted.overlay.redirect";
const METACOPY: &CStr = c"trusted.overlay.metacopy";

/// One sandbox's filesystem as overlayfs layers on the host.
#[derive(Debug, Clone, Copy)]
pub struct Layers<'a> {
    pub upper: &'a Path,
    pub lower: &'a Path,
}

/// Sandbox paths as podflare prints them, each list sorted.
#[derive(Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Diff {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub modified: Vec<String>,
}

/// What `podflare`'s client-side `Sandbox.diff(other, paths)` returns,
/// computed from the layers: files `other` has and `this` lacks are added,
/// the reverse removed, and those whose contents differ modified.
pub fn diff(this: &Layers, other: &Layers, paths: &[String]) -> Result<Diff> {
    let paths = starting_points(paths)?;
    let views = [View::new(this)?, View::new(other)?];
    let mut starts = Vec::new();
    for path in paths {
        let nodes = [views[0].resolve(&path)?, views[1].resolve(&path)?];
        starts.push((path, nodes));
    }
    let mut walk = Walk { views: [&views[0], &views[1]], starts, both: BTreeMap::new(), only: Default::default(), btrfs: HashMap::new() };
    for i in 0..walk.starts.len() {
        let (start, nodes) = walk.starts[i].clone();
        walk.walk(start, nodes)?;
    }
    walk.finish()
}

/// Checked starting points, as bytes, without repeats (a repeat lists the
/// same files again, which podflare's dict folds away).
fn starting_points(paths: &[String]) -> Result<Vec<Vec<u8>>> {
    if paths.len() > MAX_PATHS {
        return Err(Error::Invalid(format!("at most {MAX_PATHS} paths")));
    }
    let given: Vec<&str> = if paths.is_empty() { DEFAULT_PATHS.to_vec() } else { paths.iter().map(String::as_str).collect() };
    let mut out: Vec<Vec<u8>> = Vec::new();
    for path in given {
        if !path.starts_with('/') || path.contains('\0') || path.len() > PATH_MAX {
            return Err(Error::Invalid(format!("diff paths must be absolute, without NUL, at most {PATH_MAX} bytes: {path:?}")));
        }
        if !out.iter().any(|p| p == path.as_bytes()) {
            out.push(path.as_bytes().to_vec());
        }
    }
    Ok(out)
}

/// An inode, which makes two layer entries the same file.
type Id = (u64, u64);

/// A directory of a merged view: `rel` in the upper layer if `upper`, and the
/// lower directory at `rel` if it shows through.
#[derive(Clone)]
struct MDir {
    rel: Vec<u8>,
    upper: bool,
    lower: Option<Id>,
}

/// A regular file of a merged view, at `rel` in the layer it comes from.
#[derive(Clone)]
struct MFile {
    rel: Vec<u8>,
    upper: bool,
    id: Id,
    size: i64,
}

/// What a name is in a merged view.
#[derive(Clone)]
enum Node {
    Missing,
    Dir(MDir),
    File(MFile),
    Link { upper: bool },
    Other,
}

/// A merged directory's layer directories, opened.
struct Opened {
    upper: Option<OwnedFd>,
    lower: Option<(OwnedFd, Id)>,
}

/// One sandbox's merged view, read from its layers.
struct View {
    upper: OwnedFd,
    lower: OwnedFd,
    lower_id: Id,
}

impl View {
    fn new(layers: &Layers) -> Result<View> {
        let dir =
            |path: &Path| open(path, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty()).map_err(|e| Error::sys("open overlay layer", e));
        let (upper, lower) = (dir(layers.upper)?, dir(layers.lower)?);
        let lower_id = id(&fstat(&lower).map_err(|e| Error::sys("stat overlay layer", e))?);
        Ok(View { upper, lower, lower_id })
    }

    fn root(&self) -> MDir {
        MDir { rel: Vec::new(), upper: true, lower: Some(self.lower_id) }
    }

    fn open(&self, dir: &MDir) -> Result<Opened> {
        let upper = match dir.upper {
            true => open_beneath(&self.upper, &dir.rel, OFlag::O_DIRECTORY)?,
            false => None,
        };
        let mut lower = dir.lower;
        if let Some(fd) = &upper {
            // With redirect_dir the lower directory may live elsewhere.
            if xattr(fd, REDIRECT)?.is_some() {
                return Err(unsupported());
            }
            // overlayfs ignores an opaque mark on its root.
            if !dir.rel.is_empty() && xattr(fd, OPAQUE)?.as_deref() == Some(b"y") {
                lower = None;
            }
        }
        let lower = match lower {
            Some(id) => open_beneath(&self.lower, &dir.rel, OFlag::O_DIRECTORY)?.map(|fd| (fd, id)),
            None => None,
        };
        Ok(Opened { upper, lower })
    }

    /// The entry `name` of `dir` (opened as `at`), by overlayfs's rules: an
    /// upper entry hides the lower one (a whiteout hides it and is gone
    /// itself) unless both are directories, which merge.
    fn child(&self, at: &Opened, dir: &MDir, name: &[u8]) -> Result<Node> {
        let mut rel = dir.rel.clone();
        if !rel.is_empty() {
            rel.push(b'/');
        }
        rel.extend_from_slice(name);
        if let Some(upper) = &at.upper {
            if let Some(st) = lstat_at(upper, name)? {
                let node = match st.st_mode & libc::S_IFMT {
                    libc::S_IFCHR if st.st_rdev == 0 => Node::Missing,
                    libc::S_IFDIR => {
                        let lower = match &at.lower {
                            Some((fd, _)) => lstat_at(fd, name)?.filter(is_dir).map(|st| id(&st)),
                            None => None,
                        };
                        Node::Dir(MDir { rel, upper: true, lower })
                    }
                    _ => leaf(&st, rel, true),
                };
                return Ok(node);
            }
        }
        if let Some((lower, _)) = &at.lower {
            if let Some(st) = lstat_at(lower, name)? {
                return Ok(match is_dir(&st) {
                    true => Node::Dir(MDir { rel, upper: false, lower: Some(id(&st)) }),
                    false => leaf(&st, rel, false),
                });
            }
        }
        Ok(Node::Missing)
    }

    /// What `find`'s `lstat` of a starting point finds. The kernel follows
    /// symlinks in every component but the last (and in the last too when a
    /// slash follows it), inside the sandbox: an absolute target starts from
    /// the sandbox's root, and `..` stops there.
    fn resolve(&self, path: &[u8]) -> Result<Node> {
        if path.len() >= PATH_MAX {
            return Ok(Node::Missing);
        }
        let follow_last = path.ends_with(b"/");
        let mut todo: Vec<Vec<u8>> = components(path).rev().map(<[u8]>::to_vec).collect();
        let mut stack = vec![self.root()];
        let mut hops = 0;
        while let Some(name) = todo.pop() {
            let last = todo.is_empty();
            if name == b"." {
                continue;
            }
            if name == b".." {
                if stack.len() > 1 {
                    stack.pop();
                }
                continue;
            }
            let dir = stack.last().expect("the root stays");
            let at = self.open(dir)?;
            match self.child(&at, dir, &name)? {
                Node::Dir(d) => stack.push(d),
                Node::Link { upper } if !last || follow_last => {
                    hops += 1;
                    let fd = match upper {
                        true => at.upper.as_ref(),
                        false => at.lower.as_ref().map(|(fd, _)| fd),
                    };
                    let target = match fd.map(|fd| readlinkat(fd, name.as_slice())) {
                        Some(Ok(target)) => target.into_vec(),
                        _ => return Ok(Node::Missing),
                    };
                    if hops > MAX_HOPS || target.is_empty() {
                        return Ok(Node::Missing);
                    }
                    if target.starts_with(b"/") {
                        stack.truncate(1);
                    }
                    todo.extend(components(&target).rev().map(<[u8]>::to_vec));
                }
                node if last && !follow_last => return Ok(node),
                _ => return Ok(Node::Missing),
            }
        }
        Ok(Node::Dir(stack.pop().expect("the root stays")))
    }

    /// The regular file at `rel` below `dir`, if every step is a directory.
    fn file_below(&self, dir: &MDir, rel: &[u8]) -> Result<Option<MFile>> {
        let mut dir = dir.clone();
        let mut names = rel.split(|b| *b == b'/').peekable();
        while let Some(name) = names.next() {
            if matches!(name, b"" | b"." | b"..") {
                return Ok(None);
            }
            let at = self.open(&dir)?;
            match (self.child(&at, &dir, name)?, names.peek().is_none()) {
                (Node::File(f), true) => return Ok(Some(f)),
                (Node::Dir(d), false) => dir = d,
                _ => return Ok(None),
            }
        }
        Ok(None)
    }

    /// Opens a file to compare it, or None if it changed under us.
    fn open_file(&self, f: &MFile) -> Result<Option<(File, FileStat)>> {
        let (root, event) = match f.upper {
            true => (&self.upper, "read upper"),
            false => (&self.lower, "read lower"),
        };
        trace(event, &f.rel);
        let Some(fd) = open_beneath(root, &f.rel, OFlag::empty())? else {
            return Ok(None);
        };
        let st = fstat(&fd).map_err(|e| Error::sys("stat layer file", e))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Ok(None);
        }
        // A metacopy upper holds no data: it is in a lower file.
        if f.upper && xattr(&fd, METACOPY)?.is_some() {
            return Err(unsupported());
        }
        Ok(Some((File::from(fd), st)))
    }
}

/// The comparison of two views, one printed path at a time. Printed paths
/// are what `find` prints: the starting point as given, then `/` and the
/// path below it (no second slash when the starting point ends in one).
struct Walk<'a> {
    views: [&'a View; 2],
    /// Each starting point and what it reaches in each view.
    starts: Vec<(Vec<u8>, [Node; 2])>,
    /// Files both views print, and whether their contents differ.
    both: BTreeMap<Vec<u8>, bool>,
    /// Files one view prints where the same starting point in the other
    /// prints nothing. (A view that prints a file from one starting point
    /// also prints it from any deeper one above it, so the walk from the
    /// deepest puts it in `both` if both views print it at all.)
    only: [BTreeSet<Vec<u8>>; 2],
    /// The btrfs filesystem (if any) behind each device seen: extents are
    /// comparable within one, and btrfs gives each subvolume its own device.
    btrfs: HashMap<u64, Option<[u8; 16]>>,
}

impl Walk<'_> {
    fn walk(&mut self, start: Vec<u8>, nodes: [Node; 2]) -> Result<()> {
        let mut todo = vec![(start, nodes)];
        while let Some((printed, nodes)) = todo.pop() {
            if printed.len() >= PATH_MAX {
                continue;
            }
            if let [Node::File(a), Node::File(b)] = &nodes {
                // Nested starting points print some files more than once.
                if !self.both.contains_key(&printed) {
                    let differs = self.differs(a, b)?;
                    self.both.insert(printed, differs);
                }
                continue;
            }
            for (side, node) in nodes.iter().enumerate() {
                if let Node::File(_) = node {
                    self.only[side].insert(printed.clone());
                }
            }
            let dirs = nodes.map(|node| match node {
                Node::Dir(d) => Some(d),
                _ => None,
            });
            if dirs.iter().any(Option::is_some) {
                self.children(&printed, dirs, &mut todo)?;
            }
        }
        Ok(())
    }

    /// Queues the entries of a directory in either view or both.
    fn children(&self, printed: &[u8], dirs: [Option<MDir>; 2], todo: &mut Vec<(Vec<u8>, [Node; 2])>) -> Result<()> {
        let mut opened = [None, None];
        for side in 0..2 {
            if let Some(dir) = &dirs[side] {
                opened[side] = Some(self.views[side].open(dir)?);
            }
        }
        let lower_id = |side: usize| opened[side].as_ref().and_then(|o| o.lower.as_ref()).map(|l| l.1);
        // Where both views see the same lower directory, its entries that
        // neither upper touches are the same in both: skip them unseen.
        let shared = lower_id(0).is_some() && lower_id(0) == lower_id(1);
        let mut names = BTreeSet::new();
        for (o, dir) in opened.iter().zip(&dirs) {
            let (Some(o), Some(dir)) = (o, dir) else {
                continue;
            };
            if let Some(fd) = &o.upper {
                names.extend(list(fd)?);
            }
            if let (Some((fd, _)), false) = (&o.lower, shared) {
                trace("list lower", &dir.rel);
                names.extend(list(fd)?);
            }
        }
        let mut prefix = printed.to_vec();
        if !prefix.ends_with(b"/") {
            prefix.push(b'/');
        }
        for name in names {
            let mut nodes = [Node::Missing, Node::Missing];
            for side in 0..2 {
                if let (Some(o), Some(dir)) = (&opened[side], &dirs[side]) {
                    nodes[side] = self.views[side].child(o, dir, &name)?;
                }
            }
            todo.push(([prefix.as_slice(), &name].concat(), nodes));
        }
        Ok(())
    }

    /// Whether two files' contents differ, read only when nothing cheaper
    /// can tell.
    fn differs(&mut self, a: &MFile, b: &MFile) -> Result<bool> {
        if a.id == b.id {
            return Ok(false);
        }
        if a.size != b.size {
            return Ok(true);
        }
        let (Some(fa), Some(fb)) = (self.views[0].open_file(a)?, self.views[1].open_file(b)?) else {
            return Ok(true);
        };
        if fa.1.st_size != fb.1.st_size {
            return Ok(true);
        }
        // btrfs snapshots and reflinks share the extents of unchanged data.
        // Small files are cheaper to read than to map (and usually live
        // inline in btrfs metadata, where FIEMAP cannot tell anyway).
        let small = (fa.1.st_size as u64) <= SMALL_FILE;
        let fs = if small { None } else { self.btrfs(&fa.0, fa.1.st_dev) };
        if fs.is_some() && fs == self.btrfs(&fb.0, fb.1.st_dev) {
            if let (Some(x), Some(y)) = (extents(&fa.0), extents(&fb.0)) {
                if !x.is_empty() && x == y {
                    return Ok(false);
                }
            }
        }
        trace("compare", &a.rel);
        Ok(!same_bytes(fa.0, fb.0, fa.1.st_size as u64)?)
    }

    fn btrfs(&mut self, file: &File, dev: u64) -> Option<[u8; 16]> {
        *self.btrfs.entry(dev).or_insert_with(|| crate::volume::btrfs_fsid(file))
    }

    /// The file one view prints as `printed` from any starting point.
    fn lookup(&self, side: usize, printed: &[u8]) -> Result<Option<MFile>> {
        for (start, nodes) in &self.starts {
            match &nodes[side] {
                Node::File(f) if printed == start.as_slice() => return Ok(Some(f.clone())),
                Node::Dir(dir) => {
                    let below = match start.ends_with(b"/") {
                        true => printed.strip_prefix(start.as_slice()),
                        false => printed.strip_prefix(start.as_slice()).and_then(|r| r.strip_prefix(b"/")),
                    };
                    if let Some(f) = below.map(|rel| self.views[side].file_below(dir, rel)).transpose()?.flatten() {
                        return Ok(Some(f));
                    }
                }
                _ => {}
            }
        }
        Ok(None)
    }

    /// The diff of podflare's two dicts, keyed as its parser keys them.
    fn finish(mut self) -> Result<Diff> {
        let mut keys: [BTreeMap<String, BTreeSet<Source>>; 2] = Default::default();
        for printed in self.both.keys() {
            for side in &mut keys {
                add_keys(side, printed);
            }
        }
        for (side, printed) in self.only.iter().enumerate() {
            for p in printed {
                add_keys(&mut keys[side], p);
            }
        }
        let mut diff = Diff::default();
        for (key, ours) in &keys[0] {
            match keys[1].get(key) {
                None => diff.removed.push(key.clone()),
                Some(theirs) if self.modified(ours, theirs)? => diff.modified.push(key.clone()),
                Some(_) => {}
            }
        }
        diff.added = keys[1].keys().filter(|k| !keys[0].contains_key(*k)).cloned().collect();
        Ok(diff)
    }

    /// Whether podflare's values for one key differ between the views.
    fn modified(&mut self, ours: &BTreeSet<Source>, theirs: &BTreeSet<Source>) -> Result<bool> {
        if ours == theirs {
            // Where several names make one key, podflare keeps the hash
            // that sorts last: call it modified unless they all agree.
            return Ok(ours.iter().any(|s| matches!(s, Source::File(p) if self.both.get(p) != Some(&false))));
        }
        match (ours.first(), theirs.first(), ours.len(), theirs.len()) {
            // One file on each side, printed under names that make one key.
            (Some(Source::File(x)), Some(Source::File(y)), 1, 1) => match (self.lookup(0, x)?, self.lookup(1, y)?) {
                (Some(a), Some(b)) => self.differs(&a, &b),
                _ => Ok(true),
            },
            _ => Ok(true),
        }
    }
}

/// What podflare's parser stores under a key: the hash of a printed file,
/// or, after a line break Python splits on, the first word of a name piece.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum Source {
    File(Vec<u8>),
    Text(String),
}

/// Adds the dict entries podflare's parser makes of the `sha256sum` line
/// for `printed`: sha256sum escapes `\`, `\n` and `\r` (coreutils 9), the
/// server sends the line as lossy UTF-8, and the parser splits lines the
/// way Python's `splitlines` does and strips Python's whitespace.
fn add_keys(keys: &mut BTreeMap<String, BTreeSet<Source>>, printed: &[u8]) {
    let mut escaped = Vec::with_capacity(printed.len());
    for &b in printed {
        match b {
            b'\\' => escaped.extend_from_slice(b"\\\\"),
            b'\n' => escaped.extend_from_slice(b"\\n"),
            b'\r' => escaped.extend_from_slice(b"\\r"),
            _ => escaped.push(b),
        }
    }
    let text = String::from_utf8_lossy(&escaped);
    let mut pieces = text.split(is_py_line_break);
    // The first piece follows "<hash>  " and starts with '/'.
    let first = pieces.next().unwrap_or_default().trim_end_matches(is_py_space);
    keys.entry(first.to_string()).or_default().insert(Source::File(printed.to_vec()));
    for piece in pieces {
        if let Some((word, rest)) = piece.trim_matches(is_py_space).split_once(is_py_space) {
            let key = rest.trim_start_matches(is_py_space).to_string();
            keys.entry(key).or_default().insert(Source::Text(word.to_string()));
        }
    }
}

/// Python's `str.isspace`.
fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// The line boundaries of Python's `str.splitlines`.
fn is_py_line_break(c: char) -> bool {
    matches!(c, '\n' | '\r' | '\u{b}' | '\u{c}' | '\u{1c}'..='\u{1e}' | '\u{85}' | '\u{2028}' | '\u{2029}')
}

fn unsupported() -> Error {
    Error::Unsupported("diffing overlay layers made with redirect_dir or metacopy".into())
}

fn components(path: &[u8]) -> impl DoubleEndedIterator<Item = &[u8]> {
    path.split(|b| *b == b'/').filter(|c| !c.is_empty())
}

fn id(st: &FileStat) -> Id {
    (st.st_dev, st.st_ino)
}

fn is_dir(st: &FileStat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

fn leaf(st: &FileStat, rel: Vec<u8>, upper: bool) -> Node {
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => Node::File(MFile { rel, upper, id: id(st), size: st.st_size }),
        libc::S_IFLNK => Node::Link { upper },
        _ => Node::Other,
    }
}

/// Opens `rel` below a layer's root without following any symlink, so
/// nothing a sandbox wrote can lead the host elsewhere; None if it is gone.
fn open_beneath(root: &OwnedFd, rel: &[u8], flags: OFlag) -> Result<Option<OwnedFd>> {
    let path: &[u8] = if rel.is_empty() { b"." } else { rel };
    let flags = flags | OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
    let how = OpenHow::new().flags(flags).resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
    match openat2(root, path, how) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => Ok(None),
        Err(e) => Err(Error::sys("open overlay layer entry", e)),
    }
}

/// `lstat` of one name in a directory; None where there is none.
fn lstat_at(dir: &OwnedFd, name: &[u8]) -> Result<Option<FileStat>> {
    match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ENAMETOOLONG) => Ok(None),
        Err(e) => Err(Error::sys("stat overlay layer entry", e)),
    }
}

fn list(dir: &OwnedFd) -> Result<Vec<Vec<u8>>> {
    // The fd's magic link reopens that very directory, whatever its path.
    let entries = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd())).map_err(|e| Error::io("list overlay layer dir", e))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io("list overlay layer dir", e))?;
        names.push(entry.file_name().into_vec());
    }
    Ok(names)
}

/// An xattr of a layer entry, if set (empty if longer than we care about).
fn xattr(fd: &OwnedFd, name: &CStr) -> Result<Option<Vec<u8>>> {
    let mut buf = [0u8; 16];
    // SAFETY: `fd` is open, `name` is NUL-terminated and `buf` is writable
    // for the length we pass.
    let n = unsafe { libc::fgetxattr(fd.as_raw_fd(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    match Errno::result(n) {
        Ok(n) => Ok(Some(buf[..n as usize].to_vec())),
        Err(Errno::ERANGE) => Ok(Some(Vec::new())),
        Err(Errno::ENODATA | Errno::EOPNOTSUPP) => Ok(None),
        Err(e) => Err(Error::sys("read overlay xattr", e)),
    }
}

/// Files up to this size are compared by reading them, without FIEMAP.
const SMALL_FILE: u64 = 64 << 10;

fn same_bytes(mut a: File, mut b: File, size: u64) -> Result<bool> {
    // One read past the expected size tells a file that grew meanwhile.
    let chunk = (size as usize + 1).min(1 << 16);
    let (mut x, mut y) = (vec![0u8; chunk], vec![0u8; chunk]);
    loop {
        let n = fill(&mut a, &mut x)?;
        let m = fill(&mut b, &mut y)?;
        if x[..n] != y[..m] {
            return Ok(false);
        }
        if n < x.len() {
            return Ok(true);
        }
    }
}

/// Reads until `buf` is full or the file ends.
fn fill(file: &mut File, buf: &mut [u8]) -> Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io("read overlay layer file", e)),
        }
    }
    Ok(n)
}

/// `struct fiemap`, followed by room for a batch of extents.
#[repr(C)]
struct Fiemap {
    start: u64,
    length: u64,
    flags: u32,
    mapped: u32,
    count: u32,
    reserved: u32,
    extents: [FiemapExtent; FIEMAP_BATCH],
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct FiemapExtent {
    logical: u64,
    physical: u64,
    length: u64,
    reserved64: [u64; 2],
    flags: u32,
    reserved: [u32; 3],
}

/// The header alone: its size is what `FS_IOC_FIEMAP`'s number encodes.
#[repr(C)]
struct FiemapHeader([u64; 4]);

const FIEMAP_BATCH: usize = 64;
/// Write dirty pages back first: until then an overwrite of shared data
/// still shows the shared extent.
const FIEMAP_FLAG_SYNC: u32 = 0x1;
const FIEMAP_MAX_EXTENTS: usize = 1 << 16;
const FIEMAP_EXTENT_LAST: u32 = 0x1;
const FIEMAP_EXTENT_SHARED: u32 = 0x2000;

nix::ioctl_readwrite!(fs_ioc_fiemap, b'f', 11, FiemapHeader);

/// A file's extents as (logical, physical, length); None when any is not
/// plain data on disk (inline, delayed, encoded, unknown) or FIEMAP fails.
fn extents(file: &File) -> Option<Vec<(u64, u64, u64)>> {
    let mut out = Vec::new();
    let mut start = 0u64;
    loop {
        let mut map = Fiemap {
            start,
            length: u64::MAX - start,
            flags: FIEMAP_FLAG_SYNC,
            mapped: 0,
            count: FIEMAP_BATCH as u32,
            reserved: 0,
            extents: [FiemapExtent::default(); FIEMAP_BATCH],
        };
        // SAFETY: `map` is a `struct fiemap` with room for `count` extents
        // after it, which is all the ioctl writes.
        unsafe { fs_ioc_fiemap(file.as_raw_fd(), std::ptr::addr_of_mut!(map).cast()) }.ok()?;
        let got = &map.extents[..(map.mapped as usize).min(FIEMAP_BATCH)];
        for e in got {
            if e.flags & !(FIEMAP_EXTENT_LAST | FIEMAP_EXTENT_SHARED) != 0 {
                return None;
            }
            out.push((e.logical, e.physical, e.length));
        }
        match got.last() {
            Some(e) if e.flags & FIEMAP_EXTENT_LAST == 0 => {
                if out.len() >= FIEMAP_MAX_EXTENTS {
                    return None;
                }
                start = e.logical.checked_add(e.length)?;
            }
            _ => return Some(out),
        }
    }
}

#[cfg(test)]
thread_local! {
    /// Layer entries this thread read or listed, so tests can check what
    /// was left alone.
    static TRACE: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn trace(event: &str, rel: &[u8]) {
    #[cfg(test)]
    TRACE.with(|t| t.borrow_mut().push(format!("{event} {}", String::from_utf8_lossy(rel))));
    #[cfg(not(test))]
    let _ = (event, rel);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::{CString, OsStr};
    use std::fs;
    use std::io::{Seek, SeekFrom, Write};
    use std::os::unix::ffi::OsStrExt;
    use std::path::PathBuf;
    use std::process::{Command, Stdio};
    use std::sync::atomic::{AtomicUsize, Ordering};

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// Layers of two sandboxes, `a` and `b`, over the template `lower`, in a
    /// scratch directory on disk (tmpfs may lack trusted xattrs).
    struct Fixture {
        tmp: tempfile::TempDir,
    }

    impl Fixture {
        fn new() -> Fixture {
            let tmp = tempfile::Builder::new().prefix("forkbox-diff-").tempdir_in("/var/tmp").unwrap();
            let f = Fixture { tmp };
            for layer in ["lower", "a", "b"] {
                fs::create_dir(f.path(layer, "")).unwrap();
            }
            f.template("lower");
            f
        }

        fn path(&self, layer: &str, rel: impl AsRef<OsStr>) -> PathBuf {
            let path = self.tmp.path().join(layer);
            match rel.as_ref().is_empty() {
                true => path,
                false => path.join(rel.as_ref()),
            }
        }

        /// What the oracle's chroot needs to run `find`: a `usr` to bind the
        /// host's over, and the usual links into it. No files.
        fn template(&self, layer: &str) {
            fs::create_dir_all(self.path(layer, "usr")).unwrap();
            for dir in ["bin", "lib", "lib64", "sbin"] {
                std::os::unix::fs::symlink(format!("usr/{dir}"), self.path(layer, dir)).unwrap();
            }
        }

        fn put(&self, layer: &str, rel: impl AsRef<OsStr>, data: &str) {
            let path = self.path(layer, rel);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, data).unwrap();
        }

        fn link(&self, layer: &str, rel: &str, target: &str) {
            let path = self.path(layer, rel);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::os::unix::fs::symlink(target, path).unwrap();
        }

        fn whiteout(&self, layer: &str, rel: &str) {
            let path = self.path(layer, rel);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            whiteout(&path).unwrap();
        }

        fn opaque(&self, layer: &str, rel: &str) {
            let path = self.path(layer, rel);
            fs::create_dir_all(&path).unwrap();
            set_opaque(&path);
        }

        fn diff(&self, paths: &[&str]) -> Diff {
            self.diff_over("lower", "lower", paths)
        }

        fn diff_over(&self, lower_a: &str, lower_b: &str, paths: &[&str]) -> Diff {
            let (a, b) = (self.path("a", ""), self.path("b", ""));
            let (la, lb) = (self.path(lower_a, ""), self.path(lower_b, ""));
            let paths: Vec<String> = paths.iter().map(|p| p.to_string()).collect();
            diff_layers(&a, &la, &b, &lb, &paths).unwrap()
        }

        /// podflare's answer, from the real thing: `find` and `sha256sum`
        /// chrooted into real overlay mounts of the layers.
        fn oracle_diff(&self, lower_a: &str, lower_b: &str, paths: &[&str]) -> Diff {
            let paths = if paths.is_empty() { &DEFAULT_PATHS[..] } else { paths };
            let a = self.oracle("a", lower_a, paths);
            let b = self.oracle("b", lower_b, paths);
            let mut diff = Diff::default();
            for (key, hash) in &a {
                match b.get(key) {
                    None => diff.removed.push(key.clone()),
                    Some(h) if h != hash => diff.modified.push(key.clone()),
                    Some(_) => {}
                }
            }
            diff.added = b.keys().filter(|k| !a.contains_key(*k)).cloned().collect();
            diff
        }

        fn oracle(&self, upper: &str, lower: &str, paths: &[&str]) -> BTreeMap<String, String> {
            static MOUNTS: AtomicUsize = AtomicUsize::new(0);
            let n = MOUNTS.fetch_add(1, Ordering::Relaxed);
            let (work, root) = (self.tmp.path().join(format!("work{n}")), self.tmp.path().join(format!("mnt{n}")));
            fs::create_dir(&work).unwrap();
            fs::create_dir(&root).unwrap();
            let script = r#"mount -t overlay overlay -o "lowerdir=$1,upperdir=$2,workdir=$3" "$4" || exit 97
                mount --bind /usr "$4/usr" || exit 98
                root=$4
                shift 4
                chroot "$root" /usr/bin/find "$@" -type f -exec /usr/bin/sha256sum {} + 2>/dev/null | sort
                exit 0"#;
            let mut last = String::new();
            for _ in 0..50 {
                let out = Command::new("unshare")
                    .args(["--mount", "--propagation", "private", "sh", "-c", script, "sh"])
                    .arg(self.path(lower, ""))
                    .arg(self.path(upper, ""))
                    .arg(&work)
                    .arg(&root)
                    .args(paths)
                    .stdin(Stdio::null())
                    .output()
                    .unwrap();
                if out.status.success() {
                    return parse_like_podflare(&out.stdout);
                }
                // A previous mount of these layers may linger a moment.
                last = String::from_utf8_lossy(&out.stderr).into_owned();
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            panic!("oracle: cannot mount the overlay: {last}");
        }

        /// Asserts `diff` gives `expected`, and so does the real thing.
        fn check(&self, paths: &[&str], expected: Diff) {
            assert_eq!(self.diff(paths), expected, "diff of {paths:?}");
            // The kernel's walk of a chain of exactly 40 links through a
            // fresh overlay mount has been seen to fail with ELOOP once in
            // a while under load: the reference gets a few tries, ours none.
            let mut oracle = self.oracle_diff("lower", "lower", paths);
            for _ in 0..3 {
                if oracle == expected {
                    break;
                }
                oracle = self.oracle_diff("lower", "lower", paths);
            }
            assert_eq!(oracle, expected, "find on real overlays, {paths:?}");
        }
    }

    /// podflare's parser over `find ... -exec sha256sum` output, after the
    /// server sent it as lines of lossy UTF-8 and the SDK joined them.
    fn parse_like_podflare(stdout: &[u8]) -> BTreeMap<String, String> {
        let lines: Vec<String> = stdout.split(|b| *b == b'\n').map(|l| String::from_utf8_lossy(l).into_owned()).collect();
        let text = lines.join("\n");
        let mut out = BTreeMap::new();
        for line in text.split(is_py_line_break) {
            let line = line.trim_matches(is_py_space);
            if let Some((hash, path)) = line.split_once(is_py_space) {
                out.insert(path.trim_start_matches(is_py_space).to_string(), hash.to_string());
            }
        }
        out
    }

    fn whiteout(path: &Path) -> nix::Result<()> {
        nix::sys::stat::mknod(path, nix::sys::stat::SFlag::S_IFCHR, Mode::empty(), 0)
    }

    fn set_opaque(path: &Path) {
        set_xattr(path, OPAQUE, b"y");
    }

    fn set_xattr(path: &Path, name: &CStr, value: &[u8]) {
        let p = CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: NUL-terminated strings, and a value of the length passed.
        let rc = unsafe { libc::lsetxattr(p.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
        // A privileged test that cannot run must fail, not skip.
        assert_eq!(rc, 0, "set {name:?} on {}: {}", path.display(), std::io::Error::last_os_error());
    }

    /// `diff` of uppers `a` over `la` and `b` over `lb`.
    fn diff_layers(a: &Path, la: &Path, b: &Path, lb: &Path, paths: &[String]) -> Result<Diff> {
        diff(&Layers { upper: a, lower: la }, &Layers { upper: b, lower: lb }, paths)
    }

    fn expect(added: &[&str], removed: &[&str], modified: &[&str]) -> Diff {
        let sorted = |keys: &[&str]| {
            let mut keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
            keys.sort();
            keys
        };
        Diff { added: sorted(added), removed: sorted(removed), modified: sorted(modified) }
    }

    fn take_trace() -> Vec<String> {
        TRACE.with(|t| std::mem::take(&mut *t.borrow_mut()))
    }

    #[test]
    fn added_removed_modified_and_unchanged() {
        let f = Fixture::new();
        f.put("lower", "root/kept", "same");
        f.put("lower", "root/edited", "old");
        f.put("lower", "root/gone", "x");
        f.put("lower", "tmp/t", "t");
        f.put("a", "root/edited", "new-a");
        f.put("b", "root/edited", "new-b");
        // Written in both, to the same bytes: unchanged.
        f.put("a", "root/both", "same bytes");
        f.put("b", "root/both", "same bytes");
        f.put("b", "root/new", "n");
        f.put("b", "tmp/t", "T");
        f.whiteout("b", "root/gone");
        f.put("a", "root/only-a", "a");
        f.check(&[], expect(&["/root/new"], &["/root/gone", "/root/only-a"], &["/root/edited", "/tmp/t"]));
    }

    #[test]
    fn whiteouts_delete_lower_files_and_dirs() {
        let f = Fixture::new();
        f.put("lower", "root/f", "f");
        f.put("lower", "root/d/g", "g");
        f.put("lower", "root/d/e/h", "h");
        f.whiteout("a", "root/f");
        f.whiteout("a", "root/d");
        f.check(&["/root"], expect(&["/root/d/e/h", "/root/d/g", "/root/f"], &[], &[]));
    }

    #[test]
    fn an_opaque_dir_hides_the_lower_one() {
        let f = Fixture::new();
        f.put("lower", "root/d/x", "x");
        f.put("lower", "root/d/y", "y");
        f.put("lower", "root/d/sub/z", "z");
        f.opaque("a", "root/d");
        f.put("a", "root/d/x", "x");
        f.check(&["/root"], expect(&["/root/d/sub/z", "/root/d/y"], &[], &[]));
        // Opaque on both sides: only what the uppers hold counts.
        f.opaque("b", "root/d");
        f.put("b", "root/d/x", "X");
        f.check(&["/root"], expect(&[], &[], &["/root/d/x"]));
    }

    #[test]
    fn a_file_over_a_dir_and_a_dir_over_a_file() {
        let f = Fixture::new();
        f.put("lower", "root/d/x", "x");
        f.put("lower", "root/e", "e");
        f.put("a", "root/d", "now a file");
        f.put("b", "root/e/z", "z");
        f.check(&["/root"], expect(&["/root/d/x", "/root/e/z"], &["/root/d", "/root/e"], &[]));
    }

    #[test]
    fn symlinks_are_never_followed_on_the_host_nor_counted() {
        let f = Fixture::new();
        let host = f.tmp.path().join("host-secrets");
        fs::create_dir(&host).unwrap();
        fs::write(host.join("secret"), "host").unwrap();
        f.put("lower", "root/f", "x");
        f.put("lower", "root/target", "t");
        f.link("a", "root/f", "/etc/shadow");
        f.link("a", "root/host", host.to_str().unwrap());
        f.link("a", "root/rel", "target");
        f.link("b", "root/rel", "f");
        let paths = ["/root", "/root/host/", "/root/host", "/root/host/secret", "/root/f", "/root/rel"];
        take_trace();
        f.check(&paths, expect(&["/root/f"], &[], &[]));
        assert!(take_trace().iter().all(|e| !e.starts_with("read")), "nothing needed reading");
    }

    #[test]
    fn symlinks_inside_starting_points_resolve_in_the_sandbox() {
        let f = Fixture::new();
        f.put("lower", "root/b", "1");
        f.put("lower", "root/sub/c", "1");
        f.link("lower", "lnk", "/root");
        f.link("lower", "rel", "root");
        f.link("lower", "up", "../../root");
        f.link("lower", "loop", "loop");
        f.put("b", "root/b", "2");
        f.put("b", "root/sub/c", "2");
        // One side points the link elsewhere.
        f.link("a", "moved", "/root");
        f.link("b", "moved", "/root/sub");
        // c0 -> c1 -> ... -> c40 -> /root: 41 links from c0 is one too many.
        for i in 0..40 {
            f.link("lower", &format!("c{i}"), &format!("c{}", i + 1));
        }
        f.link("lower", "c40", "/root");
        let paths = ["/lnk/b", "/rel/sub/c", "/up/b", "/lnk", "/lnk/", "/../../lnk/./b", "/loop/x", "/moved/", "/c0/b", "/c1/b"];
        f.check(&paths, expect(&["/moved/c"], &["/moved/b", "/moved/sub/c"], &["/lnk/b", "/rel/sub/c", "/up/b", "/lnk/sub/c", "/../../lnk/./b", "/c1/b"]));
    }

    #[test]
    fn starting_points_print_as_find_prints_them() {
        let f = Fixture::new();
        f.put("lower", "root/f", "1");
        f.put("lower", "root/sub/g", "1");
        f.put("b", "root/f", "2");
        f.put("b", "root/sub/g", "2");
        let paths = ["/root/f", "/root/f/", "/root/", "//root", "/root//", "/root/.", "/root", "/root", "/nope", "/root/sub/../f"];
        let modified = ["/root/f", "/root/sub/g", "//root/f", "//root/sub/g", "/root//f", "/root//sub/g", "/root/./f", "/root/./sub/g", "/root/sub/../f"];
        f.check(&paths, expect(&[], &[], &modified));
    }

    #[test]
    fn nested_starting_points_see_each_other() {
        let f = Fixture::new();
        f.put("lower", "root/sub/f", "1");
        f.put("lower", "other/f", "2");
        f.put("lower", "other/g", "2");
        // In a, /root/sub is a link: "/root" does not descend it, but
        // "/root/sub/" prints the files it leads to under the same names.
        f.link("a", "root/sub", "/other");
        for paths in [["/root", "/root/sub/"], ["/root/sub/", "/root"]] {
            f.check(&paths, expect(&[], &["/root/sub/g"], &["/root/sub/f"]));
        }
    }

    #[test]
    fn redirect_and_metacopy_layers_are_refused() {
        let f = Fixture::new();
        f.put("lower", "root/f", "1");
        f.put("a", "root/f", "2");
        f.put("b", "root/f", "3");
        set_xattr(&f.path("a", "root/f"), METACOPY, b"");
        let (a, b, lower) = (f.path("a", ""), f.path("b", ""), f.path("lower", ""));
        let run = || diff_layers(&a, &lower, &b, &lower, &["/root".into()]);
        assert!(matches!(run(), Err(Error::Unsupported(_))));
        fs::remove_file(f.path("a", "root/f")).unwrap();
        set_xattr(&f.path("b", "root"), REDIRECT, b"/elsewhere");
        assert!(matches!(run(), Err(Error::Unsupported(_))));
    }

    #[test]
    fn the_root_as_starting_point() {
        // Not against real mounts: the oracle's chroot needs the host's /usr.
        let f = Fixture::new();
        f.put("lower", "root/f", "1");
        f.put("b", "root/f", "2");
        f.put("b", "tmp/new", "n");
        assert_eq!(f.diff(&["/"]), expect(&["/tmp/new"], &[], &["/root/f"]));
        assert_eq!(f.diff(&["//", "/."]), expect(&["//tmp/new", "/./tmp/new"], &[], &["//root/f", "/./root/f"]));
    }

    #[test]
    fn different_templates_compare_everything() {
        let f = Fixture::new();
        fs::create_dir(f.path("lower2", "")).unwrap();
        f.template("lower2");
        f.put("lower", "root/f", "1");
        f.put("lower", "root/g", "1");
        f.put("lower", "root/h", "1");
        f.put("lower2", "root/f", "1");
        f.put("lower2", "root/g", "2");
        f.put("lower2", "root/i", "1");
        let expected = expect(&["/root/i"], &["/root/h"], &["/root/g"]);
        take_trace();
        assert_eq!(f.diff_over("lower", "lower2", &["/root"]), expected);
        assert!(take_trace().contains(&"compare root/f".to_string()), "equal files of different templates are read");
        assert_eq!(f.oracle_diff("lower", "lower2", &["/root"]), expected);
    }

    #[test]
    fn contents_count_not_times() {
        let f = Fixture::new();
        f.put("lower", "root/f", "abc");
        f.put("a", "root/f", "abc");
        let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        File::options().write(true).open(f.path("a", "root/f")).unwrap().set_modified(old).unwrap();
        f.put("a", "root/g", "xyz");
        f.put("b", "root/g", "xyz");
        f.put("a", "root/h", "111");
        f.put("b", "root/h", "112");
        f.check(&["/root"], expect(&[], &[], &["/root/h"]));
    }

    #[test]
    fn template_files_neither_sandbox_changed_are_never_read() {
        let f = Fixture::new();
        for i in 0..20 {
            for j in 0..50 {
                f.put("lower", format!("root/d{i}/f{j}"), "template");
            }
        }
        f.put("lower", "tmp/keep", "template");
        f.put("a", "root/d3/f3", "A");
        f.put("b", "root/d3/f3", "B");
        f.put("a", "root/new", "n");
        f.put("b", "tmp/x", "x");
        // Changed on one side only: that side's file against the template's.
        f.put("a", "root/d5/f5", "TEMPLATE");
        take_trace();
        let got = f.diff(&[]);
        assert_eq!(got, expect(&["/tmp/x"], &["/root/new"], &["/root/d3/f3", "/root/d5/f5"]));
        let trace = take_trace();
        let lower: Vec<&String> = trace.iter().filter(|e| e.contains("lower")).collect();
        assert_eq!(lower, ["read lower root/d5/f5"], "all of {trace:?}");
    }

    #[test]
    fn podflare_parser_quirks() {
        let f = Fixture::new();
        let names: [&[u8]; 7] = [b"back\\slash", b"new\nline", b"cr\rx", b"ws ", b"f\x0cg h", b"\xff", "é".as_bytes()];
        for name in names {
            let rel = [b"root/".as_slice(), name].concat();
            f.put("lower", OsStr::from_bytes(&rel), "1");
            f.put("b", OsStr::from_bytes(&rel), "2");
        }
        let modified = ["/root/back\\\\slash", "/root/new\\nline", "/root/cr\\rx", "/root/ws", "/root/f", "/root/\u{fffd}", "/root/é"];
        f.check(&["/root"], expect(&[], &[], &modified));
        // The pieces after the form feed make a key of their own.
        f.put("a", OsStr::from_bytes(b"root/k\x0cv w"), "1");
        f.check(&["/root"], expect(&[], &["/root/k", "w"], &modified));
    }

    #[test]
    fn bad_paths_are_refused() {
        let f = Fixture::new();
        let (a, b, lower) = (f.path("a", ""), f.path("b", ""), f.path("lower", ""));
        let run = |paths: Vec<String>| diff_layers(&a, &lower, &b, &lower, &paths);
        for bad in [vec!["root".to_string()], vec!["/a\0b".into()], vec![format!("/{}", "a".repeat(PATH_MAX))], vec!["/x".into(); 65]] {
            assert!(matches!(run(bad.clone()), Err(Error::Invalid(_))), "{bad:?}");
        }
        // The longest path taken is one the kernel refuses: nothing there.
        assert_eq!(run(vec![format!("/{}", "a".repeat(PATH_MAX - 1))]).unwrap(), Diff::default());
    }

    #[test]
    fn shared_extents_count_as_equal_without_reading() {
        // Sandbox uppers are btrfs subvolumes; a fork is a snapshot.
        let tmp = tempfile::Builder::new().prefix("forkbox-diff-btrfs-").tempdir_in("/var/tmp").unwrap();
        let image = tmp.path().join("volume.img");
        File::create(&image).unwrap().set_len(256 << 20).unwrap();
        run(Command::new("mkfs.btrfs").arg("-q").arg(&image));
        let mnt = tmp.path().join("mnt");
        fs::create_dir(&mnt).unwrap();
        run(Command::new("mount").args(["-o", "loop"]).arg(&image).arg(&mnt));
        let _unmount = Unmount(mnt.clone());
        let (a, b, lower) = (mnt.join("a"), mnt.join("b"), tmp.path().join("lower"));
        fs::create_dir_all(lower.join("root")).unwrap();
        run(Command::new("btrfs").args(["-q", "subvolume", "create"]).arg(&a));
        fs::create_dir(a.join("root")).unwrap();
        let mut rng = StdRng::seed_from_u64(7);
        let data: Vec<u8> = (0..1 << 20).map(|_| rng.random()).collect();
        for name in ["big", "edited", "rewritten"] {
            fs::write(a.join("root").join(name), &data).unwrap();
        }
        run(Command::new("btrfs").args(["-q", "subvolume", "snapshot"]).arg(&a).arg(&b));
        let mut edited = File::options().write(true).open(b.join("root/edited")).unwrap();
        edited.seek(SeekFrom::Start(500_000)).unwrap();
        edited.write_all(&[!data[500_000]]).unwrap();
        fs::remove_file(b.join("root/rewritten")).unwrap();
        fs::write(b.join("root/rewritten"), &data).unwrap();
        take_trace();
        let got = diff_layers(&a, &lower, &b, &lower, &["/root".into()]).unwrap();
        assert_eq!(got, expect(&[], &[], &["/root/edited"]));
        let compared: Vec<String> = take_trace().into_iter().filter(|e| e.starts_with("compare")).collect();
        assert_eq!(compared.len(), 2, "{compared:?}");
        assert!(compared.iter().all(|e| e != "compare root/big"), "{compared:?}");
    }

    struct Unmount(PathBuf);

    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }

    fn run(cmd: &mut Command) {
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    const DIR_NAMES: [&str; 5] = ["a", "b", "c", "sp ace", "back\\slash"];
    const FILE_NAMES: [&[u8]; 10] = [b"a", b"b", b"c", b"sp ace", b"back\\slash", b"new\nline", b"ws ", b"\xff", "é".as_bytes(), b"f\x0cg h"];
    /// Template names leave out the last: a name with a line break that
    /// podflare's parser splits gives a key of its own ("h"), which one in
    /// unchanged template data would share unseen.
    const TEMPLATE_NAMES: &[&[u8]] = FILE_NAMES.split_at(9).0;
    const CONTENTS: [&str; 5] = ["", "1", "2", "22", "xyz"];
    /// Targets that never lead to the sandbox's root (the oracle would walk
    /// the host's /usr there).
    const TARGETS: [&str; 9] = ["a", "../y", "/x", "/y/a", "/nope", ".", "/x/../y", "/etc/passwd", "b/c"];
    const TOP_TARGETS: [&str; 5] = ["/x", "y", "/y/a", "/nope", "l"];
    const STARTS: [&str; 17] =
        ["/x", "/y", "/x/", "/y//", "//x", "/x/.", "/x/../y", "/l", "/l/", "/l/a", "/x/a", "/x/a/", "/nope", "/x/a/b", "/z", "/x/sp ace", "/y/b/"];

    fn pick<T: Copy>(rng: &mut StdRng, items: &[T]) -> T {
        items[rng.random_range(0..items.len())]
    }

    /// A random tree below `dir` (which exists).
    fn grow(rng: &mut StdRng, dir: &Path, names: &[&[u8]], depth: usize) {
        for _ in 0..rng.random_range(0..5) {
            let kind = rng.random_range(0..10);
            if kind < 3 && depth < 3 {
                let sub = dir.join(pick(rng, &DIR_NAMES));
                if fs::create_dir(&sub).is_ok() {
                    grow(rng, &sub, names, depth + 1);
                }
                continue;
            }
            let path = dir.join(OsStr::from_bytes(pick(rng, names)));
            if path.symlink_metadata().is_ok() {
                continue;
            }
            match kind < 8 {
                true => fs::write(&path, pick(rng, &CONTENTS)).unwrap(),
                false => std::os::unix::fs::symlink(pick(rng, &TARGETS), &path).unwrap(),
            }
        }
    }

    /// Every path in a layer, relative to it.
    fn paths_in(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = fs::read_dir(root.join(rel)) else {
            return;
        };
        for entry in entries.flatten() {
            let rel = rel.join(entry.file_name());
            out.push(rel.clone());
            if entry.file_type().unwrap().is_dir() {
                paths_in(root, &rel, out);
            }
        }
    }

    /// Makes `rel`'s parents directories in `root` without following any
    /// symlink, and clears `rel`; false where a parent is something else.
    fn clear(root: &Path, rel: &Path) -> bool {
        let mut path = root.to_path_buf();
        let names: Vec<_> = rel.iter().collect();
        for name in &names[..names.len() - 1] {
            path.push(name);
            match path.symlink_metadata() {
                Ok(m) if m.is_dir() => {}
                Ok(_) => return false,
                Err(_) => fs::create_dir(&path).unwrap(),
            }
        }
        let path = root.join(rel);
        match path.symlink_metadata() {
            Ok(m) if m.is_dir() => fs::remove_dir_all(&path).unwrap(),
            Ok(_) => fs::remove_file(&path).unwrap(),
            Err(_) => {}
        }
        true
    }

    /// What a sandbox might do to its upper layer over `lower`.
    fn mutate(rng: &mut StdRng, lower: &Path, upper: &Path) {
        let mut known = Vec::new();
        paths_in(lower, Path::new(""), &mut known);
        known.retain(|p| p.starts_with("x") || p.starts_with("y") || p.starts_with("z") || p.starts_with("l"));
        for _ in 0..rng.random_range(0..10) {
            let rel = match rng.random_bool(0.7) && !known.is_empty() {
                true => pick(rng, &known.iter().collect::<Vec<_>>()).clone(),
                false => Path::new(pick(rng, &["x", "y", "x/a", "y/b", "x/c"])).join(OsStr::from_bytes(pick(rng, &FILE_NAMES))),
            };
            if !clear(upper, &rel) {
                continue;
            }
            let path = upper.join(&rel);
            // A directory named with a line break makes podflare's parser
            // give one key to several files, and then its answer hangs on
            // the order of their hashes.
            let mut op = rng.random_range(0..7);
            if (op == 4 || op == 5) && rel.as_os_str().as_bytes().contains(&b'\x0c') {
                op = 0;
            }
            match op {
                0 | 1 => fs::write(&path, pick(rng, &CONTENTS)).unwrap(),
                // Copied up unchanged (say, by a chmod).
                2 => match fs::read(lower.join(&rel)) {
                    Ok(data) => fs::write(&path, data).unwrap(),
                    Err(_) => fs::write(&path, "").unwrap(),
                },
                3 => whiteout(&path).unwrap(),
                4 => {
                    fs::create_dir(&path).unwrap();
                    set_opaque(&path);
                    grow(rng, &path, &FILE_NAMES, 2);
                }
                5 => {
                    fs::create_dir(&path).unwrap();
                    grow(rng, &path, &FILE_NAMES, 2);
                }
                _ => {
                    let top = rel.components().count() == 1;
                    let target = if top { pick(rng, &TOP_TARGETS) } else { pick(rng, &TARGETS) };
                    std::os::unix::fs::symlink(target, &path).unwrap();
                }
            }
        }
    }

    fn random_case(seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let f = Fixture::new();
        let lower = f.path("lower", "");
        for top in ["x", "y"] {
            fs::create_dir(lower.join(top)).unwrap();
            grow(&mut rng, &lower.join(top), TEMPLATE_NAMES, 1);
        }
        if rng.random_bool(0.5) {
            std::os::unix::fs::symlink(pick(&mut rng, &TOP_TARGETS), lower.join("l")).unwrap();
        }
        if rng.random_bool(0.3) {
            fs::write(lower.join("z"), "z").unwrap();
        }
        let lower_b = match rng.random_bool(0.2) {
            true => {
                run(Command::new("cp").arg("-a").arg(&lower).arg(f.path("lower2", "")));
                mutate(&mut rng, &lower, &f.path("lower2", ""));
                "lower2"
            }
            false => "lower",
        };
        let (a, b) = (f.path("a", ""), f.path("b", ""));
        mutate(&mut rng, &lower, &a);
        if rng.random_bool(0.5) {
            // b forked from a.
            fs::remove_dir(&b).unwrap();
            run(Command::new("cp").arg("-a").arg(&a).arg(&b));
        }
        mutate(&mut rng, &lower, &b);
        let mut paths = vec![pick(&mut rng, &["/x", "/y", "/x/", "//y"])];
        paths.extend((0..rng.random_range(0..4)).map(|_| pick(&mut rng, &STARTS)));
        let got = f.diff_over("lower", lower_b, &paths);
        let want = f.oracle_diff("lower", lower_b, &paths);
        if got != want {
            panic!("seed {seed}, paths {paths:?}, layers in {}:\n{got:?}\n{want:?}", f.tmp.keep().display());
        }
    }

    #[test]
    fn agrees_with_find_on_real_overlays_of_random_layers() {
        for seed in 0..120 {
            random_case(seed);
        }
    }
}
