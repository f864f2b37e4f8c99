//! The criu forkbox finds, run pivoted into its tools root, against a real
//! container-shaped tree (its own pid, mount, net, uts and ipc namespaces,
//! pivoted into a read-only root): `criu check` passes, and a Python process
//! with a counting thread and an open file is dumped and restored running,
//! its count and file offset going on from where they stood.
//!
//! Needs root, the tools root (`forkbox tools build criu`, which `./dev
//! test` runs first) and the `default` template (for python3).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use forkbox_criu::{Criu, Readiness, Source};

/// The newest built root of `name` in the store `$<env>` (else
/// `/var/lib/forkbox/<store>`) that holds `needs`.
fn built_root(store: &str, name: &str, needs: &str) -> PathBuf {
    let env = if store == "tools" { "FORKBOX_TOOLS_DIR" } else { "FORKBOX_TEMPLATES_DIR" };
    let dir = std::env::var_os(env).map_or_else(|| Path::new("/var/lib/forkbox").join(store), PathBuf::from).join(name);
    let mut roots: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| {
            panic!("nothing built under {} ({e}): run `forkbox {} build {name}`", dir.display(), if store == "tools" { "tools" } else { "template" })
        })
        .flatten()
        .map(|e| e.path().join("rootfs"))
        .filter(|p| p.join(needs).exists())
        .collect();
    roots.sort_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
    roots.pop().unwrap_or_else(|| panic!("no built {name} under {} holds {needs}", dir.display()))
}

fn criu() -> Criu {
    let root = built_root("tools", "criu", "usr/sbin/criu");
    Criu::find(Some(&root), &root).expect("criu in the tools root")
}

/// Counts in a thread; the main loop appends "<pid> <count>" to /tmp/log.
const COUNTER: &str = "import os, threading, time
n = [0]
def tick():
    while True:
        n[0] += 1
        time.sleep(0.005)
threading.Thread(target=tick, daemon=True).start()
log = open('/tmp/log', 'w')
while True:
    log.write(f'{os.getpid()} {n[0]}\\n'); log.flush()
    time.sleep(0.02)
";

/// A Python counter as pid 1 of fresh namespaces, pivoted into `rootfs`
/// (bound read-only at `mountpoint`) with a tmpfs /tmp. Returns `unshare`
/// (which ends with the tree) and the tree's host pid.
fn start_tree(rootfs: &Path, mountpoint: &Path) -> (std::process::Child, i32) {
    let script = format!(
        "set -e; m={m}; mount --bind {r} $m; mount -o remount,bind,ro $m; mount -t tmpfs -o size=16m tmpfs $m/tmp; \
         mount -t proc proc $m/proc; cd $m; pivot_root . .; umount -l .; cd /; \
         exec setsid python3 -c \"$COUNTER\" </dev/null >/dev/null 2>&1",
        m = mountpoint.display(),
        r = rootfs.display()
    );
    let mut unshare = Command::new("unshare");
    // SAFETY: close_range between fork and exec allocates nothing. A
    // descriptor inherited from whoever ran the tests would be a host file
    // the tree holds, which criu rightly refuses to dump.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut unshare, || {
            libc::close_range(3, u32::MAX, 0);
            Ok(())
        });
    }
    let unshare = unshare
        .args(["--pid", "--mount", "--net", "--uts", "--ipc", "--fork", "--propagation", "private", "sh", "-c", &script])
        .env("COUNTER", COUNTER)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("unshare");
    let outer = unshare.id();
    let pid = wait_for("the tree's pid 1 to log", || {
        let children = std::fs::read_to_string(format!("/proc/{outer}/task/{outer}/children")).ok()?;
        let pid: i32 = children.split_whitespace().next()?.parse().ok()?;
        last_line(pid).map(|_| pid)
    });
    (unshare, pid)
}

/// The last "<pid> <count>" line the counter of host pid `pid` wrote.
fn last_line(pid: i32) -> Option<(u32, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/root/tmp/log")).ok()?;
    let mut fields = text.lines().last()?.split_whitespace();
    Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
}

/// Kills a tree's init (and so its whole pid namespace) when dropped, so a
/// failing test leaves no tree behind; forgotten once the tree is gone, so
/// a reused pid is never hit.
struct Ends(i32);

impl Drop for Ends {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.0), nix::sys::signal::Signal::SIGKILL);
    }
}

fn wait_for<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn run(command: Command, images: &Path, log: &str) {
    if let Err(e) = forkbox_criu::run_logged(command, log, &images.join(log)) {
        panic!("{e}");
    }
}

#[test]
fn the_tools_roots_criu_passes_its_check_on_this_kernel() {
    let criu = criu();
    assert!(matches!(criu.source, Source::ToolsRoot(_)) || matches!(criu.source, Source::Host(_)));
    assert!(criu.version >= forkbox_criu::MINIMUM, "{}", criu.describe());
    // The tools root's criu is built with forkbox's restorer patch (tools/criu.toml).
    if matches!(criu.source, Source::ToolsRoot(_)) {
        assert!(criu.restores_other_users && criu.describe().contains("restores other users"), "{}", criu.describe());
        assert!(criu.lazy_pages && criu.describe().contains("lazy pages"), "{}", criu.describe());
    }
    let root = built_root("tools", "criu", "usr/sbin/criu");
    match Readiness::probe(Some(&root), &root) {
        Readiness::Ready(found) => assert_eq!(found.version, criu.version),
        Readiness::Unavailable(why) => panic!("criu is not ready: {why}"),
    }
    // Without a root and without a host criu, it says how to get one.
    if !Path::new("/usr/sbin/criu").exists() && !Path::new("/usr/local/sbin/criu").exists() {
        let why = Criu::find(None, Path::new("/nowhere")).unwrap_err().to_string();
        assert!(why.contains("forkbox tools build criu") && why.contains("/nowhere"), "{why}");
    }
}

#[test]
fn a_container_shaped_tree_is_dumped_and_restored_running() {
    let criu = criu();
    let rootfs = built_root("templates", "default", "usr/bin/python3");
    let work = tempfile::tempdir().expect("tempdir");
    let (mountpoint, images) = (work.path().join("tree"), work.path().join("images"));
    std::fs::create_dir_all(&mountpoint).unwrap();
    std::fs::create_dir_all(&images).unwrap();

    let (mut unshare, pid) = start_tree(&rootfs, &mountpoint);
    let dumped = Ends(pid);
    let (inner_pid, before) = wait_for("a count above 20", || last_line(pid).filter(|(_, n)| *n > 20));
    assert_eq!(inner_pid, 1, "the counter is its pid namespace's init");

    let seen_images = criu.seen(&images, Path::new("/forkbox/images"));
    let mut dump = criu.command("dump", &[(&images, Path::new("/forkbox/images"))]);
    dump.arg("-t").arg(pid.to_string()).arg("-D").arg(seen_images).args(["-o", "dump.log", "--network-lock", "nftables"]);
    run(dump, &images, "dump.log");
    // A dump ends the tree, and with it `unshare`.
    unshare.wait().expect("unshare ends with its tree");
    std::mem::forget(dumped);
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "the dumped tree still runs");

    let seen_root = criu.seen(&rootfs, Path::new("/forkbox/root"));
    let binds = [(images.as_path(), Path::new("/forkbox/images")), (rootfs.as_path(), Path::new("/forkbox/root"))];
    let mut restore = criu.command("restore", &binds);
    restore.arg("-D").arg(seen_images).args(["-o", "restore.log", "-d", "--root"]).arg(seen_root);
    restore.arg("--pidfile").arg(seen_images.join("pid"));
    run(restore, &images, "restore.log");
    let restored: i32 = std::fs::read_to_string(images.join("pid")).unwrap().trim().parse().unwrap();
    let restored_tree = Ends(restored);

    // The same process: pid 1 inside, its thread still counting from where
    // it stood, its log appended at the offset it had.
    let (inner_after, after) = wait_for("the restored counter to go on", || last_line(restored).filter(|(_, n)| *n > before + 20));
    assert_eq!(inner_after, 1);
    let log = std::fs::read_to_string(format!("/proc/{restored}/root/tmp/log")).unwrap();
    let counts: Vec<u64> = log.lines().filter_map(|l| l.split_whitespace().nth(1)?.parse().ok()).collect();
    assert!(counts.windows(2).all(|w| w[0] <= w[1]), "the log was rewritten from its start, not appended: {counts:?}");
    assert!(after > before);
    // Killing the tree's init ends its pid namespace.
    drop(restored_tree);
    wait_for("the restored tree to end", || (!Path::new(&format!("/proc/{restored}")).exists()).then_some(()));
}
