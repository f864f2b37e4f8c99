//! The engine's public face: `Jail` creates, forks and destroys sandboxes.
//! A sandbox is a member of a family (docs/architecture.md#processes-and-namespaces): a create starts a new
//! family with its own shim; a fork adds members to the parent's family.
//! Each member has its own cgroup and subvolume on the copy-on-write volume.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::cgroup::{Cgroups, Limits};
use crate::error::{Error, Result};
use crate::ids::IdAllocator;
use crate::shim::messages::*;
use crate::supervisor::ShimHandle;
use crate::volume::Volume;

mod adopt;
mod create;
mod destroy;
mod dump;
mod dump_lock;
mod fork;
mod quiet;
mod restore;
mod sandbox;
mod tree_creds;
pub use adopt::{Adopted, Kept, MemberRecord};
pub use dump::AfterDump;
pub use fork::{ForkChild, Rooting};
pub use sandbox::Sandbox;

/// Settings of the engine.
#[derive(Debug, Clone)]
pub struct JailConfig {
    pub state_dir: PathBuf,
    /// The binary that runs `__shim` (normally the server's own executable).
    pub shim_exe: PathBuf,
    /// How big the volume's image starts and how far it grows.
    pub volume: crate::volume::VolumeSize,
    /// How long a family outlives a server that died (or exited for an
    /// upgrade) waiting for the next one to adopt it; zero: not at all.
    pub orphan_grace: Duration,
}

impl JailConfig {
    /// An engine whose volume grows to at most `volume_gib`.
    pub fn new(state_dir: PathBuf, shim_exe: PathBuf, volume_gib: u64) -> JailConfig {
        JailConfig { state_dir, shim_exe, volume: crate::volume::VolumeSize::up_to_gib(volume_gib), orphan_grace: Duration::ZERO }
    }
}

/// What a new sandbox is made of.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    pub id: String,
    /// The template's files as one directory on the host: what `layers`
    /// gives `diff`, and the lowest layer unless `template_layers` says more.
    pub template_rootfs: PathBuf,
    /// The overlay's lower layers, top first, when the template is a stack
    /// (its last entry is then the built-in root filesystem under it).
    /// Each is id-mapped on its own: overlayfs cannot be id-mapped whole.
    pub template_layers: Vec<PathBuf>,
    /// The host's CAs, over the template (`trust::TrustStore::layer_for`).
    pub trust_layer: Option<PathBuf>,
    pub limits: Limits,
    /// Files to start with instead of an empty upper layer: a layer saved
    /// by `Sandbox::export_upper` (a Space), owners relative to the range.
    pub initial_upper: Option<PathBuf>,
    /// A family of one that criu can dump whole (`ShimConfig::solo`): it
    /// cannot fork, and its way out starts at create.
    pub solo: bool,
}

pub struct Jail {
    config: JailConfig,
    volume: Volume,
    cgroups: Cgroups,
    /// Starts the families' supervisors, in their cgroup.
    launcher: crate::supervisor::ShimLauncher,
    ids: StdMutex<IdAllocator>,
    /// Names of the hollow spares the families keep (for `spare_ids`).
    hollow_ids: StdMutex<std::collections::HashSet<String>>,
    /// Held (shared) by every refill in flight; `stop_refills` takes it
    /// exclusively so none is cut off half-way at shutdown.
    refills: tokio::sync::RwLock<bool>,
    /// Set when the server exits leaving its sandboxes for the next one:
    /// the volume stays mounted.
    left_running: std::sync::atomic::AtomicBool,
    _lock: std::fs::File,
}

/// A short name for the instance owning `state_dir`, stable across runs
/// and releases (FNV-1a of the canonical path), so a restarted server finds
/// the cgroups its crashed predecessor left.
fn instance_name(state_dir: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let path = state_dir.canonicalize().unwrap_or_else(|_| state_dir.to_path_buf());
    let hash = path.as_os_str().as_bytes().iter().fold(0x811c_9dc5u32, |h, b| (h ^ *b as u32).wrapping_mul(0x0100_0193));
    format!("{hash:08x}")
}

/// Hold an exclusive lock on the state directory for the engine's life: two
/// servers on one state directory would destroy each other's sandboxes.
fn lock_state_dir(state_dir: &Path) -> Result<std::fs::File> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(state_dir.join("server.lock"))
        .map_err(|e| Error::io("open state lock", e))?;
    if !crate::sys::try_lock_exclusive(&file) {
        return Err(Error::Invalid(format!("another forkbox server is using {}", state_dir.display())));
    }
    Ok(file)
}

/// The server's end of a running REPL process.
pub struct ReplProcess {
    pub control: tokio::net::UnixStream,
    pub stdout: tokio::net::unix::pipe::Receiver,
    pub stderr: tokio::net::unix::pipe::Receiver,
    pub pidfd: OwnedFd,
    pub host_pid: i32,
    /// Resolves with the REPL's exit status when it dies.
    pub exited: oneshot::Receiver<ExitStatus>,
}

/// A command running in a sandbox (bash), its output on pipes.
pub struct CommandProcess {
    /// Its stdin, when it was started with one (`Sandbox::spawn_piped`).
    pub stdin: Option<tokio::net::unix::pipe::Sender>,
    pub stdout: tokio::net::unix::pipe::Receiver,
    pub stderr: tokio::net::unix::pipe::Receiver,
    pub exited: oneshot::Receiver<ExitStatus>,
    /// Resolves once init has forked the command. If `exited` fails while
    /// this never resolved, the command never ran and may be retried.
    pub started: oneshot::Receiver<()>,
    pub control: CommandControl,
}

/// A command running on a terminal in the sandbox (a PTY session).
pub struct TerminalProcess {
    /// The terminal's master side (non-blocking): read output, write input,
    /// resize with `TIOCSWINSZ`.
    pub master: OwnedFd,
    pub exited: oneshot::Receiver<ExitStatus>,
    pub control: CommandControl,
}

/// Signals for a running command.
#[derive(Clone)]
pub struct CommandControl {
    shim: Arc<ShimHandle>,
    member: String,
    id: u64,
}

impl CommandControl {
    /// Send `signal` to the command and every process of its session.
    pub async fn signal(&self, signal: i32) {
        let req = Request::SignalCommand { member: self.member.clone(), id: self.id, signal };
        let _ = self.shim.call(req, &[]).await;
    }

    /// SIGKILL the command and everything it started in its session.
    pub async fn kill(&self) {
        self.signal(libc::SIGKILL).await;
    }
}

impl CommandProcess {
    pub async fn kill(&self) {
        self.control.kill().await;
    }
}

/// What a launched command is waiting on.
struct Launched {
    exited: oneshot::Receiver<ExitStatus>,
    started: oneshot::Receiver<()>,
    control: CommandControl,
}

/// A family as the server sees it: its shim, shared by every member.
struct FamilyHandle {
    /// The family's supervisor; replaced if it dies (see `Sandbox::rebuild`).
    shim: StdMutex<Arc<ShimHandle>>,
    launcher: crate::supervisor::ShimLauncher,
    config: ShimConfig,
    /// Live members (hollow spares included); the shim stops with the last one.
    members: std::sync::atomic::AtomicUsize,
    /// Hollow members kept for the family's next fork (`fork_members`).
    hollows: tokio::sync::Mutex<Vec<ForkChild>>,
    /// Serialises restarts of a dead shim among the members that notice.
    restart: tokio::sync::Mutex<()>,
}

impl FamilyHandle {
    fn shim(&self) -> Arc<ShimHandle> {
        Arc::clone(&self.shim.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

const SANDBOXES_DIR: &str = "sandboxes";
const DESTROY_DEADLINE: Duration = Duration::from_secs(10);
/// How long a destroy waits in all for killed processes to die
/// (`kill_patiently`).
const KILL_PATIENCE: Duration = Duration::from_secs(300);

/// SIGKILL every process of a sandbox's cgroup and wait until it is
/// empty. Killed processes can take longer than `DESTROY_DEADLINE` to die
/// when the whole machine stalls (bench/load.py, 2026-12-07: 17 s in which
/// the server answered almost nothing); a destroy that gave up then left
/// the member, its cgroup and its files behind for good. So it warns and
/// waits on, up to `KILL_PATIENCE` in all. Every path that kills a
/// sandbox's processes (destroy, rebuild, a failed create, a
/// predecessor's leftovers) goes through here. Blocking.
fn kill_patiently(cgroup: &crate::cgroup::Cgroup, sandbox: &str) -> Result<()> {
    let started = std::time::Instant::now();
    loop {
        match cgroup.kill_all(DESTROY_DEADLINE) {
            Err(e) if started.elapsed() < KILL_PATIENCE => {
                tracing::warn!(sandbox, err = %e, waited_s = started.elapsed().as_secs(), "killed processes are slow to die; waiting on");
            }
            done => return done,
        }
    }
}

/// `kill_patiently` on the blocking pool: it sleeps while it waits.
async fn kill_patiently_off_runtime(cgroup: &crate::cgroup::Cgroup, sandbox: &str) -> Result<()> {
    let (cgroup, sandbox) = (cgroup.clone(), sandbox.to_string());
    tokio::task::spawn_blocking(move || kill_patiently(&cgroup, &sandbox)).await.map_err(|e| Error::Thread(format!("join: {e}")))?
}

impl Jail {
    /// Open the engine: mount the volume, prepare cgroups, and clean up
    /// whatever a crashed predecessor left behind.
    pub fn open(config: JailConfig) -> Result<Jail> {
        crate::tools::require_tool("mount", "mount")?;
        std::fs::create_dir_all(&config.state_dir).map_err(|e| Error::io("create state dir", e))?;
        let lock = lock_state_dir(&config.state_dir)?;
        let volume = Volume::open(&config.state_dir, config.volume)?;
        let cgroups = Cgroups::detect(&instance_name(&config.state_dir))?;
        let group = cgroups.supervisors().map_err(|e| tracing::warn!(err = %e, "families' supervisors run at an ordinary CPU weight")).ok();
        let launcher = crate::supervisor::ShimLauncher { exe: config.shim_exe.clone(), group };
        // The slot our predecessor used, so the families it left are ours.
        let slot_file = config.state_dir.join("id-slot");
        let preferred = std::fs::read_to_string(&slot_file).ok().and_then(|s| s.trim().parse().ok());
        let ids = IdAllocator::claim_preferring(Path::new(crate::ids::SLOT_LOCK_DIR), preferred)?;
        std::fs::write(&slot_file, ids.slot().to_string()).map_err(|e| Error::io("record the id slot", e))?;
        let jail = Jail {
            config,
            volume,
            cgroups,
            launcher,
            ids: StdMutex::new(ids),
            hollow_ids: Default::default(),
            refills: tokio::sync::RwLock::new(true),
            left_running: Default::default(),
            _lock: lock,
        };
        Ok(jail)
    }

    /// `open`, then clean up everything a predecessor left (nothing is
    /// adopted, so a volume image over the cap is made anew).
    pub fn open_clean(config: JailConfig) -> Result<Jail> {
        crate::volume::Volume::discard_larger(&config.state_dir, config.volume.max_bytes)?;
        let jail = Self::open(config)?;
        jail.kill_stale_pastas();
        jail.clean_stale(&Default::default())?;
        Ok(jail)
    }

    pub fn volume_root(&self) -> &Path {
        self.volume.root()
    }

    /// The volume's size and room (blocking: a few `statvfs`).
    pub fn volume_usage(&self) -> Result<crate::volume::Usage> {
        self.volume.usage()
    }

    /// Grow the volume by a step now, if one fits (blocking).
    pub fn grow_volume(&self) -> bool {
        self.volume.grow_now()
    }

    pub fn cgroup_version(&self) -> crate::cgroup::Version {
        self.cgroups.version()
    }

    fn run_dir(&self, id: &str) -> PathBuf {
        self.config.state_dir.join("run").join(id)
    }

    /// The server exits leaving its sandboxes running (for the next server
    /// to adopt): keep the volume mounted and the cgroups in place.
    pub fn leave_running(&self) {
        self.left_running.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn is_left_running(&self) -> bool {
        self.left_running.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Unmount the volume and remove this server's parent cgroups (at
    /// server shutdown, after every sandbox is gone).
    pub fn close(&self) -> Result<()> {
        if self.is_left_running() {
            return Ok(());
        }
        self.cgroups.remove_parent();
        self.volume.close()
    }
}

impl Drop for Jail {
    /// An engine that goes away unmounts its volume (lazily: sandboxes still
    /// running keep their files) and removes its empty cgroup parents.
    fn drop(&mut self) {
        let _ = self.close();
    }
}
