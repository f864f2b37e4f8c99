//! A crashed server's leftovers are cleaned up by the next start on the same
//! state directory, and two servers can never share one.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use forkbox_jail::{Jail, JailConfig};

const STATE: &str = "/var/lib/forkbox-test-recovery";
const CHILD_ENV: &str = "FORKBOX_TEST_CRASHING_SERVER";

fn open(state: &Path) -> forkbox_jail::Result<Jail> {
    // A small volume: its image is allocated in full and kept between runs.
    Jail::open_clean(JailConfig::new(state.to_path_buf(), PathBuf::from(env!("CARGO_BIN_EXE_forkbox-jail-shim")), 2))
}

/// Run in a child process: create a sandbox, start a process in it, print
/// the sandbox's id and cgroup, then die by SIGKILL like a crashed server.
async fn crashing_server() {
    let jail = open(Path::new(STATE)).expect("open");
    let sb = jail.create(spec("crashed")).await.expect("create");
    let cmd = sb.spawn_command(vec!["/bin/sleep".into(), "600".into()], env(), "/").await.expect("spawn");
    std::mem::forget(cmd);
    println!("PIDS {:?}", sb.cgroup().pids());
    // SAFETY: raising SIGKILL on ourselves.
    unsafe { libc::raise(libc::SIGKILL) };
}

#[tokio::test(flavor = "multi_thread")]
async fn the_next_start_cleans_up_after_a_crash() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return crashing_server().await;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "the_next_start_cleans_up_after_a_crash", "--nocapture"])
        .env(CHILD_ENV, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("PIDS ["), "the crashing server did not get going: {stdout} {}", String::from_utf8_lossy(&out.stderr));
    let volume = Path::new(STATE).join("volume/sandboxes/crashed");
    assert!(volume.exists(), "the crash should leave the sandbox's volume behind");
    let jail = open(Path::new(STATE)).expect("a fresh start on the crashed state dir");
    assert!(!volume.exists(), "the leftover volume was not removed");
    assert!(!Path::new(STATE).join("run/crashed").exists(), "the leftover run dir was not removed");
    let cgroups = std::fs::read_dir("/sys/fs/cgroup/pids").unwrap().flatten().any(|e| e.path().join("crashed").exists());
    assert!(!cgroups, "the leftover cgroup was not removed");
    let sleeping: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("cmdline")).ok())
        .filter(|c| c == "/bin/sleep\u{0}600\u{0}")
        .collect();
    assert!(sleeping.is_empty(), "a process of the crashed sandbox survived");
    drop(jail);
}

#[tokio::test(flavor = "multi_thread")]
async fn two_servers_cannot_share_a_state_directory() {
    let state = Path::new("/var/lib/forkbox-test-recovery-lock");
    let first = open(state).expect("first");
    let second = open(state);
    assert!(matches!(&second, Err(e) if e.to_string().contains("another forkbox server")), "{:?}", second.err());
    drop(first);
    open(state).expect("free again once the first is gone");
}
