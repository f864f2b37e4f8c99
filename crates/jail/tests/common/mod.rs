//! Shared set-up for the engine's integration tests: a real engine on a
//! state directory of its own, and a real template root filesystem.

#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use forkbox_jail::{CommandProcess, ExitStatus, Jail, JailConfig, Limits, Sandbox, SandboxSpec};
use tokio::io::AsyncReadExt;

/// The template used by tests: `$FORKBOX_TEST_ROOTFS`, else the `default`
/// template the server builds under `/var/lib/forkbox`.
pub fn template_rootfs() -> PathBuf {
    if let Some(p) = std::env::var_os("FORKBOX_TEST_ROOTFS") {
        return PathBuf::from(p);
    }
    let root = PathBuf::from("/var/lib/forkbox/templates/default");
    let mut built: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| {
            panic!("no default template under {} ({e}); build it with `forkbox template build default` or set FORKBOX_TEST_ROOTFS", root.display())
        })
        .flatten()
        .map(|e| e.path().join("rootfs"))
        .filter(|p| p.join("usr/bin/python3").exists())
        .collect();
    built.sort();
    built.pop().expect("a built default template")
}

static JAIL: std::sync::OnceLock<Jail> = std::sync::OnceLock::new();

/// One engine per test binary (it locks its state directory); closed when
/// the test process exits, so no mount outlives the tests.
pub fn jail() -> &'static Jail {
    JAIL.get_or_init(|| {
        let state = PathBuf::from(std::env::var("FORKBOX_TEST_STATE").unwrap_or_else(|_| "/var/lib/forkbox-test-jail".into()));
        // 4 GiB: the volume image is allocated in full, and stays between
        // runs beside the end-to-end servers' volumes on the same disk.
        let jail = Jail::open_clean(JailConfig::new(state, PathBuf::from(env!("CARGO_BIN_EXE_forkbox-jail-shim")), 4)).expect("open engine");
        // SAFETY: registering a plain extern "C" function.
        unsafe { libc::atexit(close_jail) };
        jail
    })
}

extern "C" fn close_jail() {
    if let Some(j) = JAIL.get() {
        let _ = j.close();
    }
}

/// A sandbox id unique in this test run.
pub fn unique(prefix: &str) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    format!("{prefix}-{}-{}", std::process::id(), N.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}

pub fn spec(id: &str) -> SandboxSpec {
    SandboxSpec {
        id: id.to_string(),
        template_rootfs: template_rootfs(),
        template_layers: Vec::new(),
        trust_layer: None,
        limits: Limits { memory_bytes: 256 << 20, pids: 128, cpu_weight: 100, disk_bytes: 1 << 30 },
        initial_upper: None,
        solo: false,
    }
}

/// Host processes running with a uid in `[base, base + 65536)`.
pub fn host_pids_with_uid_from(base: u32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/status"))
                .ok()
                .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.to_string()))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|u| u.parse::<u32>().ok()))
                .is_some_and(|u| u >= base && u < base + 65536)
        })
        .collect()
}

pub const ENV: &[&str] = &["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"];

pub fn env() -> Vec<String> {
    ENV.iter().map(|s| s.to_string()).collect()
}

/// Run `bash -c script` in the sandbox; returns (exit code, stdout, stderr).
pub async fn bash(sb: &Sandbox, script: &str) -> (i32, String, String) {
    let cmd = sb.spawn_command(vec!["/bin/bash".into(), "-c".into(), script.into()], env(), "/root").await.expect("spawn bash");
    collect(cmd).await
}

/// Read a command's output until it exits (not until EOF: a background
/// child may hold the pipes open), then take what is left in the pipes.
pub async fn collect(mut cmd: CommandProcess) -> (i32, String, String) {
    let mut out = Vec::new();
    let mut err = Vec::new();
    let mut buf = vec![0u8; 65536];
    let mut ebuf = vec![0u8; 65536];
    let deadline = tokio::time::sleep(Duration::from_secs(120));
    tokio::pin!(deadline);
    let status = loop {
        tokio::select! {
            n = cmd.stdout.read(&mut buf) => if let Ok(n @ 1..) = n { out.extend_from_slice(&buf[..n]) } else { tokio::time::sleep(Duration::from_millis(5)).await },
            n = cmd.stderr.read(&mut ebuf) => if let Ok(n @ 1..) = n { err.extend_from_slice(&ebuf[..n]) } else { tokio::time::sleep(Duration::from_millis(5)).await },
            s = &mut cmd.exited => break s.expect("exit status"),
            _ = &mut deadline => panic!("command did not exit within 120 s"),
        }
    };
    while let Ok(n @ 1..) = cmd.stdout.try_read(&mut buf) {
        out.extend_from_slice(&buf[..n]);
    }
    while let Ok(n @ 1..) = cmd.stderr.try_read(&mut ebuf) {
        err.extend_from_slice(&ebuf[..n]);
    }
    (code(status), String::from_utf8_lossy(&out).into_owned(), String::from_utf8_lossy(&err).into_owned())
}

pub fn code(s: ExitStatus) -> i32 {
    s.code()
}

/// Whether an entry named `name` lies in `dir`, at most `depth` levels down.
pub fn walk_contains(dir: &std::path::Path, name: &str, depth: u32) -> bool {
    if depth == 0 {
        return false;
    }
    std::fs::read_dir(dir)
        .map(|rd| rd.flatten().any(|e| e.file_name().to_string_lossy() == name || (e.path().is_dir() && walk_contains(&e.path(), name, depth - 1))))
        .unwrap_or(false)
}

/// Nothing of sandbox `id` is left: no mount, volume or cgroup.
pub fn nothing_left_of(id: &str) {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(id), "a mount of {id} survived");
    assert!(!jail().volume_root().join("sandboxes").join(id).exists(), "the volume of {id} survived");
    assert!(!walk_contains(std::path::Path::new("/sys/fs/cgroup"), id, 4), "the cgroup of {id} survived");
}
