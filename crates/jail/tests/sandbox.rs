//! The engine against real sandboxes: what a process inside sees and may do,
//! resource limits, and that destroy leaves nothing behind. Every isolation
//! property here is an attempt to break it from inside.

mod common;

use common::*;

#[tokio::test(flavor = "multi_thread")]
async fn bash_runs_inside_as_root_with_its_own_hostname() {
    let id = unique("t-bash");
    let sb = jail().create(spec(&id)).await.expect("create");
    let (code, out, err) = bash(&sb, "id -u; hostname; pwd; echo $HOME").await;
    assert_eq!(code, 0, "stderr: {err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines, ["0", id.as_str(), "/root", "/root"]);
    jail().destroy(&sb).await.expect("destroy");
}

#[tokio::test(flavor = "multi_thread")]
async fn exit_codes_and_stderr_come_back() {
    let sb = jail().create(spec(&unique("t-exit"))).await.unwrap();
    let (code, out, err) = bash(&sb, "echo out; echo err >&2; exit 7").await;
    assert_eq!((code, out.as_str(), err.as_str()), (7, "out\n", "err\n"));
    let (code, _, err) = bash(&sb, "no-such-command-here").await;
    assert_eq!(code, 127, "{err}");
    jail().destroy(&sb).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn host_is_invisible_and_proc_shows_only_the_sandbox() {
    let sb = jail().create(spec(&unique("t-host"))).await.unwrap();
    let here = std::env::current_dir().unwrap();
    let script = format!(
        "test -e {} && echo HOST_VISIBLE; test -e /root/.cargo && echo CARGO_VISIBLE; \
         ls /proc | grep -cE '^[0-9]+$'; cat /proc/1/cmdline | tr '\\0' ' '; echo; \
         grep -c /var/lib /proc/self/mountinfo; cat /proc/self/uid_map",
        here.display()
    );
    let (code, out, err) = bash(&sb, &script).await;
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("HOST_VISIBLE") && !out.contains("CARGO_VISIBLE"), "{out}");
    let lines: Vec<&str> = out.lines().collect();
    // init, bash, ls and grep at most.
    let procs: usize = lines[0].parse().unwrap();
    assert!(procs <= 5, "sandbox sees {procs} processes: {out}");
    assert_eq!(lines[1].trim(), "forkbox-init");
    // No mount inside names the host's state directory.
    assert_eq!(lines[2], "0", "host paths in mountinfo: {out}");
    // uid 0 inside maps to an unprivileged host range.
    let map: Vec<u64> = lines[3].split_whitespace().map(|v| v.parse().unwrap()).collect();
    assert_eq!(map[0], 0);
    assert!(map[1] >= 1 << 28, "uid 0 maps to host uid {}", map[1]);
    jail().destroy(&sb).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn privileged_operations_are_refused() {
    let sb = jail().create(spec(&unique("t-priv"))).await.unwrap();
    for (what, script) in [
        ("mount", "mount -t tmpfs none /mnt"),
        ("unshare a user namespace", "unshare --user true"),
        ("unshare a mount namespace", "unshare --mount true"),
        ("load a module", "python3 -c 'import ctypes,sys; sys.exit(0 if ctypes.CDLL(None).init_module(0,0,b\"\") == 0 else 1)'"),
        ("open a raw socket", "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)'"),
        ("set the clock", "date -s 2001-01-01"),
        ("read the kernel log", "dmesg"),
        ("mknod a disk", "mknod /tmp/sda b 8 0 && head -c1 /tmp/sda"),
        ("write a host sysctl", "echo 1 > /proc/sys/vm/drop_caches"),
    ] {
        let (code, out, err) = bash(&sb, script).await;
        assert_ne!(code, 0, "{what} succeeded inside a sandbox: {out} {err}");
    }
    // Renaming the host needs CAP_SYS_ADMIN, which sandboxes do not get.
    let (code, _, _) = bash(&sb, "hostname renamed").await;
    assert_ne!(code, 0);
    assert_ne!(nix::unistd::gethostname().unwrap().to_string_lossy(), "renamed");
    jail().destroy(&sb).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn sandboxes_do_not_see_each_others_files_or_processes() {
    let a = jail().create(spec(&unique("t-iso-a"))).await.unwrap();
    let b = jail().create(spec(&unique("t-iso-b"))).await.unwrap();
    let (code, _, _) = bash(&a, "echo secret > /root/a.txt; sleep 30 & echo started").await;
    assert_eq!(code, 0);
    let (_, out, _) = bash(&b, "cat /root/a.txt 2>&1; ps -e | grep -c sleep").await;
    assert!(out.contains("No such file"), "{out}");
    assert_eq!(out.lines().last(), Some("0"), "b sees a's sleep: {out}");
    jail().destroy(&a).await.unwrap();
    jail().destroy(&b).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_pids_limit_stops_a_fork_bomb() {
    let sb = jail().create(spec(&unique("t-bomb"))).await.unwrap();
    // Tries far more processes than the limit (128) allows, then reports.
    let script = r#"python3 -c '
import os, time
n = 0
try:
    while n < 1000:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
except OSError as e:
    print(n, e.errno)
'"#;
    let (code, out, err) = bash(&sb, script).await;
    assert_eq!(code, 0, "{err}");
    let fields: Vec<i32> = out.split_whitespace().map(|v| v.parse().unwrap()).collect();
    assert!(fields[0] > 10 && fields[0] < 128, "{} forks succeeded", fields[0]);
    assert_eq!(fields[1], libc::EAGAIN);
    assert!(sb.cgroup().pids().len() <= 128);
    // The sandbox still answers once the bomb's processes are gone.
    let (code, _, _) = bash(&sb, "pkill sleep; pkill -f 'python3 -c'; true").await;
    let _ = code;
    jail().destroy(&sb).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_limit_kills_the_hog_not_the_sandbox() {
    let sb = jail().create(spec(&unique("t-oom"))).await.unwrap();
    let before = sb.cgroup().oom_kills();
    let (code, _, _) = bash(&sb, "python3 -c 'b = bytearray(600 << 20); b[::4096] = b\"x\" * len(b[::4096])'").await;
    assert_eq!(code, 137, "the hog was not killed by SIGKILL");
    assert!(sb.cgroup().oom_kills() > before);
    let (code, out, _) = bash(&sb, "echo still-here").await;
    assert_eq!((code, out.trim()), (0, "still-here"));
    jail().destroy(&sb).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn destroy_leaves_no_process_cgroup_mount_or_volume() {
    let id = unique("t-clean");
    let sb = jail().create(spec(&id)).await.unwrap();
    let (code, out, _) = bash(&sb, "sleep 60 & cat /proc/self/status | grep Uid").await;
    assert_eq!(code, 0);
    let _ = out;
    let pids = sb.cgroup().pids();
    assert!(!pids.is_empty());
    let uid_base = std::fs::read_to_string(format!("/proc/{}/uid_map", pids[0])).unwrap();
    let base: u32 = uid_base.split_whitespace().nth(1).unwrap().parse().unwrap();
    jail().destroy(&sb).await.unwrap();
    assert!(host_pids_with_uid_from(base).is_empty(), "processes survived destroy");
    for p in pids {
        assert!(!std::path::Path::new(&format!("/proc/{p}")).exists(), "pid {p} survived");
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&id), "a mount of {id} survived");
    assert!(!jail().volume_root().join("sandboxes").join(&id).exists(), "the volume survived");
    let cg = std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten().any(|e| {
        let p = e.path();
        walk_contains(&p, &id, 3)
    });
    assert!(!cg, "the cgroup survived");
}

#[tokio::test(flavor = "multi_thread")]
async fn writes_inside_never_reach_the_template() {
    let sb = jail().create(spec(&unique("t-tmpl"))).await.unwrap();
    let template = template_rootfs();
    let before = std::fs::read(template.join("etc/hostname")).unwrap();
    let (code, _, err) = bash(&sb, "echo changed > /etc/hostname && touch /usr/bin/forkbox-added && rm /etc/os-release && chmod 777 /usr").await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read(template.join("etc/hostname")).unwrap(), before);
    assert!(!template.join("usr/bin/forkbox-added").exists());
    assert!(template.join("etc/os-release").exists());
    use std::os::unix::fs::PermissionsExt;
    assert_ne!(std::fs::metadata(template.join("usr")).unwrap().permissions().mode() & 0o777, 0o777);
    jail().destroy(&sb).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_disk_limit_stops_writes_and_deleting_frees_it() {
    let mut s = spec(&unique("t-disk"));
    s.limits.disk_bytes = 64 << 20;
    let sb = jail().create(s).await.unwrap();
    let (code, _, err) = bash(&sb, "head -c 100M /dev/zero > /root/big").await;
    assert_ne!(code, 0);
    assert!(err.contains("Disk quota exceeded"), "{err}");
    // Freed space is the sandbox's again (once the deletion is committed).
    let (code, out, err) = bash(&sb, "rm /root/big && sync -f / && head -c 40M /dev/zero > /root/big && stat -c %s /root/big").await;
    assert_eq!((code, out.trim()), (0, "41943040"), "{err}");
    // A raised limit (a warm spare handed to a bigger create) applies at once.
    let mut raised = sb.limits();
    raised.disk_bytes = 256 << 20;
    sb.set_limits(&raised).unwrap();
    let (code, _, err) = bash(&sb, "head -c 150M /dev/zero > /root/more").await;
    assert_eq!(code, 0, "{err}");
    jail().destroy(&sb).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn limits_are_written_to_the_sandbox_cgroup() {
    let mut s = spec(&unique("t-limits"));
    s.limits = forkbox_jail::Limits { memory_bytes: 300 << 20, pids: 77, cpu_weight: 50, disk_bytes: 1 << 30 };
    let sb = jail().create(s).await.unwrap();
    // The sandbox's init is in the cgroup; find the cgroup from its side.
    let pid = sb.cgroup().pids()[0];
    let read = |ctrl: &str, file: &str| -> String {
        let line = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        let path = line
            .lines()
            .find_map(|l| {
                let parts: Vec<&str> = l.splitn(3, ':').collect();
                (parts[1].split(',').any(|c| c == ctrl) || (parts[1].is_empty() && ctrl.is_empty())).then(|| parts[2].to_string())
            })
            .unwrap();
        let base =
            if std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() { "/sys/fs/cgroup".to_string() } else { format!("/sys/fs/cgroup/{ctrl}") };
        std::fs::read_to_string(format!("{base}{path}/{file}")).unwrap().trim().to_string()
    };
    if std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        assert_eq!(read("", "memory.max"), (300u64 << 20).to_string());
        assert_eq!(read("", "pids.max"), "77");
        assert_eq!(read("", "cpu.weight"), "50");
    } else {
        assert_eq!(read("memory", "memory.limit_in_bytes"), (300u64 << 20).to_string());
        assert_eq!(read("pids", "pids.max"), "77");
        assert_eq!(read("cpu", "cpu.shares"), "512");
    }
    jail().destroy(&sb).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn cpu_time_counts_processes_that_have_exited_and_the_weight_reads_back() {
    let sb = jail().create(spec(&unique("t-cpu"))).await.unwrap();
    let before = sb.cgroup().cpu_usage_ns();
    // A child that burns CPU and is gone when we look.
    let (code, _, err) = bash(&sb, "python3 -c 'sum(range(20_000_000))'").await;
    assert_eq!(code, 0, "{err}");
    let used = sb.cgroup().cpu_usage_ns() - before;
    assert!(used >= 100_000_000, "only {used} ns counted for a process that has exited");
    for w in [2000, 100, 10_000, 1] {
        sb.cgroup().set_cpu_weight(w).unwrap();
        assert_eq!(sb.cgroup().cpu_weight(), Some(w));
    }
    jail().destroy(&sb).await.unwrap();
}
