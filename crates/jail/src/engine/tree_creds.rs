//! What criu must not be trusted to get right by itself: the credentials of
//! a dumped tree's tasks (docs/state.md, "a restored sandbox gets no more
//! than it had").
//!
//! criu 4.2.1 restores a task of a nested user namespace into the tree's
//! own one, with the full capability sets it held in the nested one: that
//! is CAP_SYS_ADMIN and the rest over the sandbox. A task caught between
//! credentials (a thread flipping its effective uid) may come back with a
//! full bounding and inheritable set. And criu as released, run as the
//! family's host root rather than host root, cannot restore a task of
//! another user than the sandbox's root (the tools root's patched criu
//! can: `criu::Criu::restores_other_users`). So a dump refuses a tree with
//! any of these it cannot bring back (the freeze then keeps the globals
//! instead), and a restore refuses a tree in which a task of the sandbox's
//! user namespace holds a capability a command is not given.

use std::path::Path;

use super::*;

/// Every live task (`/proc/<pid>/task/<tid>`) of the tree under host pid
/// `init`, init's own included. Zombies are left out: they run nothing,
/// and criu brings them back as zombies.
fn tree_tasks(init: i32) -> Vec<std::path::PathBuf> {
    let (mut tasks, mut todo) = (Vec::new(), vec![init]);
    while let Some(pid) = todo.pop() {
        if let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            tasks.extend(dir.flatten().map(|t| t.path()).filter(|t| !status_fields(t, "State:").first().is_some_and(|s| s == "Z" || s == "X")));
        }
        todo.extend(crate::shim::children_of(pid));
    }
    tasks
}

/// The fields of a task's `status` line `key` (`Uid:` → four uids).
fn status_fields(task: &Path, key: &str) -> Vec<String> {
    let status = std::fs::read_to_string(task.join("status")).unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix(key)).map(|v| v.split_whitespace().map(str::to_string).collect()).unwrap_or_default()
}

/// The user namespace of a task (`/proc/<pid>/task/<tid>` or `/proc/<pid>`).
fn user_namespace(task: &Path) -> Option<std::path::PathBuf> {
    std::fs::read_link(task.join("ns/user")).ok()
}

/// Refuse to dump a tree in which a task is in a user namespace of its
/// own, its real, effective, saved and filesystem ids differ, or, unless
/// `other_users_restorable`, it runs as another user than the sandbox's
/// root. Says whether a task of another user is there.
pub(super) fn check_settled(init: i32, other_users_restorable: bool) -> Result<bool> {
    let init_dir = std::path::PathBuf::from(format!("/proc/{init}"));
    let own = user_namespace(&init_dir);
    let root = [status_fields(&init_dir, "Uid:").first().cloned(), status_fields(&init_dir, "Gid:").first().cloned()];
    let mut other_users = false;
    for task in tree_tasks(init) {
        let (userns, uids, gids) = (user_namespace(&task), status_fields(&task, "Uid:"), status_fields(&task, "Gid:"));
        // A task that ended after it was listed (a thread of a server
        // that answered a request) left nothing to read, and nothing to
        // dump: what was read of a task still there afterwards is its own.
        if !task.join("status").exists() {
            continue;
        }
        if userns != own {
            return Err(Error::NotDumpable(format!(
                "task {} is in a user namespace of its own, which criu would restore into the sandbox's with the capabilities it holds there",
                task.display()
            )));
        }
        for (key, ids) in [("Uid:", &uids), ("Gid:", &gids)] {
            if ids.windows(2).any(|w| w[0] != w[1]) {
                return Err(Error::NotDumpable(format!(
                    "task {} is between credentials ({key} {}): criu would not restore it as it is",
                    task.display(),
                    ids.join(" ")
                )));
            }
        }
        // criu runs as the family's host root, not as host root, so an
        // unpatched restorer sets a task's uids without keeping the
        // capabilities it needs to set the gids after: it cannot restore
        // a task of another user (it fails, and 4.2.1 can then hang).
        let ids = [uids.first().cloned(), gids.first().cloned()];
        other_users |= ids != root;
        if ids != root && !other_users_restorable {
            return Err(Error::NotDumpable(format!(
                "task {} runs as another user than the sandbox's root (uid {}), which this criu cannot restore (it lacks forkbox's patch: build the tools root with `forkbox tools build criu`)",
                task.display(),
                ids[0]
                    .as_deref()
                    .and_then(|u| u.parse::<u64>().ok())
                    .zip(root[0].as_deref().and_then(|r| r.parse::<u64>().ok()))
                    .map(|(u, r)| u.saturating_sub(r))
                    .unwrap_or(0)
            )));
        }
    }
    Ok(other_users)
}

/// Refuse a restored tree in which a task of the sandbox's user namespace,
/// but init, holds a capability (bounding, inheritable, permitted or
/// ambient) outside `allowed`, the capabilities of a command.
pub(super) fn check_no_more_capabilities(init: i32, allowed: &[caps::Capability]) -> Result<()> {
    let mask = allowed.iter().fold(0u64, |m, c| m | c.bitmask());
    let own = user_namespace(Path::new(&format!("/proc/{init}")));
    for task in tree_tasks(init) {
        let pid = task.parent().and_then(Path::parent).and_then(|p| p.file_name()).and_then(|n| n.to_str()).and_then(|n| n.parse::<i32>().ok());
        // Init is renewed (its own exec) and holds what setting up needs;
        // a nested user namespace's capabilities are its own.
        if pid == Some(init) || user_namespace(&task) != own {
            continue;
        }
        for key in ["CapBnd:", "CapInh:", "CapPrm:", "CapAmb:"] {
            let held = status_fields(&task, key).first().and_then(|h| u64::from_str_radix(h, 16).ok()).unwrap_or(u64::MAX);
            if held & !mask != 0 {
                return Err(Error::Setup(format!(
                    "restored task {} ({}) holds capabilities it was not given ({key} {held:016x}, a command's are {mask:016x})",
                    task.display(),
                    status_fields(&task, "Name:").join(" ")
                )));
            }
        }
    }
    Ok(())
}
