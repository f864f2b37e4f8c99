//! The descriptors a fork child receives, in the order it receives them:
//! defined here once. The shim sends them in this order
//! (`shim/handover.rs`), the server counts them for the REPL's `F` frame,
//! and the REPL reads them by position (`repl/repl.py`, `_FORK_FDS`); a
//! test below checks the REPL's table against this one.
//!
//! ```text
//! 0..5   the child member's namespaces: mnt, net, uts, ipc, then its leaf pid ns
//! 5      the child's control socket
//! 6      its stdout pipe (write end)
//! 7      its stderr pipe (write end)
//! 8..    the cgroup files it writes "0" to, to join its cgroups (v1 only; may be none)
//! ```

/// The namespaces, as the shim sends them.
pub const NAMESPACES: [&str; 5] = ["mnt", "net", "uts", "ipc", "leaf"];
/// The channels the server makes for each child, as it passes them on.
pub const CHANNELS: [&str; 3] = ["control", "stdout", "stderr"];
/// Where the cgroup files start (after the namespaces and channels).
pub const FIRST_CGROUP_FILE: usize = NAMESPACES.len() + CHANNELS.len();

/// How many descriptors a child gets that must join `cgroup_files` files.
pub fn count(cgroup_files: usize) -> usize {
    FIRST_CGROUP_FILE + cgroup_files
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPL: &str = include_str!("../../../repl/repl.py");

    /// Position of each named descriptor (`cgroup` for the first cgroup file).
    fn positions() -> Vec<(&'static str, usize)> {
        NAMESPACES.iter().chain(CHANNELS.iter()).copied().enumerate().map(|(i, name)| (name, i)).chain(std::iter::once(("cgroup", FIRST_CGROUP_FILE))).collect()
    }

    /// What lies between `open` and `close` on repl.py's line that starts
    /// with `name`.
    fn repl_literal(name: &str, open: char, close: char) -> &'static str {
        let line = REPL.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("repl.py defines {name} on one line"));
        line.split_once(open).unwrap().1.split_once(close).unwrap().0
    }

    /// The REPL's table, `_FORK_FDS = {'mnt': 0, ...}`, as (name, position).
    fn repl_table() -> Vec<(String, usize)> {
        repl_literal("_FORK_FDS = ", '{', '}')
            .split(',')
            .map(|pair| {
                let (k, v) = pair.split_once(':').unwrap();
                (k.trim().trim_matches('\'').to_string(), v.trim().parse().unwrap())
            })
            .collect()
    }

    #[test]
    fn the_repl_reads_each_descriptor_where_the_shim_puts_it() {
        let ours: Vec<(String, usize)> = positions().into_iter().map(|(n, i)| (n.to_string(), i)).collect();
        assert_eq!(repl_table(), ours);
    }

    #[test]
    fn the_repl_enters_the_namespaces_in_the_order_they_come() {
        // _NS_TYPES pairs with the first four descriptors: mnt, net, uts, ipc.
        let flags: Vec<i64> =
            repl_literal("_NS_TYPES = ", '(', ')').split(',').map(|v| i64::from_str_radix(v.trim().trim_start_matches("0x"), 16).unwrap()).collect();
        let expected = [libc::CLONE_NEWNS, libc::CLONE_NEWNET, libc::CLONE_NEWUTS, libc::CLONE_NEWIPC].map(i64::from);
        assert_eq!(flags, expected);
        assert_eq!(&NAMESPACES[..4], ["mnt", "net", "uts", "ipc"]);
    }

    #[test]
    fn a_child_gets_the_fixed_eight_and_its_cgroup_files() {
        assert_eq!(count(0), 8);
        assert_eq!(count(4), 12);
    }
}
