//! A member's init: PID 1 of the member's leaf pid namespace. It finishes the
//! sandbox's root (proc, dev, pivot_root), then runs commands for the shim
//! (bash, later PTYs) and reaps every process of the member.

use std::collections::HashMap;
use std::fs;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::symlink;
use std::path::Path;

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::SignalFd;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{chdir, pivot_root, sethostname, Pid};

use super::confine::Confinement;
use super::messages::{ExitStatus, InitMessage, InitRequest, RunAs};
use super::sealed_policy;
use crate::channel;
use crate::sys::{self, Forked};

/// Device nodes bound from the host (they are namespace-safe).
const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];
/// Host kernel interfaces hidden inside, as container runtimes do.
const MASKED_FILES: [&str; 5] = ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sysrq-trigger", "/proc/latency_stats"];
const MASKED_DIRS: [&str; 4] = ["/proc/acpi", "/proc/scsi", "/sys/firmware", "/proc/driver"];

/// A mount inside a member that binds a host file in: criu records it as
/// external (by `key`) and binds `host` there again at a restore.
pub struct HostBind {
    pub inside: String,
    pub key: String,
    pub host: std::path::PathBuf,
}

/// Every host bind `enter_root` makes in a solo member whose init binary
/// is `init_binary`.
pub fn host_binds(init_binary: &Path) -> Vec<HostBind> {
    let devices = DEVICES.iter().map(|name| HostBind { inside: format!("/dev/{name}"), key: format!("dev-{name}"), host: Path::new("/dev").join(name) });
    let masks = MASKED_FILES.iter().map(|file| HostBind {
        inside: file.to_string(),
        key: format!("mask-{}", file.trim_start_matches('/').replace('/', "-")),
        host: "/dev/null".into(),
    });
    let init = HostBind { inside: SOLO_INIT_PATH.to_string(), key: "forkbox-init".into(), host: init_binary.to_path_buf() };
    devices.chain(masks).chain([init]).collect()
}

/// `argv[0]` of an exec'd init; `main` dispatches on it.
pub const INIT_ARGV0: &str = "forkbox-init";
/// `argv[1]` of a solo sandbox's init (see [`Shape::Solo`]).
const SOLO_ARG: &str = "solo";
/// After `SOLO_ARG`: a restored init executed afresh (`renew`).
const RENEWED_ARG: &str = "renewed";
/// Where a solo sandbox's init binary is bound, read-only, inside its root.
/// Under `/dev` (our own tmpfs) so no template file is shadowed; the bind
/// is a mount of its own, so `/dev`'s noexec does not apply to it.
pub const SOLO_INIT_PATH: &str = "/dev/.forkbox-init";

/// What a member's process tree looks like.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Shape {
    /// A member of a shared family: init runs the forkbox binary from a
    /// host descriptor, and every process inherits the network gate's
    /// notify filter (docs/architecture.md#processes-and-namespaces).
    Pooled,
    /// A family of one that criu can dump (docs/state.md): init runs its
    /// binary from a bind inside the root, the REPL is init's child, and
    /// no process carries a notify filter (criu cannot restore a
    /// listener that lives in the shim).
    Solo,
}

/// In the forked child: finish the root, then exec a fresh copy of our own
/// binary as init, so nothing of the shim's memory (host paths, other
/// state) stays in a process that lives inside the sandbox.
///
/// `root: None` makes a *hollow* member: namespaces and init ready, its root
/// attached later (`InitRequest::Root`, when a fork hands it its files).
pub fn run(sock: OwnedFd, policy: BorrowedFd<'_>, root: Option<&Path>, hostname: &str, shape: Shape) -> ! {
    if shape == Shape::Solo {
        solo_exec(sock, root, hostname)
    }
    let exe = fs::File::open("/proc/self/exe").map(OwnedFd::from);
    let result = exe
        .map_err(|e| format!("open own executable: {e}"))
        .and_then(|exe| prepare(hostname).map(|()| exe))
        .and_then(|exe| root.map_or(Ok(()), |r| enter_root(r, None)).map(|()| exe));
    let exe = match result {
        Ok(exe) => exe,
        Err(e) => {
            let _ = channel::send(sock.as_fd(), &InitMessage::SetupFailed { error: e }, &[]);
            std::process::exit(1);
        }
    };
    // Keep only the socket to the shim (on fd 3), the executable and the
    // compiled policy (`sealed_policy::INIT_FD`).
    let _ = sys::place_fds(&[sock.as_raw_fd(), exe.as_raw_fd(), policy.as_raw_fd()], 3);
    sys::close_fds_from(sealed_policy::INIT_FD + 1);
    let argv0 = std::ffi::CString::new(INIT_ARGV0).unwrap_or_default();
    let argv = [argv0.as_ptr(), std::ptr::null()];
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    // SAFETY: argv/envp are NUL-terminated arrays of valid C strings that
    // outlive the call; fd 4 is our own executable.
    unsafe { libc::syscall(libc::SYS_execveat, 4, c"".as_ptr(), argv.as_ptr(), envp.as_ptr(), libc::AT_EMPTY_PATH) };
    let err = format!("exec init: {}", std::io::Error::last_os_error());
    // SAFETY: fd 3 is the socket placed above.
    let sock = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(3) };
    let _ = channel::send(sock.as_fd(), &InitMessage::SetupFailed { error: err }, &[]);
    std::process::exit(1)
}

/// A solo member's init: finish the root with our binary bound into it,
/// then exec that bind, so every mapping of init lies inside the
/// sandbox's mount namespace (criu dumps only what it can find there).
fn solo_exec(sock: OwnedFd, root: Option<&Path>, hostname: &str) -> ! {
    // By path, in this mount namespace: a bind needs a source mount of the
    // caller's namespace, which /proc/self/exe (the shim's) is not.
    let result = match root {
        None => Err("a solo member needs its root at create".to_string()),
        Some(root) => fs::read_link("/proc/self/exe")
            .map_err(|e| format!("find own executable: {e}"))
            .and_then(|exe| if exe.exists() { Ok(exe) } else { Err(format!("the server's binary {} is gone (replaced?)", exe.display())) })
            .and_then(|exe| prepare(hostname).and_then(|()| enter_root(root, Some(&exe)))),
    };
    if let Err(e) = result {
        let _ = channel::send(sock.as_fd(), &InitMessage::SetupFailed { error: e }, &[]);
        std::process::exit(1);
    }
    // criu dumps a tree whose sessions all lead from inside it, and whose
    // files all lie inside it: the shim's standard streams (the server's
    // log) give way to the sandbox's /dev/null.
    let _ = nix::unistd::setsid();
    let _ = sys::dup_to(sock.as_raw_fd(), 3);
    if let Ok(null) = fs::OpenOptions::new().read(true).write(true).open("/dev/null") {
        for fd in 0..3 {
            let _ = sys::dup_to(null.as_raw_fd(), fd);
        }
    }
    sys::close_fds_from(4);
    let path = std::ffi::CString::new(SOLO_INIT_PATH).unwrap_or_default();
    let argv0 = std::ffi::CString::new(INIT_ARGV0).unwrap_or_default();
    let argv1 = std::ffi::CString::new(SOLO_ARG).unwrap_or_default();
    let argv = [argv0.as_ptr(), argv1.as_ptr(), std::ptr::null()];
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    // SAFETY: NUL-terminated arrays of valid C strings that outlive the call.
    unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    let err = format!("exec init from {SOLO_INIT_PATH}: {}", std::io::Error::last_os_error());
    // SAFETY: fd 3 is the socket placed above.
    let sock = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(3) };
    let _ = channel::send(sock.as_fd(), &InitMessage::SetupFailed { error: err }, &[]);
    std::process::exit(1)
}

/// A restored solo init executes itself afresh (`InitRequest::Renew`),
/// keeping its channel (fd 3) and children, the ones it runs for the shim
/// passed as `pid:id` arguments. criu restores a process without an exec,
/// so its memory still belongs to the user namespace criu ran in, where
/// the tree has no capability: criu could not dump this init (not
/// dumpable, docs/state.md) a second time. After an exec in its own user
/// namespace it is as it was at create. Returns only on failure.
fn renew(running: &HashMap<i32, u64>) -> String {
    let mut args = vec![INIT_ARGV0.to_string(), SOLO_ARG.to_string(), RENEWED_ARG.to_string()];
    args.extend(running.iter().map(|(pid, id)| format!("{pid}:{id}")));
    let args: Vec<std::ffi::CString> = args.into_iter().filter_map(|a| std::ffi::CString::new(a).ok()).collect();
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    let path = std::ffi::CString::new(SOLO_INIT_PATH).unwrap_or_default();
    // SAFETY: NUL-terminated arrays of valid C strings that outlive the call.
    unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    format!("renew init from {SOLO_INIT_PATH}: {}", std::io::Error::last_os_error())
}

/// The children a renewed init runs for the shim (`renew`'s arguments).
fn renewed_running() -> Option<HashMap<i32, u64>> {
    let mut args = std::env::args().skip(2);
    (args.next().as_deref() == Some(RENEWED_ARG)).then(|| {
        args.filter_map(|a| {
            let (pid, id) = a.split_once(':')?;
            Some((pid.parse().ok()?, id.parse().ok()?))
        })
        .collect()
    })
}

/// Entry point of the exec'd init (`argv[0] == forkbox-init`): the socket
/// to the shim is fd 3.
pub fn main() -> ! {
    let shape = if std::env::args().nth(1).as_deref() == Some(SOLO_ARG) { Shape::Solo } else { Shape::Pooled };
    let inherited = sealed_policy::take_inherited();
    sys::close_fds_from(4);
    // SAFETY: prctl with a NUL-terminated name.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"forkbox-init".as_ptr(), 0, 0, 0) };
    let _ = sys::set_not_dumpable();
    // SAFETY: the shim's init socket is on fd 3 (see `run`).
    let sock = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(3) };
    if let Some(running) = renewed_running() {
        serve_renewed(sock, running)
    }
    // Ready first: compiling the policy (~1 ms, where the shim left none)
    // overlaps with the server's next steps; the first command waits for
    // it anyway.
    if channel::send_with_credentials(sock.as_fd(), &InitMessage::Ready).is_err() {
        std::process::exit(1);
    }
    let sock = match shape {
        Shape::Pooled => sock,
        Shape::Solo => match own_channel(sock) {
            Ok(sock) => sock,
            Err(e) => {
                eprintln!("forkbox-init: {e}");
                std::process::exit(1);
            }
        },
    };
    let confinement = match confinement(inherited) {
        Ok(c) => c,
        Err(e) => {
            // Nothing can run without it: say why, then die (the server
            // rebuilds the sandbox on the next call).
            eprintln!("forkbox-init: {e}");
            std::process::exit(1);
        }
    };
    // Before any command: they all inherit the filter, whose listener the
    // shim serves (a member's way out starts on its first network socket).
    // A solo member has no gate: its way out starts at create.
    let gated = match shape {
        Shape::Pooled => install_socket_gate(&sock),
        Shape::Solo => sys::set_no_new_privs().map_err(|e| format!("no_new_privs: {e}")),
    };
    if let Err(e) = gated {
        eprintln!("forkbox-init: {e}");
        std::process::exit(1);
    }
    serve(sock, &confinement, HashMap::new())
}

/// The confinement, with the seccomp programs the shim compiled when it
/// left them (`sealed_policy`), compiled here otherwise.
fn confinement(inherited: Option<Result<crate::policy::SeccompPolicy, sealed_policy::SealedPolicyError>>) -> Result<Confinement, crate::policy::PolicyError> {
    match inherited {
        Some(Ok(seccomp)) => Confinement::with_seccomp(seccomp),
        Some(Err(e)) => {
            eprintln!("forkbox-init: the shim's compiled policy is unusable ({e}); compiling it here");
            Confinement::load()
        }
        None => Confinement::load(),
    }
}

/// A renewed solo init (see `renew`): its channel and sandbox are set up,
/// its no_new_privs kept across the exec.
fn serve_renewed(sock: OwnedFd, running: HashMap<i32, u64>) -> ! {
    let confinement = match Confinement::load() {
        Ok(c) => c,
        Err(e) => {
            let _ = channel::send(sock.as_fd(), &InitMessage::SetupFailed { error: e.to_string() }, &[]);
            std::process::exit(1);
        }
    };
    if channel::send(sock.as_fd(), &InitMessage::Renewed, &[]).is_err() {
        std::process::exit(1);
    }
    serve(sock, &confinement, running)
}

/// Move to a channel made here, in the member's network namespace, and
/// hand its other end to the shim (`InitMessage::Channel`): criu finds a
/// unix socket only in the namespaces of the tree it dumps, and the first
/// channel was made in the host's.
fn own_channel(first: OwnedFd) -> Result<OwnedFd, String> {
    let (ours, theirs) = channel::pair().map_err(|e| format!("socketpair: {e}"))?;
    channel::send(first.as_fd(), &InitMessage::Channel, &[theirs.as_raw_fd()]).map_err(|e| format!("hand over the channel: {e}"))?;
    drop(first);
    sys::dup_to(ours.as_raw_fd(), 3).map_err(|e| format!("dup the channel: {e}"))?;
    drop(ours);
    // SAFETY: the channel was just placed on fd 3.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(3) })
}

/// Install `notify::socket_filter` on init itself (so on every command it
/// forks) and hand its listener to the shim. no_new_privs first: commands
/// set it anyway, and init execs nothing else.
fn install_socket_gate(sock: &OwnedFd) -> Result<(), String> {
    sys::set_no_new_privs().map_err(|e| format!("no_new_privs: {e}"))?;
    let listener = crate::notify::install_with_listener(&crate::notify::socket_filter()).map_err(|e| format!("seccomp listener: {e}"))?;
    channel::send(sock.as_fd(), &InitMessage::Listener, &[listener.as_raw_fd()]).map_err(|e| format!("hand over the seccomp listener: {e}"))
}

/// What a member's init sets up before it has a root: itself, the name and
/// the network of its namespaces.
fn prepare(hostname: &str) -> Result<(), String> {
    sys::set_not_dumpable().map_err(|e| format!("dumpable: {e}"))?;
    sethostname(hostname).map_err(|e| format!("sethostname: {e}"))?;
    sys::loopback_up().map_err(|e| format!("loopback: {e}"))
}

/// Make `root` (an overlay mounted in this mount namespace) the sandbox's
/// root: /proc, /dev, /sys and masks inside it, then pivot_root.
/// `init_binary`: bind it read-only at [`SOLO_INIT_PATH`] (a solo member).
fn enter_root(root: &Path, init_binary: Option<&Path>) -> Result<(), String> {
    let none: Option<&str> = None;
    mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none).map_err(|e| format!("make / private: {e}"))?;
    // The overlay came from the shim's more privileged mount namespace, so it
    // is locked here and pivot_root refuses it; a bind of it made here is not.
    mount(Some(root), root, none, MsFlags::MS_BIND | MsFlags::MS_REC, none).map_err(|e| format!("bind root: {e}"))?;
    let nosuid = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let at = |p: &str| root.join(p.trim_start_matches('/'));
    ensure_dir(&at("proc"))?;
    mount(Some("proc"), &at("proc"), Some("proc"), nosuid, none).map_err(|e| format!("mount proc: {e}"))?;
    // /dev: a small tmpfs with the host's harmless device nodes bound in.
    let dev = at("dev");
    ensure_dir(&dev)?;
    mount(Some("tmpfs"), &dev, Some("tmpfs"), MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC, Some("mode=755,size=1024k")).map_err(|e| format!("mount /dev: {e}"))?;
    for name in DEVICES {
        let target = dev.join(name);
        fs::write(&target, b"").map_err(|e| format!("create /dev/{name}: {e}"))?;
        mount(Some(Path::new("/dev").join(name).as_path()), &target, none, MsFlags::MS_BIND, none).map_err(|e| format!("bind /dev/{name}: {e}"))?;
    }
    ensure_dir(&dev.join("pts"))?;
    mount(Some("devpts"), &dev.join("pts"), Some("devpts"), MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC, Some("newinstance,ptmxmode=0666,mode=0620,gid=5"))
        .map_err(|e| format!("mount devpts: {e}"))?;
    ensure_dir(&dev.join("shm"))?;
    mount(Some("shm"), &dev.join("shm"), Some("tmpfs"), nosuid, Some("mode=1777")).map_err(|e| format!("mount /dev/shm: {e}"))?;
    ensure_dir(&dev.join("mqueue"))?;
    let _ = mount(Some("mqueue"), &dev.join("mqueue"), Some("mqueue"), nosuid, none);
    for (link, to) in
        [("ptmx", "pts/ptmx"), ("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")]
    {
        symlink(to, dev.join(link)).map_err(|e| format!("symlink /dev/{link}: {e}"))?;
    }
    if let Some(binary) = init_binary {
        bind_read_only(binary, &at(SOLO_INIT_PATH))?;
    }
    ensure_dir(&at("sys"))?;
    // Read-only sysfs, as container runtimes give; optional where refused.
    let _ = mount(Some("sysfs"), &at("sys"), Some("sysfs"), nosuid | MsFlags::MS_RDONLY, none);
    for file in MASKED_FILES {
        let target = at(file);
        if target.exists() {
            let _ = mount(Some("/dev/null"), &target, none, MsFlags::MS_BIND, none);
        }
    }
    for dir in MASKED_DIRS {
        let target = at(dir);
        if target.is_dir() {
            let _ = mount(Some("tmpfs"), &target, Some("tmpfs"), nosuid | MsFlags::MS_RDONLY, Some("size=0"));
        }
    }
    // Leaf pids stay below LEAF_PID_MAX; REPLs get family pids above it, so
    // the REPL's own pid never names another process in the sandbox's /proc.
    // (pid_max is per pid namespace from Linux 6.14; older kernels keep the
    // global one and lose only this guarantee.)
    let _ = fs::write(at("proc/sys/kernel/pid_max"), crate::shim::LEAF_PID_MAX.to_string());
    ensure_dir(&at("tmp"))?;
    chdir(root).map_err(|e| format!("chdir root: {e}"))?;
    pivot_root(".", ".").map_err(|e| format!("pivot_root: {e}"))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(|e| format!("detach old root: {e}"))?;
    chdir("/").map_err(|e| format!("chdir /: {e}"))?;
    Ok(())
}

/// Bind the file `from` at `to` (created), then make the bind read-only:
/// a bind takes its flags only from the remount that follows it.
fn bind_read_only(from: &Path, to: &Path) -> Result<(), String> {
    let none: Option<&str> = None;
    fs::write(to, b"").map_err(|e| format!("create {}: {e}", to.display()))?;
    mount(Some(from), to, none, MsFlags::MS_BIND, none).map_err(|e| format!("bind {}: {e}", from.display()))?;
    let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    mount(none, to, none, flags, none).map_err(|e| format!("make {} read-only: {e}", to.display()))
}

fn ensure_dir(p: &Path) -> Result<(), String> {
    fs::create_dir_all(p).map_err(|e| format!("mkdir {}: {e}", p.display()))
}

/// Serve the shim's requests and reap children until the shim goes away.
fn serve(sock: OwnedFd, confinement: &Confinement, mut running: HashMap<i32, u64>) -> ! {
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    let _ = mask.thread_block();
    let sigfd = match SignalFd::new(&mask) {
        Ok(fd) => fd,
        Err(_) => std::process::exit(1),
    };
    loop {
        let (sock_ready, sig_ready) = {
            let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLIN), PollFd::new(sigfd.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => (fds[0].any().unwrap_or(false), fds[1].any().unwrap_or(false)),
                Err(nix::errno::Errno::EINTR) => (false, false),
                Err(_) => std::process::exit(1),
            }
        };
        if sig_ready {
            let _ = sigfd.read_signal();
            reap(&sock, &mut running);
        }
        if sock_ready {
            match channel::recv::<InitRequest>(sock.as_fd()) {
                Ok(Some(req)) => handle(&sock, req.msg, req.fds, confinement, &mut running),
                // The shim is gone: so is this sandbox.
                _ => std::process::exit(0),
            }
        }
    }
}

fn reap(sock: &OwnedFd, running: &mut HashMap<i32, u64>) {
    loop {
        let status = match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) => (pid, ExitStatus::Code(code)),
            Ok(WaitStatus::Signaled(pid, sig, _)) => (pid, ExitStatus::Signal(sig as i32)),
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(_) => continue,
        };
        if let Some(id) = running.remove(&status.0.as_raw()) {
            let _ = channel::send(sock.as_fd(), &InitMessage::Exited { id, status: status.1 }, &[]);
        }
    }
}

fn handle(sock: &OwnedFd, req: InitRequest, fds: Vec<OwnedFd>, confinement: &Confinement, running: &mut HashMap<i32, u64>) {
    match req {
        InitRequest::Spawn { id, argv, env, cwd, tty, run_as } => {
            if fds.len() != 3 {
                let _ = channel::send(sock.as_fd(), &InitMessage::SpawnFailed { id, error: "spawn needs 3 descriptors".into() }, &[]);
                return;
            }
            spawn(sock, id, running, false, || {
                for (i, fd) in fds.iter().enumerate() {
                    let _ = sys::dup_to(fd.as_raw_fd(), i as i32);
                }
                // A new session leader takes its terminal as controlling tty,
                // so ^C, job control and SIGWINCH reach it.
                if tty {
                    // SAFETY: ioctl on fd 0 with an integer argument.
                    unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0) };
                }
                sys::close_fds_from(3);
                run_in(&cwd, || confinement.exec_as(run_as, &argv, &env))
            });
        }
        InitRequest::SpawnRepl { id, argv, env, cwd } => {
            if fds.len() != 4 {
                let _ = channel::send(sock.as_fd(), &InitMessage::SpawnFailed { id, error: "a REPL needs 4 descriptors".into() }, &[]);
                return;
            }
            spawn(sock, id, running, true, || {
                // docs/repl-protocol.md: 0 /dev/null, 1/2 output, 3 control, 4 source.
                let Ok(null) = fs::File::open("/dev/null") else { return "open /dev/null".to_string() };
                let sources = [null.as_raw_fd(), fds[0].as_raw_fd(), fds[1].as_raw_fd(), fds[2].as_raw_fd(), fds[3].as_raw_fd()];
                let _ = sys::place_fds(&sources, 0);
                sys::close_fds_from(5);
                // A member's confinement: alone in its pid namespace, the
                // REPL has no other namespace to switch to.
                run_in(&cwd, || confinement.exec_as(RunAs::ROOT, &argv, &env))
            });
        }
        InitRequest::Renew => {
            if let [new] = fds.as_slice() {
                if channel::send(sock.as_fd(), &InitMessage::ChannelMoved, &[]).is_ok() && sys::dup_to(new.as_raw_fd(), sock.as_raw_fd()).is_ok() {
                    let error = renew(running);
                    let _ = channel::send(sock.as_fd(), &InitMessage::SetupFailed { error }, &[]);
                }
            }
        }
        InitRequest::Root { root } => {
            let msg = match enter_root(&root, None) {
                Ok(()) => InitMessage::Rooted,
                Err(error) => InitMessage::SetupFailed { error },
            };
            let _ = channel::send(sock.as_fd(), &msg, &[]);
        }
        InitRequest::Signal { id, signal } => {
            if let Some((pid, _)) = running.iter().find(|(_, v)| **v == id) {
                signal_session(*pid, signal);
            }
        }
    }
}

/// Fork a child that leads its own session and runs `exec` (which returns
/// only an error) once the shim has heard it started: a process whose
/// start was never reported must not have run (the server may retry it).
/// `repl`: report it as `ReplStarted`, with its pid.
fn spawn(sock: &OwnedFd, id: u64, running: &mut HashMap<i32, u64>, repl: bool, exec: impl FnOnce() -> String) {
    let (go_r, go_w) = match nix::unistd::pipe() {
        Ok(p) => p,
        Err(e) => {
            let _ = channel::send(sock.as_fd(), &InitMessage::SpawnFailed { id, error: format!("pipe: {e}") }, &[]);
            return;
        }
    };
    // SAFETY: init is single-threaded.
    match unsafe { sys::fork_with(0) } {
        Ok(Forked::Child) => {
            drop(go_w);
            let mut b = [0u8; 1];
            if !matches!(nix::unistd::read(go_r.as_fd(), &mut b), Ok(1)) {
                // SAFETY: leaving a forked child that must not run.
                unsafe { libc::_exit(127) }
            }
            drop(go_r);
            let _ = nix::unistd::setsid();
            // Init is exempt from the OOM killer; its children are not.
            let _ = fs::write("/proc/self/oom_score_adj", "0");
            let err = exec();
            let msg = format!("forkbox: {err}\n");
            // SAFETY: writing a buffer to stderr, then leaving the forked child.
            unsafe {
                libc::write(2, msg.as_ptr().cast(), msg.len());
                libc::_exit(127)
            }
        }
        Ok(Forked::Parent(pid)) => {
            drop(go_r);
            running.insert(pid.as_raw(), id);
            let started = if repl { InitMessage::ReplStarted { id, pid: pid.as_raw() } } else { InitMessage::Started { id } };
            if channel::send(sock.as_fd(), &started, &[]).is_ok() {
                let _ = nix::unistd::write(go_w.as_fd(), b"g");
            }
        }
        Err(e) => {
            let _ = channel::send(sock.as_fd(), &InitMessage::SpawnFailed { id, error: format!("fork: {e}") }, &[]);
        }
    }
}

/// Run `exec` in `cwd` (or `/` where `cwd` is missing).
fn run_in(cwd: &str, exec: impl FnOnce() -> String) -> String {
    if chdir(cwd).is_err() {
        let _ = chdir("/");
    }
    exec()
}

/// Signal every process of the session `sid` leads (each command leads its
/// own): its process group, and groups job control made inside it.
fn signal_session(sid: i32, signal: i32) {
    // The leader itself first: just forked, it may not have called setsid
    // yet, and then neither its group nor its session exists (a kill right
    // after a PTY's create was lost that way). It is our unreaped child, so
    // the pid cannot have been reused.
    // SAFETY: plain kill(2).
    unsafe { libc::kill(sid, signal) };
    // SAFETY: plain kill(2) on a negative pid (the process group).
    unsafe { libc::kill(-sid, signal) };
    let Ok(dir) = fs::read_dir("/proc") else { return };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // Fields after the command's closing parenthesis: state ppid pgrp session.
        let session = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(3)).and_then(|s| s.parse::<i32>().ok());
        if session == Some(sid) {
            // SAFETY: plain kill(2).
            unsafe { libc::kill(pid, signal) };
        }
    }
}
