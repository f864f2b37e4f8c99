//! What a forked REPL must redo so that it shares nothing with its parent.
//!
//! `fork(2)` copies memory copy-on-write but shares everything behind a
//! descriptor (the open file description: offset, the parent's file, a
//! pipe, a socket) and every `MAP_SHARED` mapping. A child that kept those
//! could write into its parent's files or memory. The REPL cannot list its
//! own descriptors (its /proc is its sandbox's leaf pid namespace, where it
//! does not appear), so the server reads them from the host's /proc before
//! the fork and sends this plan with the fork frame (docs/repl-protocol.md).

use std::fs;

use serde::Serialize;

/// The REPL's own descriptors (docs/repl-protocol.md); 4, its source, is
/// closed once read, so user files may take it. A forked REPL replaces 7,
/// its output timer, and 8, its output journal, itself.
const REPL_FDS: [i32; 8] = [0, 1, 2, 3, 5, 6, 7, 8];
/// More than this many descriptors or mappings are not worth planning for
/// (the plan travels in one frame); the rest are left as they are.
const MAX_ENTRIES: usize = 4096;

#[derive(Debug, Default, Serialize)]
pub struct ForkPlan {
    pub fds: Vec<FdEntry>,
    pub maps: Vec<MapEntry>,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct FdEntry {
    pub fd: i32,
    /// file, dir, deleted, memfd, socket, epoll, eventfd, other.
    pub kind: &'static str,
    /// The path inside the sandbox (for file, dir, deleted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub pos: u64,
    pub flags: i32,
    pub cloexec: bool,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct MapEntry {
    pub start: u64,
    pub end: u64,
    pub perms: String,
    pub offset: u64,
    /// file (map the child's own copy) or anon (copy the bytes).
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// Read the plan for the process `pid` (a host pid).
pub fn plan_for(pid: i32) -> ForkPlan {
    ForkPlan { fds: fd_entries(pid), maps: map_entries(pid) }
}

fn fd_entries(pid: i32) -> Vec<FdEntry> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else { return Vec::new() };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Some(fd) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        if REPL_FDS.contains(&fd) || out.len() >= MAX_ENTRIES {
            continue;
        }
        let Ok(target) = fs::read_link(entry.path()) else { continue };
        let info = fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).unwrap_or_default();
        let field = |key: &str| info.lines().find_map(|l| l.strip_prefix(key)).map(|v| v.trim().to_string());
        let pos = field("pos:").and_then(|v| v.parse().ok()).unwrap_or(0);
        let flags = field("flags:").and_then(|v| i32::from_str_radix(&v, 8).ok()).unwrap_or(0);
        let is_dir = fs::metadata(entry.path()).map(|m| m.is_dir()).unwrap_or(false);
        let (kind, path, name) = classify(&target.to_string_lossy(), is_dir);
        out.push(FdEntry { fd, kind, path, name, pos, flags, cloexec: flags & libc::O_CLOEXEC != 0 });
    }
    out.sort_by_key(|e| e.fd);
    out
}

/// What a descriptor's /proc link says it is.
fn classify(target: &str, is_dir: bool) -> (&'static str, Option<String>, Option<String>) {
    if let Some(name) = target.strip_prefix("/memfd:") {
        let name = name.trim_end_matches(" (deleted)").to_string();
        return ("memfd", None, Some(name));
    }
    if target.starts_with('/') {
        if let Some(path) = target.strip_suffix(" (deleted)") {
            return ("deleted", Some(path.to_string()), None);
        }
        return (if is_dir { "dir" } else { "file" }, Some(target.to_string()), None);
    }
    let kind = if target.starts_with("socket:") {
        "socket"
    } else if target == "anon_inode:[eventpoll]" {
        "epoll"
    } else if target == "anon_inode:[eventfd]" {
        "eventfd"
    } else {
        // Pipes, timerfd, signalfd, inotify, pidfd, ...: the child gets
        // /dev/null in their place (what they connected to is the parent's).
        "other"
    };
    (kind, None, None)
}

fn map_entries(pid: i32) -> Vec<MapEntry> {
    let text = fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    text.lines().filter_map(parse_map_line).take(MAX_ENTRIES).collect()
}

/// One line of /proc/<pid>/maps, if it is a shared mapping.
fn parse_map_line(line: &str) -> Option<MapEntry> {
    let mut parts = line.splitn(6, ' ');
    let range = parts.next()?;
    let perms = parts.next()?;
    let offset = u64::from_str_radix(parts.next()?, 16).ok()?;
    let _dev = parts.next()?;
    let _inode = parts.next()?;
    let path = parts.next().map(str::trim).unwrap_or("");
    if !perms.ends_with('s') {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    let (start, end) = (u64::from_str_radix(start, 16).ok()?, u64::from_str_radix(end, 16).ok()?);
    let file = path.starts_with('/') && !path.ends_with(" (deleted)") && !path.starts_with("/memfd:") && !path.starts_with("/SYSV");
    Some(MapEntry { start, end, perms: perms.to_string(), offset, kind: if file { "file" } else { "anon" }, path: file.then(|| path.to_string()) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_descriptor_links() {
        assert_eq!(classify("/root/a.txt", false).0, "file");
        assert_eq!(classify("/root", true).0, "dir");
        assert_eq!(classify("/tmp/x (deleted)", false), ("deleted", Some("/tmp/x".into()), None));
        assert_eq!(classify("/memfd:buf (deleted)", false), ("memfd", None, Some("buf".into())));
        assert_eq!(classify("socket:[1234]", false).0, "socket");
        assert_eq!(classify("pipe:[99]", false).0, "other");
        assert_eq!(classify("anon_inode:[eventpoll]", false).0, "epoll");
        assert_eq!(classify("anon_inode:[eventfd]", false).0, "eventfd");
    }

    #[test]
    fn keeps_only_shared_mappings() {
        assert!(parse_map_line("7f00-7f10 rw-p 00000000 00:00 0 ").is_none());
        let anon = parse_map_line("7f0000000000-7f0000001000 rw-s 00000000 00:01 1234    /dev/zero (deleted)").unwrap();
        assert_eq!((anon.kind, anon.start, anon.end), ("anon", 0x7f00_0000_0000, 0x7f00_0000_1000));
        let file = parse_map_line("1000-3000 r--s 00002000 00:2a 77    /root/data.bin").unwrap();
        assert_eq!((file.kind, file.path.as_deref(), file.offset), ("file", Some("/root/data.bin"), 0x2000));
        assert_eq!(parse_map_line("1000-2000 rw-s 00000000 00:01 5    /SYSV00000000 (deleted)").unwrap().kind, "anon");
    }

    #[test]
    fn plans_this_process() {
        // A real process: our own descriptors and mappings parse.
        let path = format!("/tmp/forkplan-test-{}", std::process::id());
        let file = fs::File::create(&path).unwrap();
        // Above the REPL's reserved descriptors, as user files are.
        // SAFETY: duplicating a descriptor we own.
        let high = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&file), libc::F_DUPFD_CLOEXEC, 100) };
        assert!(high >= 100);
        let plan = plan_for(std::process::id() as i32);
        let entry = plan.fds.iter().find(|e| e.fd == high).expect("our descriptor is planned");
        assert_eq!((entry.kind, entry.path.as_deref(), entry.cloexec), ("file", Some(path.as_str()), true));
        // SAFETY: closing the duplicate we made.
        unsafe { libc::close(high) };
        let _ = fs::remove_file(&path);
    }
}
