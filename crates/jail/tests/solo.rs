//! Solo sandboxes (docs/state.md, "the sandbox shape a process-keeping
//! Space needs"): a family of one whose whole process tree criu can dump.
//! What a process inside sees of that shape, and that it gives nothing
//! more than a pooled member has.

mod common;

use std::time::Duration;

use common::*;
use forkbox_jail::{AfterDump, SandboxSpec};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

fn solo_spec(id: &str) -> SandboxSpec {
    SandboxSpec { solo: true, ..spec(id) }
}

/// A stand-in REPL on the control socket (fd 3): each line (`\n` for a
/// newline) is evaluated or executed in one persistent namespace, and its
/// repr (or `ok`) comes back. It takes the control socket a restore moves
/// it to (the REPL protocol's `C` frame, answered by `c`;
/// docs/repl-protocol.md) as repl.py does.
const LINE_REPL: &str = "import os, socket
s = socket.socket(fileno=3)
g = {}
buf = b''
while True:
    data, anc, _, _ = s.recvmsg(65536, socket.CMSG_SPACE(4))
    if not data:
        break
    moved = [int.from_bytes(raw[:4], 'little', signed=True) for _, kind, raw in anc if kind == socket.SCM_RIGHTS]
    if moved:
        os.dup2(moved[0], 3)
        os.close(moved[0])
        s.sendall(b'\\x00\\x00\\x00\\x03c{}')
        continue
    buf += data
    while b'\\n' in buf:
        line, buf = buf.split(b'\\n', 1)
        src = line.decode().replace('\\\\n', '\\n')
        try:
            try:
                out = repr(eval(src, g))
            except SyntaxError:
                exec(src, g)
                out = 'ok'
        except Exception as e:
            out = 'error: %r' % e
        s.sendall((out + '\\n').encode())
";

/// Send `line` to a `LINE_REPL` and read its answer.
async fn ask(control: &mut BufReader<tokio::net::UnixStream>, line: &str) -> String {
    control.get_mut().write_all(format!("{line}\n").as_bytes()).await.expect("send to the REPL");
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(20), control.read_line(&mut answer)).await.expect("the REPL answers in time").expect("read");
    answer.trim_end().to_string()
}

/// A new solo sandbox running `LINE_REPL`.
async fn solo_with_repl(prefix: &str) -> (forkbox_jail::Sandbox, forkbox_jail::ReplProcess) {
    let sb = jail().create(solo_spec(&unique(prefix))).await.expect("create a solo sandbox");
    let argv = vec!["/usr/bin/python3".to_string(), "-u".into(), "-c".into(), LINE_REPL.into()];
    let repl = sb.start_repl(argv, env(), "/root", b"").await.expect("start the REPL");
    (sb, repl)
}

fn status_field(pid: i32, field: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix(field)).unwrap_or_default().trim().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_solo_sandboxs_init_runs_from_a_read_only_bind_and_its_repl_is_inits_child() {
    let sb = jail().create(solo_spec(&unique("t-solo"))).await.expect("create a solo sandbox");
    assert!(sb.is_solo());
    let (code, out, err) = bash(
        &sb,
        "tr '\\0' ' ' < /proc/1/cmdline; echo; \
         (echo x > /dev/.forkbox-init) 2>/dev/null && echo WRITABLE; \
         grep -c ' /dev/.forkbox-init ' /proc/self/mountinfo; grep ' /dev/.forkbox-init ' /proc/self/mountinfo | grep -c ' ro,'",
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0].trim(), "forkbox-init solo");
    assert!(!out.contains("WRITABLE"), "root inside could overwrite init's binary: {out}");
    assert_eq!(&lines[1..], ["1", "1"], "{out}");
    // Init runs from inside its root, or criu could not find its binary.
    let init = sb.init_pid().expect("init's pid");
    assert_eq!(std::fs::read_link(format!("/proc/{init}/exe")).unwrap(), std::path::Path::new("/dev/.forkbox-init"));
    // It holds no host file (the shim's streams are the server's log, which
    // criu could not dump): its standard streams are the sandbox's /dev/null.
    for fd in 0..3 {
        assert_eq!(std::fs::read_link(format!("/proc/{init}/fd/{fd}")).unwrap(), std::path::Path::new("/dev/null"), "init's fd {fd}");
    }

    let argv = vec!["/usr/bin/python3".to_string(), "-u".into(), "-c".into(), LINE_REPL.into()];
    let repl = sb.start_repl(argv, env(), "/root", b"").await.expect("start the REPL");
    // On the host: init's child, three pid namespaces deep (host, family, leaf).
    assert_eq!(status_field(repl.host_pid, "PPid:"), init.to_string());
    assert_eq!(status_field(repl.host_pid, "NSpid:").split_whitespace().count(), 3);
    let mut control = BufReader::new(repl.control);
    assert_eq!(ask(&mut control, "x = 41").await, "ok");
    assert_eq!(ask(&mut control, "x + 1").await, "42");
    // Inside: the REPL is a child of init, seen by ps, with a small pid.
    let leaf_pid: i32 = ask(&mut control, "__import__('os').getpid()").await.parse().expect("a pid");
    assert!(leaf_pid > 1 && leaf_pid < 1000, "REPL pid {leaf_pid}");
    let (_, out, _) = bash(&sb, &format!("awk '/^PPid/ {{print $2}}' /proc/{leaf_pid}/status")).await;
    assert_eq!(out.trim(), "1");
    // No notify filter: the shim vets nothing of a solo member.
    let filters = ask(&mut control, "open('/proc/self/status').read().split('Seccomp_filters:')[1].split()[0]").await;
    let (_, member_filters, err) = bash(&sb, "grep Seccomp_filters /proc/self/status | cut -f2").await;
    assert_eq!(filters.trim_matches('\''), member_filters.trim(), "the REPL carries other filters than a command ({err})");

    // Its exit is reported like a pooled REPL's (init reaps it, the shim tells).
    drop(control);
    let status = tokio::time::timeout(Duration::from_secs(20), repl.exited).await.expect("exit reported in time").expect("status");
    assert_eq!(status.code(), 0);

    // A family of one: no fork, no spares.
    let fork = jail().fork_members(&sb, &[unique("t-solo-child")], None).await;
    assert!(matches!(fork, Err(forkbox_jail::Error::Unsupported(_))), "{:?}", fork.err());
    jail().destroy(&sb).await.expect("destroy");
}

/// The criu of the tools root `./dev test` builds (or the host's, if new enough).
fn find_criu() -> criu::Criu {
    let dir = std::env::var_os("FORKBOX_TOOLS_DIR").map_or_else(|| std::path::PathBuf::from("/var/lib/forkbox/tools"), std::path::PathBuf::from).join("criu");
    // The newest build, as the server takes it (an older one may lack the patch).
    let mut roots: Vec<_> =
        std::fs::read_dir(&dir).into_iter().flatten().flatten().map(|e| e.path().join("rootfs")).filter(|p| p.join("usr/sbin/criu").exists()).collect();
    roots.sort_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
    criu::Criu::find(roots.last().map(|p| p.as_path()), &dir).expect("criu: run `forkbox tools build criu`")
}

/// A dumped sandbox, as a Space would keep it: its images and files (in
/// `work`, removed when dropped) and the edges a restore replaces.
struct Frozen {
    work: tempfile::TempDir,
    images: std::path::PathBuf,
    files: std::path::PathBuf,
    edges: forkbox_jail::Edges,
}

/// Dump `old`, save its files, destroy it.
async fn freeze(old: forkbox_jail::Sandbox, criu: &criu::Criu) -> Frozen {
    let work = tempfile::tempdir().expect("tempdir");
    let (images, files) = (work.path().join("images"), work.path().join("files"));
    std::fs::create_dir(&images).unwrap();
    let edges = jail().dump(&old, criu, &images, AfterDump::End).await.expect("dump");
    old.export_upper(&files).expect("save the files");
    jail().destroy(&old).await.expect("destroy the dumped sandbox");
    Frozen { work, images, files, edges }
}

/// A way to damage a copy of the images.
type Damage = Box<dyn Fn(&std::path::Path)>;

#[tokio::test(flavor = "multi_thread")]
async fn criu_dumps_a_solo_sandbox_whole() {
    let criu = find_criu();
    let (sb, repl) = solo_with_repl("t-solo-dump").await;
    let mut control = BufReader::new(repl.control);
    assert_eq!(ask(&mut control, "import threading, subprocess, time").await, "ok");
    assert_eq!(
        ask(&mut control, "server = subprocess.Popen(['python3', '-m', 'http.server', '8000'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)").await,
        "ok"
    );
    let images = tempfile::tempdir().expect("tempdir");
    let dumped = jail().dump(&sb, &criu, images.path(), AfterDump::End).await;
    let log = std::fs::read_to_string(images.path().join("dump.log")).unwrap_or_default();
    let errors: Vec<&str> = log.lines().filter(|l| l.contains("Error")).collect();
    assert!(dumped.is_ok(), "{:?}: {errors:#?}", dumped.err());
    // The server's alone: root's, closed to everyone else.
    use std::os::unix::fs::MetadataExt;
    for entry in std::fs::read_dir(images.path()).unwrap().flatten() {
        let meta = entry.metadata().unwrap();
        assert_eq!((meta.uid(), meta.gid(), meta.mode() & 0o777), (0, 0, 0o600), "{:?}", entry.file_name());
    }
    assert_eq!(std::fs::metadata(images.path()).unwrap().mode() & 0o777, 0o700);
    // Every process is in the images: init, the REPL and its http.server.
    let cores = std::fs::read_dir(images.path()).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().starts_with("core-")).count();
    assert!(cores >= 3, "{cores} processes dumped");
    // A dump ends the tree (its memory is on disk now); the shim says so.
    assert!(sb.wait_init_gone(Duration::from_secs(10)).await, "the dumped sandbox still runs");
    // (Its status is lost when init, dying first, reaped it: then the
    // waiter is dropped, as for a forked REPL.)
    let ended = tokio::time::timeout(Duration::from_secs(10), repl.exited).await.expect("the REPL's end reported");
    assert!(ended.is_err() || ended.is_ok_and(|s| s.code() == 128 + libc::SIGKILL));
    jail().destroy(&sb).await.expect("destroy");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_solo_sandbox_is_dumped_and_stays_paused_until_it_goes_on() {
    let criu = find_criu();
    let (sb, repl) = solo_with_repl("t-solo-paused").await;
    let mut control = BufReader::new(repl.control);
    assert_eq!(ask(&mut control, "import threading, time; n = [0]").await, "ok");
    assert_eq!(
        ask(
            &mut control,
            "t = threading.Thread(target=lambda: [n.__setitem__(0, n[0] + 1) or time.sleep(0.002) for _ in iter(int, 1)], daemon=True); t.start()"
        )
        .await,
        "ok"
    );
    let images = tempfile::tempdir().expect("tempdir");
    // A running sandbox is refused: its files would not match its memory.
    let refused = jail().dump(&sb, &criu, images.path(), AfterDump::StayPaused).await;
    assert!(matches!(refused, Err(forkbox_jail::Error::Invalid(_))), "{refused:?}");
    sb.pause().expect("pause");
    let ticks = |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap().split_whitespace().nth(13).unwrap().parse::<u64>().unwrap();
    let dumped = jail().dump(&sb, &criu, images.path(), AfterDump::StayPaused).await;
    assert!(dumped.is_ok(), "{dumped:?}");
    assert!(std::fs::read_dir(images.path()).unwrap().flatten().any(|e| e.file_name().to_string_lossy().starts_with("pages-")));
    // Still there, still paused: its counting thread stands still. (criu's
    // parasite ran inside it during the dump, so count from after it.)
    assert!(sb.init_alive() && sb.is_paused() && sb.cgroup().is_frozen(), "criu let the dumped sandbox go on");
    let after_dump = ticks(repl.host_pid);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(ticks(repl.host_pid), after_dump, "the dumped sandbox ran on while paused");
    sb.resume().expect("resume");
    let counted: u64 = ask(&mut control, "n[0]").await.parse().unwrap();
    assert!(ask(&mut control, "time.sleep(0.1) or n[0]").await.parse::<u64>().unwrap() > counted);
    jail().destroy(&sb).await.expect("destroy");
}

/// Ask until `line` answers `want` (a process started in the background).
async fn ask_until(control: &mut BufReader<tokio::net::UnixStream>, line: &str, want: &str) {
    for _ in 0..100 {
        if ask(control, line).await == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{line} never answered {want}");
}

const SERVER_ANSWERS: &str = "__import__('urllib.request').request.urlopen('http://127.0.0.1:8000/', timeout=2).status";

#[tokio::test(flavor = "multi_thread")]
async fn a_dumped_solo_sandbox_comes_back_running_in_a_family_of_its_own() {
    let criu = find_criu();
    let (old, repl) = solo_with_repl("t-solo-old").await;
    let (old_uid, old_pid) = (status_field(repl.host_pid, "Uid:"), repl.host_pid);
    // What confines it, to be found unchanged after the restore.
    let confinement = |pid: i32| ["Seccomp:", "Seccomp_filters:", "NoNewPrivs:", "CapBnd:", "CapEff:", "CapPrm:"].map(|f| status_field(pid, f));
    let mut control = BufReader::new(repl.control);
    for line in [
        "import threading, subprocess, time",
        "x = 41",
        "it = iter(range(100)); skipped = (next(it), next(it))",
        "n = [0]",
        "def tick():\n while True:\n  n[0] += 1\n  time.sleep(0.005)",
        "t = threading.Thread(target=tick, daemon=True); t.start()",
        "log = open('/root/log', 'w'); log.write('abc'); log.flush()",
        "server = subprocess.Popen(['python3', '-m', 'http.server', '8000'], cwd='/root', stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)",
    ] {
        assert_eq!(ask(&mut control, &line.replace('\n', "\\n")).await, "ok", "{line}");
    }
    ask_until(&mut control, SERVER_ANSWERS, "200").await;
    let confined = confinement(old_pid);
    assert_eq!(confined[1], "2", "the REPL runs under the member's two filters");
    let counted: u64 = ask(&mut control, "n[0]").await.parse().unwrap();

    // Twice: a restored sandbox's edges were moved into its own network
    // namespace, so it can be dumped again (and a generator goes on).
    let (mut sandbox, mut counted, mut _held) = (old, counted, None);
    for (round, expected_next) in [(1, "2"), (2, "3")] {
        let Frozen { work: _work, images, files, edges } = freeze(sandbox, &criu).await;
        let new_id = unique("t-solo-new");
        let spec = SandboxSpec { initial_upper: Some(files), ..solo_spec(&new_id) };
        let (new, repl) = jail().restore(spec, &images, &edges, &criu, true).await.unwrap_or_else(|e| {
            let log = std::fs::read_to_string(images.join("restore.log")).unwrap_or_default();
            panic!("restore {round}: {e}\n{}", log.lines().filter(|l| l.contains("Error")).collect::<Vec<_>>().join("\n"))
        });
        let repl = repl.unwrap_or_else(|| panic!("round {round}: the REPL did not come back ({edges:?})"));
        let mut control = BufReader::new(repl.control);
        // The same objects: globals, a generator mid-way, an open file's
        // offset, a thread still counting, the server it started answering.
        assert_eq!(ask(&mut control, "x + 1").await, "42");
        assert_eq!(ask(&mut control, "next(it)").await, expected_next, "round {round}");
        assert_eq!(ask(&mut control, "log.tell()").await, "3");
        let after: u64 = ask(&mut control, "time.sleep(0.1) or n[0]").await.parse().unwrap();
        assert!(after > counted, "round {round}: the thread stopped counting: {counted} then {after}");
        counted = after;
        assert_eq!(ask(&mut control, SERVER_ANSWERS).await, "200");
        assert_eq!(ask(&mut control, "server.poll()").await, "None");
        // No more than it had: the same filters, no-new-privs and capabilities.
        assert_eq!(confinement(repl.host_pid), confined, "round {round}: the restored REPL is confined differently");
        // In its own family: a new uid range (not host root's), and init
        // still pid 1 of its tree.
        let uid = status_field(repl.host_pid, "Uid:");
        assert_ne!(uid, old_uid, "the restored sandbox kept the dumped one's uid range");
        assert!(uid.split_whitespace().all(|u| u.parse::<u32>().unwrap() >= 1 << 28), "the restored REPL runs as host uid {uid}");
        let (code, out, err) = bash(&new, "tr '\\0' ' ' < /proc/1/cmdline; echo; cat /root/log; echo; hostname").await;
        assert_eq!(code, 0, "{err}");
        assert!(out.starts_with("forkbox-init solo"), "{out}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(&lines[1..], ["abc", new_id.as_str()], "{out}");
        // Its edges are its own: init's channel and the REPL's control
        // socket belong to its network namespace (criu dumps no other).
        let init = new.init_pid().unwrap();
        let netns = std::fs::read_link(format!("/proc/{init}/ns/net")).unwrap();
        assert_eq!(socket_netns(init, 3), netns, "init's channel");
        assert_eq!(socket_netns(repl.host_pid, 3), netns, "the REPL's control socket");
        // (The REPL ends at the end of its stream: it stays open until the dump.)
        _held = Some(control);
        sandbox = new;
    }
    jail().destroy(&sandbox).await.expect("destroy");
}

/// The network namespace of the socket at `pid`'s `fd` (SIOCGSKNS).
fn socket_netns(pid: i32, fd: i32) -> std::path::PathBuf {
    let pidfd = rustix::process::pidfd_open(rustix::process::Pid::from_raw(pid).unwrap(), rustix::process::PidfdFlags::empty()).unwrap();
    let sock = rustix::process::pidfd_getfd(&pidfd, fd, rustix::process::PidfdGetfdFlags::empty()).unwrap();
    // SAFETY: SIOCGSKNS takes no argument and returns a new descriptor.
    let ns = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&sock), 0x894C) };
    assert!(ns >= 0, "SIOCGSKNS: {}", std::io::Error::last_os_error());
    let link = std::fs::read_link(format!("/proc/self/fd/{ns}")).unwrap();
    // SAFETY: the descriptor SIOCGSKNS just made.
    unsafe { libc::close(ns) };
    link
}

#[tokio::test(flavor = "multi_thread")]
async fn damaged_images_fail_the_restore_and_leave_nothing_behind() {
    let criu = find_criu();
    let (old, repl) = solo_with_repl("t-solo-bad").await;
    let mut control = BufReader::new(repl.control);
    assert_eq!(ask(&mut control, "x = 1").await, "ok");
    let Frozen { work, images, files, edges } = freeze(old, &criu).await;

    let userns = std::fs::read_dir(&images).unwrap().flatten().map(|e| e.file_name()).find(|n| n.to_string_lossy().starts_with("userns-")).unwrap();
    let damages: [(&str, Damage); 3] = [
        ("no process tree", Box::new(|dir| std::fs::remove_file(dir.join("pstree.img")).unwrap())),
        ("a user namespace image that is not one", Box::new(move |dir| std::fs::write(dir.join(&userns), [7u8; 64]).unwrap())),
        ("an inventory of garbage", Box::new(|dir| std::fs::write(dir.join("inventory.img"), b"not an image at all").unwrap())),
    ];
    for (what, damage) in damages {
        let damaged = work.path().join("damaged");
        let _ = std::fs::remove_dir_all(&damaged);
        assert!(std::process::Command::new("cp").arg("-a").arg(&images).arg(&damaged).status().unwrap().success());
        damage(&damaged);
        let id = unique("t-solo-bad-new");
        let spec = SandboxSpec { initial_upper: Some(files.clone()), ..solo_spec(&id) };
        let restored = jail().restore(spec, &damaged, &edges, &criu, true).await;
        assert!(restored.is_err(), "{what}: restored anyway");
        nothing_left_of(&id);
        // The memory pages lent to the restore are root's again.
        use std::os::unix::fs::MetadataExt;
        for entry in std::fs::read_dir(&damaged).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().starts_with("pages-")) {
            assert_eq!(entry.metadata().unwrap().uid(), 0, "{what}: {:?} was not given back", entry.file_name());
        }
    }
    // The engine goes on making sandboxes.
    let sb = jail().create(solo_spec(&unique("t-solo-after"))).await.expect("create after failed restores");
    assert_eq!(bash(&sb, "echo ok").await.1, "ok\n");
    jail().destroy(&sb).await.expect("destroy");
}
