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
        .unwrap_or_else(|e| panic!("no default template under {} ({e}); build it with `forkbox template build default` or set FORKBOX_TEST_ROOTFS", root.display()))
        .flatten()
        .map(|e| e.path().join("rootfs"))
        .filter(|p| p.join("usr/bin/python3").exists())
        .collect();
    built.sort();
    built.pop().expect("a built default template")
}

pub fn jail() -> Jail {
    let state = PathBuf::from(std::env::var("FORKBOX_TEST_STATE").unwrap_or_else(|_| "/var/lib/forkbox-test-jail".into()));
    Jail::open(JailConfig { state_dir: state, shim_exe: PathBuf::from(env!("CARGO_BIN_EXE_forkbox-jail-shim")), volume_gib: 16 })
        .expect("open engine")
}

pub fn spec(id: &str) -> SandboxSpec {
    SandboxSpec {
        id: id.to_string(),
        template_rootfs: template_rootfs(),
        limits: Limits { memory_bytes: 512 << 20, pids: 256, cpu_weight: 100 },
    }
}

pub const ENV: &[&str] = &["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"];

pub fn env() -> Vec<String> {
    ENV.iter().map(|s| s.to_string()).collect()
}

/// Run `bash -c script` in the sandbox; returns (exit code, stdout, stderr).
pub async fn bash(sb: &Sandbox, script: &str) -> (i32, String, String) {
    let cmd = sb
        .spawn_command(vec!["/bin/bash".into(), "-c".into(), script.into()], env(), "/root")
        .await
        .expect("spawn bash");
    collect(cmd).await
}

pub async fn collect(mut cmd: CommandProcess) -> (i32, String, String) {
    let mut out = Vec::new();
    let mut err = Vec::new();
    let (a, b) = tokio::join!(cmd.stdout.read_to_end(&mut out), cmd.stderr.read_to_end(&mut err));
    a.unwrap();
    b.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(60), cmd.exited).await.expect("command exit in time").expect("exit status");
    (code(status), String::from_utf8_lossy(&out).into_owned(), String::from_utf8_lossy(&err).into_owned())
}

pub fn code(s: ExitStatus) -> i32 {
    s.code()
}
