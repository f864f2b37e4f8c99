//! The engine's public face: `Jail` creates, forks and destroys sandboxes.
//! A sandbox is a member of a family (docs/architecture.md#processes-and-namespaces): a create starts a new
//! family with its own shim; a fork adds members to the parent's family.
//! Each member has its own cgroup and subvolume on the copy-on-write volume.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::cgroup::{Cgroup, Cgroups, Limits};
use crate::error::{Error, Result};
use crate::ids::IdAllocator;
use crate::shim::messages::*;
use crate::supervisor::ShimHandle;
use crate::volume::Volume;

mod adopt;
pub use adopt::{Adopted, Kept, MemberRecord};

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
}

pub struct Jail {
    config: JailConfig,
    volume: Volume,
    cgroups: Cgroups,
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
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
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
    shim_exe: PathBuf,
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

/// One sandbox as the engine sees it.
pub struct Sandbox {
    /// The member's name in its family (the id it was created with; it
    /// stays the same when the server re-keys it after a merge).
    pub id: String,
    family: Arc<FamilyHandle>,
    template_rootfs: PathBuf,
    limits: StdMutex<Limits>,
    cgroup: Cgroup,
    subvolume: PathBuf,
    volume: Volume,
    next_command: std::sync::atomic::AtomicU64,
    /// A pidfd of the member's init; readable once init has exited.
    init_pidfd: StdMutex<Option<OwnedFd>>,
    /// Set once this member stopped counting towards its family.
    released: std::sync::atomic::AtomicBool,
    /// Paused by request (`pause`); held while the freezer is changed, so a
    /// fork's own brief freeze never thaws a paused sandbox.
    paused: Arc<StdMutex<bool>>,
    /// Mirror of `paused` readable without waiting for a fork's freeze.
    paused_now: std::sync::atomic::AtomicBool,
}

fn create_member_request(id: &str, cgroup: &Cgroup, subvolume: &Path) -> Request {
    Request::CreateMember {
        member: id.to_string(),
        hostname: id.to_string(),
        upper: Some(subvolume.join("upper")),
        work: Some(subvolume.join("work")),
        cgroup_procs: cgroup.join_files(),
    }
}

/// A member without a root yet (a fork's spare; see `Jail::fork_members`).
fn hollow_member_request(id: &str, cgroup: &Cgroup) -> Request {
    Request::CreateMember { member: id.to_string(), hostname: id.to_string(), upper: None, work: None, cgroup_procs: cgroup.join_files() }
}

const SANDBOXES_DIR: &str = "sandboxes";
const DESTROY_DEADLINE: Duration = Duration::from_secs(10);

impl Jail {
    /// Open the engine: mount the volume, prepare cgroups, and clean up
    /// whatever a crashed predecessor left behind.
    pub fn open(config: JailConfig) -> Result<Jail> {
        crate::tools::require_tool("mount", "mount")?;
        std::fs::create_dir_all(&config.state_dir).map_err(|e| Error::io("create state dir", e))?;
        let lock = lock_state_dir(&config.state_dir)?;
        let volume = Volume::open(&config.state_dir, config.volume)?;
        let cgroups = Cgroups::detect(&instance_name(&config.state_dir))?;
        // The slot our predecessor used, so the families it left are ours.
        let slot_file = config.state_dir.join("id-slot");
        let preferred = std::fs::read_to_string(&slot_file).ok().and_then(|s| s.trim().parse().ok());
        let ids = IdAllocator::claim_preferring(Path::new(crate::ids::SLOT_LOCK_DIR), preferred)?;
        std::fs::write(&slot_file, ids.slot().to_string()).map_err(|e| Error::io("record the id slot", e))?;
        let jail = Jail {
            config,
            volume,
            cgroups,
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

    /// End the families, and kill the sandbox processes, remove the cgroups,
    /// subvolumes and run directories a predecessor left, but for the
    /// `kept` members and families (adopted). Called at start, after
    /// adoption and before anything is created.
    pub fn clean_stale(&self, kept: &Kept) -> Result<()> {
        let run = self.config.state_dir.join("run");
        if let Ok(entries) = std::fs::read_dir(&run) {
            for e in entries.flatten() {
                let family = e.file_name().to_string_lossy().into_owned();
                if !kept.families.contains(&family) {
                    end_orphan(&e.path());
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        kill_stray_shims(&run, kept);
        for name in self.cgroups.existing() {
            if kept.members.contains(&name) {
                continue;
            }
            let cg = self.cgroups.open(&name);
            cg.kill_all(DESTROY_DEADLINE)?;
            cg.remove()?;
            tracing::info!(sandbox = %name, "removed a stale sandbox cgroup");
        }
        let dir = self.volume.root().join(SANDBOXES_DIR);
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                let path = e.path();
                if kept.members.contains(&*e.file_name().to_string_lossy()) {
                    continue;
                }
                if let Err(err) = self.volume.delete_subvolume(&path) {
                    tracing::warn!(path = %path.display(), %err, "could not delete a stale sandbox volume");
                }
            }
        }
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("create sandboxes dir", e))?;
        self.sweep_quota_groups();
        Ok(())
    }

    /// Remove the quota groups left by subvolumes that are gone, once
    /// nothing is charged to them (see `Volume::sweep_quota_groups`; the
    /// server calls this now and then). Blocking.
    pub fn sweep_quota_groups(&self) {
        let removed = self.volume.sweep_quota_groups();
        if removed > 0 {
            tracing::debug!(removed, "removed the quota groups of deleted subvolumes");
        }
    }

    /// Kill every pasta a predecessor started (the adopted sandboxes get
    /// new ones: a pasta's parent was the server that died).
    pub fn kill_stale_pastas(&self) {
        crate::net::kill_stale(&self.config.state_dir.join("run"));
    }

    /// Create a sandbox: subvolume, cgroup, family shim, member.
    pub async fn create(&self, spec: SandboxSpec) -> Result<Sandbox> {
        let range = self.ids.lock().map_err(|_| Error::Shim("id allocator poisoned".into()))?.allocate()?;
        let release = |ids: &StdMutex<IdAllocator>| {
            if let Ok(mut ids) = ids.lock() {
                ids.release(range);
            }
        };
        let subvolume = self.volume.root().join(SANDBOXES_DIR).join(&spec.id);
        if let Err(e) = self.make_layers(&subvolume, &spec.template_rootfs, range, spec.initial_upper.as_deref(), spec.limits.disk_bytes) {
            let _ = self.volume.delete_subvolume(&subvolume);
            release(&self.ids);
            return Err(e);
        }
        let cgroup = match self.cgroups.create(&spec.id, &spec.limits) {
            Ok(c) => c,
            Err(e) => {
                let _ = self.volume.delete_subvolume(&subvolume);
                release(&self.ids);
                return Err(e);
            }
        };
        let made = self.create_member(&spec, &cgroup, &subvolume, range).await;
        match made {
            Ok((shim, init_pidfd, config)) => {
                let family = Arc::new(FamilyHandle {
                    shim: StdMutex::new(shim),
                    shim_exe: self.config.shim_exe.clone(),
                    config,
                    members: std::sync::atomic::AtomicUsize::new(1),
                    hollows: tokio::sync::Mutex::new(Vec::new()),
                    restart: tokio::sync::Mutex::new(()),
                });
                Ok(Sandbox::new(spec.id, family, spec.template_rootfs, spec.limits, cgroup, subvolume, self.volume.clone(), init_pidfd))
            }
            Err(e) => {
                let _ = cgroup.kill_all(DESTROY_DEADLINE);
                let _ = cgroup.remove();
                let _ = self.volume.delete_subvolume(&subvolume);
                let _ = std::fs::remove_dir_all(self.run_dir(&spec.id));
                release(&self.ids);
                Err(e)
            }
        }
    }

    /// Make `ids.len()` new members of `parent`'s family whose files are a
    /// snapshot of the parent's, taken while the parent is frozen. Their
    /// REPLs come from the parent's REPL forking itself into their
    /// namespaces (see `ForkChild`); until then they have none.
    ///
    /// Members come from the family's *hollow* spares (namespaces and init
    /// built ahead of time, see `refill_hollows`) where there are some, else
    /// are built hollow now (names from `ids`); each then gets its root: a
    /// snapshot of the parent's layer, mounted in its own mount namespace.
    pub async fn fork_members(&self, parent: &Sandbox, ids: &[String]) -> Result<Vec<ForkChild>> {
        let n = ids.len();
        let mut children: Vec<ForkChild> = {
            let mut spares = parent.family.hollows.lock().await;
            let k = n.min(spares.len());
            spares.drain(..k).collect()
        };
        self.forget_hollows(&children);
        if children.len() < n {
            let more = self.hollow_members(parent, &ids[..n - children.len()], &parent.limits()).await;
            match more {
                Ok(more) => children.extend(more),
                Err(e) => {
                    self.destroy_children(&children).await;
                    return Err(e);
                }
            }
        }
        match self.root_children(parent, &children).await {
            Ok(()) => Ok(children),
            Err(e) => {
                self.destroy_children(&children).await;
                Err(e)
            }
        }
    }

    async fn destroy_children(&self, children: &[ForkChild]) {
        for child in children {
            let _ = Box::pin(self.destroy(&child.sandbox)).await;
        }
    }

    /// Snapshot the parent's layer (frozen) into each child's subvolume and
    /// have the shim attach it as each child's root.
    async fn root_children(&self, parent: &Sandbox, children: &[ForkChild]) -> Result<()> {
        // A hollow child has no subvolume yet: its disk limit comes with
        // its snapshot.
        let limits = parent.limits();
        for c in children {
            if c.sandbox.limits() != limits {
                c.sandbox.set_limits(&limits)?;
            }
        }
        // The parent is frozen only while its files are snapshotted (and
        // stays so if it was paused).
        let frozen = parent.cgroup.clone();
        let paused = Arc::clone(&parent.paused);
        let dsts: Vec<PathBuf> = children.iter().map(|c| c.sandbox.subvolume.clone()).collect();
        let (volume, src) = (self.volume.clone(), parent.subvolume.clone());
        tokio::task::spawn_blocking(move || -> Result<()> {
            let paused = paused.lock().unwrap_or_else(|e| e.into_inner());
            frozen.freeze()?;
            // In parallel: concurrent snapshots share btrfs transaction commits.
            let results: Vec<Result<()>> = std::thread::scope(|scope| {
                let jobs: Vec<_> = dsts.iter().map(|dst| scope.spawn(|| volume.snapshot(&src, dst, limits.disk_bytes))).collect();
                jobs.into_iter().map(|j| j.join().unwrap_or_else(|_| Err(Error::Shim("snapshot thread panicked".into())))).collect()
            });
            if !*paused {
                frozen.thaw()?;
            }
            results.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
        })
        .await
        .map_err(|e| Error::Shim(format!("join: {e}")))??;
        let shim = parent.shim();
        let roots = children.iter().map(|c| {
            let sub = &c.sandbox.subvolume;
            let req = Request::RootMember { member: c.sandbox.id.clone(), upper: sub.join("upper"), work: sub.join("work") };
            shim.call(req, &[])
        });
        for r in futures::future::join_all(roots).await {
            r?;
        }
        Ok(())
    }

    /// Keep `target` hollow spares in `member`'s family, so its
    /// next fork only snapshots and attaches (called after a fork, in the
    /// background). Spares made for a family that has no other member left
    /// are destroyed at once.
    pub async fn refill_hollows(&self, member: &Sandbox, target: usize, new_id: &(dyn Fn() -> String + Sync)) -> Result<()> {
        let open = self.refills.read().await;
        if !*open {
            return Ok(());
        }
        let have = member.family.hollows.lock().await.len();
        if have >= target {
            return Ok(());
        }
        let ids: Vec<String> = (have..target).map(|_| new_id()).collect();
        let made = self.hollow_members(member, &ids, &member.limits()).await?;
        let family = &member.family;
        if let Ok(mut names) = self.hollow_ids.lock() {
            names.extend(made.iter().map(|c| c.sandbox.id.clone()));
        }
        family.hollows.lock().await.extend(made);
        self.release_idle_hollows(family).await;
        drop(open);
        Ok(())
    }

    /// No more refills: wait for those in flight (server shutdown, before
    /// the sandboxes are destroyed).
    pub async fn stop_refills(&self) {
        *self.refills.write().await = false;
    }

    /// If hollow spares are all a family has left, destroy them (the family
    /// and its shim go with the last).
    async fn release_idle_hollows(&self, family: &Arc<FamilyHandle>) {
        let idle: Vec<ForkChild> = {
            let mut spares = family.hollows.lock().await;
            if family.members.load(std::sync::atomic::Ordering::SeqCst) > spares.len() {
                return;
            }
            spares.drain(..).collect()
        };
        self.forget_hollows(&idle);
        self.destroy_children(&idle).await;
    }

    fn forget_hollows(&self, children: &[ForkChild]) {
        if let Ok(mut names) = self.hollow_ids.lock() {
            for c in children {
                names.remove(&c.sandbox.id);
            }
        }
    }

    /// The hidden sandboxes the engine keeps: hollow fork spares.
    pub fn spare_ids(&self) -> Vec<String> {
        self.hollow_ids.lock().map(|n| n.iter().cloned().collect()).unwrap_or_default()
    }

    /// Hollow members of `sibling`'s family (no files yet): namespaces, init
    /// and cgroup, waiting for `root_children`.
    async fn hollow_members(&self, sibling: &Sandbox, ids: &[String], limits: &Limits) -> Result<Vec<ForkChild>> {
        self.new_members(sibling, ids, limits, true).await
    }

    /// Keep every member that was made (so the caller can clean up) and
    /// fail if any could not be.
    #[allow(clippy::type_complexity)]
    fn collect_members(
        built: Vec<Result<(Sandbox, Result<(Vec<OwnedFd>, oneshot::Receiver<ExitStatus>)>)>>,
        made: &mut Vec<Sandbox>,
    ) -> Result<Vec<(Vec<OwnedFd>, oneshot::Receiver<ExitStatus>)>> {
        let mut out = Vec::with_capacity(built.len());
        let mut first_error = None;
        for b in built {
            match b {
                Ok((sandbox, parts)) => {
                    made.push(sandbox);
                    match parts {
                        Ok(p) => out.push(p),
                        Err(e) => first_error = first_error.or(Some(e)),
                    }
                }
                Err(e) => first_error = first_error.or(Some(e)),
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// New members of `sibling`'s family over fresh (template-only) files,
    /// waiting for a REPL like fork children do: the warm pool's spares.
    pub async fn spare_members(&self, sibling: &Sandbox, ids: &[String], limits: &Limits) -> Result<Vec<ForkChild>> {
        self.new_members(sibling, ids, limits, false).await
    }

    /// New members of `sibling`'s family, built concurrently: over fresh
    /// (template-only) layers, or `hollow` (no layers yet). All or none.
    async fn new_members(&self, sibling: &Sandbox, ids: &[String], limits: &Limits, hollow: bool) -> Result<Vec<ForkChild>> {
        let range = crate::ids::IdRange { base: sibling.family.config.id_base, count: sibling.family.config.id_count };
        let builds = ids.iter().map(|id| async move {
            let subvolume = self.volume.root().join(SANDBOXES_DIR).join(id);
            if !hollow {
                if let Err(e) = self.make_layers(&subvolume, &sibling.template_rootfs, range, None, limits.disk_bytes) {
                    let _ = self.volume.delete_subvolume(&subvolume);
                    return Err(e);
                }
            }
            self.add_member(sibling, id, subvolume, limits, hollow).await
        });
        let mut made: Vec<Sandbox> = Vec::with_capacity(ids.len());
        match Self::collect_members(futures::future::join_all(builds).await, &mut made) {
            Ok(parts) => Ok(made.into_iter().zip(parts).map(|(sandbox, (ns, exited))| ForkChild { sandbox, ns, exited }).collect()),
            Err(e) => {
                for child in &made {
                    let _ = Box::pin(self.destroy(child)).await;
                }
                Err(e)
            }
        }
    }

    /// Build one member in `sibling`'s family over `subvolume`. The outer
    /// error: nothing was made; otherwise the member exists (to destroy on
    /// failure) and the inner result has its namespaces and REPL exit receiver.
    #[allow(clippy::type_complexity)]
    async fn add_member(
        &self,
        sibling: &Sandbox,
        id: &str,
        subvolume: PathBuf,
        limits: &Limits,
        hollow: bool,
    ) -> Result<(Sandbox, Result<(Vec<OwnedFd>, oneshot::Receiver<ExitStatus>)>)> {
        let shim = sibling.shim();
        let cgroup = match self.cgroups.create(id, limits) {
            Ok(c) => c,
            Err(e) => {
                let _ = self.volume.delete_subvolume(&subvolume);
                return Err(e);
            }
        };
        let (exited_tx, exited_rx) = oneshot::channel();
        shim.repl_exits.lock().await.insert(id.to_string(), exited_tx);
        sibling.family.members.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let request = if hollow { hollow_member_request(id, &cgroup) } else { create_member_request(id, &cgroup, &subvolume) };
        let (init_pidfd, ns) = match shim.call(request, &[]).await {
            Ok((_, fds)) => {
                let mut fds = fds.into_iter();
                (fds.next(), fds.collect::<Vec<_>>())
            }
            Err(e) => {
                tracing::warn!(sandbox = %id, err = %e, "creating a family member failed");
                (None, Vec::new())
            }
        };
        let ok = ns.len() == 5;
        let sandbox = Sandbox::new(
            id.to_string(),
            Arc::clone(&sibling.family),
            sibling.template_rootfs.clone(),
            *limits,
            cgroup,
            subvolume,
            self.volume.clone(),
            init_pidfd,
        );
        if !ok {
            return Ok((sandbox, Err(Error::Shim(format!("could not build the namespaces of sandbox {id}")))));
        }
        Ok((sandbox, Ok((ns, exited_rx))))
    }

    /// Before the parent's REPL (host pid `parent_repl`) forks itself into
    /// `child` as fork child `slot`: give the family's shim the descriptors
    /// that child gets besides its namespaces (`fds`: control socket,
    /// stdout and stderr write ends, then `child.self_join_fds()`). The
    /// shim copies them into the child itself once forked
    /// (`Request::ExpectFork`); the forking REPL never holds them.
    pub async fn expect_fork(&self, parent: &Sandbox, parent_repl: i32, slot: usize, child: &Sandbox, fds: &[BorrowedFd<'_>]) -> Result<()> {
        let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let request = Request::ExpectFork { parent_repl, slot, member: child.id.clone() };
        parent.shim().call(request, &raw).await.map(|_| ())
    }

    /// After the parent's REPL (host pid `parent_repl`) forked itself into
    /// `children` and each child said it is ready: move each into its
    /// cgroup and return (host pid, pidfd) per child.
    pub async fn adopt_forks(&self, parent: &Sandbox, parent_repl: i32, children: &[&Sandbox]) -> Result<Vec<(i32, OwnedFd)>> {
        let list = children.iter().map(|c| ForkedChild { member: c.id.clone(), cgroup_procs: c.cgroup.procs_files() }).collect();
        let (reply, fds) = parent.shim().call(Request::AdoptForks { parent_repl, children: list }, &[]).await?;
        match reply {
            Reply::Adopted { host_pids } if host_pids.len() == fds.len() => Ok(host_pids.into_iter().zip(fds).collect()),
            other => Err(Error::Shim(format!("unexpected reply {other:?}"))),
        }
    }

    fn run_dir(&self, id: &str) -> PathBuf {
        self.config.state_dir.join("run").join(id)
    }

    /// The sandbox's writable layers on a fresh subvolume that may hold
    /// `disk_bytes` (0: no limit). The upper layer's root must belong to
    /// the sandbox's root (and carry the template root's mode), or root
    /// inside could not create anything in `/`.
    fn make_layers(&self, subvolume: &Path, template_rootfs: &Path, range: crate::ids::IdRange, initial: Option<&Path>, disk_bytes: u64) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        // Saved files go in before the limit: a Space of a fork child may
        // hold more than its own quota (what it inherited was its parent's).
        self.volume.create_subvolume(subvolume, if initial.is_some() { 0 } else { disk_bytes })?;
        for d in ["upper", "work"] {
            std::fs::create_dir(subvolume.join(d)).map_err(|e| Error::io("create layer dir", e))?;
        }
        let upper = subvolume.join("upper");
        let mode = std::fs::metadata(template_rootfs).map(|m| m.permissions().mode() & 0o7777).unwrap_or(0o755);
        std::fs::set_permissions(&upper, std::fs::Permissions::from_mode(mode)).map_err(|e| Error::io("chmod upper", e))?;
        std::os::unix::fs::chown(&upper, Some(range.base), Some(range.base)).map_err(|e| Error::io("chown upper", e))?;
        if let Some(saved) = initial {
            let into_range = crate::layer_copy::Shift { from: 0, to: range.base, count: range.count };
            crate::layer_copy::copy_tree(saved, &upper, &into_range)?;
            self.volume.set_limit(subvolume, disk_bytes)?;
        }
        Ok(())
    }

    async fn create_member(
        &self,
        spec: &SandboxSpec,
        cgroup: &Cgroup,
        subvolume: &Path,
        range: crate::ids::IdRange,
    ) -> Result<(Arc<ShimHandle>, Option<OwnedFd>, ShimConfig)> {
        let config = ShimConfig {
            family: spec.id.clone(),
            id_base: range.base,
            id_count: range.count,
            template_rootfs: spec.template_rootfs.clone(),
            template_layers: spec.template_layers.clone(),
            trust_layer: spec.trust_layer.clone(),
            run_dir: self.run_dir(&spec.id),
            orphan_grace_ms: self.config.orphan_grace.as_millis() as u64,
        };
        let shim = ShimHandle::start(&self.config.shim_exe, &config, range).await?;
        match shim.call(create_member_request(&spec.id, cgroup, subvolume), &[]).await {
            Ok((_, fds)) => Ok((shim, fds.into_iter().next(), config)),
            Err(e) => {
                shim.shutdown().await;
                Err(e)
            }
        }
    }

    /// Destroy a sandbox and free everything it used. The family's shim
    /// (and its id range) goes with its last member.
    pub async fn destroy(&self, sandbox: &Sandbox) -> Result<()> {
        let cgroup = sandbox.cgroup.clone();
        tokio::task::spawn_blocking(move || cgroup.kill_all(DESTROY_DEADLINE)).await.map_err(|e| Error::Shim(format!("join: {e}")))??;
        let shim = sandbox.shim();
        let _ = shim.call(Request::DestroyMember { member: sandbox.id.clone() }, &[]).await;
        let family = &sandbox.family;
        let family_gone =
            !sandbox.released.swap(true, std::sync::atomic::Ordering::SeqCst) && family.members.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) == 1;
        if family_gone {
            shim.shutdown().await;
            // The shim's mounts died with it; its mount points are plain dirs here.
            let _ = std::fs::remove_dir_all(&family.config.run_dir);
            if let Ok(mut ids) = self.ids.lock() {
                ids.release(shim.range);
            }
        }
        sandbox.cgroup.remove()?;
        // A family whose other members are gone does not keep its spares.
        if !family_gone {
            self.release_idle_hollows(family).await;
        }
        // The member's mount namespace is released asynchronously after its
        // last process exits; retry while the subvolume is still busy. A
        // hollow spare never had one.
        let mut tries = 0;
        loop {
            if !sandbox.subvolume.exists() {
                break;
            }
            match sandbox.volume.delete_subvolume(&sandbox.subvolume) {
                Ok(()) => break,
                Err(Error::Sys { source: nix::errno::Errno::EBUSY, .. }) if tries < 500 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
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

/// Kill the supervisors of this state directory's families that are not
/// `kept` and that `end_orphan` could not reach: one started by a server
/// killed before the shim was listening, say, would otherwise wait out its
/// orphan grace holding its family (found by tests/e2e/test_faults.py).
/// Its reaper goes with it, and the family's processes with the reaper.
fn kill_stray_shims(run: &Path, kept: &Kept) {
    let Ok(procs) = std::fs::read_dir("/proc") else { return };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        let Ok(pidfd) = crate::sys::pidfd_open(nix::unistd::Pid::from_raw(pid)) else { continue };
        // Read after the pidfd is open: the pid cannot be reused under us.
        let Ok(cmdline) = std::fs::read(p.path().join("cmdline")) else { continue };
        let mut args = cmdline.split(|b| *b == 0);
        if args.nth(1) != Some(b"__shim".as_slice()) {
            continue;
        }
        let Some(config) = args.next().and_then(|a| serde_json::from_slice::<ShimConfig>(a).ok()) else { continue };
        if config.run_dir.starts_with(run) && !kept.families.contains(&config.family) {
            tracing::warn!(family = %config.family, pid, "killing the supervisor of a family nobody adopted");
            let _ = crate::sys::pidfd_send_signal(pidfd.as_fd(), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// Tell an orphaned family's shim (waiting in `run_dir` for a server) to
/// end; it takes its family's processes with it.
fn end_orphan(run_dir: &Path) {
    let socket = run_dir.join(SHIM_SOCKET_NAME);
    if let Ok(sock) = crate::channel::connect(&socket) {
        let bye = Envelope { req: 0, request: Request::Shutdown };
        let _ = crate::channel::send(sock.as_fd(), &bye, &[]);
        // Wait (briefly) for it to go: it closes its end as it exits. One
        // that does not (still busy, not listening yet) is killed next, by
        // `kill_stray_shims`.
        let mut fds = [nix::poll::PollFd::new(sock.as_fd(), nix::poll::PollFlags::POLLIN)];
        let _ = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(2000u16));
    }
}

impl Drop for Jail {
    /// An engine that goes away unmounts its volume (lazily: sandboxes still
    /// running keep their files) and removes its empty cgroup parents.
    fn drop(&mut self) {
        let _ = self.close();
    }
}

/// A new member made by `Jail::fork_members`, waiting for its REPL.
pub struct ForkChild {
    pub sandbox: Sandbox,
    /// Its mnt, net, uts, ipc and leaf pid namespaces (the shim hands its
    /// own copies to the forked REPL, see `Jail::expect_fork`).
    pub ns: Vec<OwnedFd>,
    /// Resolves with its REPL's exit status once that REPL dies.
    pub exited: oneshot::Receiver<ExitStatus>,
}

impl Sandbox {
    #[allow(clippy::too_many_arguments)]
    fn new(
        id: String,
        family: Arc<FamilyHandle>,
        template_rootfs: PathBuf,
        limits: Limits,
        cgroup: Cgroup,
        subvolume: PathBuf,
        volume: Volume,
        init_pidfd: Option<OwnedFd>,
    ) -> Sandbox {
        Sandbox {
            id,
            family,
            template_rootfs,
            limits: StdMutex::new(limits),
            cgroup,
            subvolume,
            volume,
            next_command: std::sync::atomic::AtomicU64::new(1),
            init_pidfd: StdMutex::new(init_pidfd),
            released: std::sync::atomic::AtomicBool::new(false),
            paused: Default::default(),
            paused_now: Default::default(),
        }
    }

    fn shim(&self) -> Arc<ShimHandle> {
        self.family.shim()
    }

    pub fn limits(&self) -> Limits {
        *self.limits.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Change the sandbox's resource limits (a warm spare handed out with
    /// the limits its create asked for). The disk limit is its subvolume's,
    /// once it has one.
    pub fn set_limits(&self, limits: &Limits) -> Result<()> {
        let have = self.limits();
        if have.cgroup_differs(limits) {
            self.cgroup.set_limits(limits)?;
        }
        if have.disk_bytes != limits.disk_bytes && self.subvolume.exists() {
            self.volume.set_limit(&self.subvolume, limits.disk_bytes)?;
        }
        *self.limits.lock().unwrap_or_else(|e| e.into_inner()) = *limits;
        Ok(())
    }

    /// The sandbox's filesystem as overlay layers on the host (for diff).
    /// Copy this sandbox's upper layer (every file it changed) to `dst`,
    /// owners made relative to its uid range. Pause it first for a
    /// consistent copy.
    pub fn export_upper(&self, dst: &Path) -> Result<crate::layer_copy::Copied> {
        let config = &self.family.config;
        let to_relative = crate::layer_copy::Shift { from: config.id_base, to: 0, count: config.id_count };
        crate::layer_copy::copy_tree(&self.subvolume.join("upper"), dst, &to_relative)
    }

    pub fn layers(&self) -> (PathBuf, PathBuf) {
        (self.subvolume.join("upper"), self.template_rootfs.clone())
    }

    /// Descriptors a forked REPL writes "0" to, to move itself into this
    /// sandbox's cgroup cheaply (v1 only; see `Cgroup::join_files`); the
    /// shim moves it otherwise.
    pub fn self_join_fds(&self) -> Vec<OwnedFd> {
        if self.cgroup.version() != crate::cgroup::Version::V1 {
            return Vec::new();
        }
        let open = |p: &PathBuf| std::fs::OpenOptions::new().write(true).open(p).ok().map(OwnedFd::from);
        let fds: Vec<OwnedFd> = self.cgroup.join_files().iter().filter_map(open).collect();
        if fds.len() == self.cgroup.join_files().len() {
            fds
        } else {
            Vec::new()
        }
    }

    /// Whether two sandboxes are members of the same family.
    pub fn same_family(&self, other: &Sandbox) -> bool {
        Arc::ptr_eq(&self.family, &other.family)
    }

    pub fn cgroup(&self) -> &Cgroup {
        &self.cgroup
    }

    /// Start the sandbox's REPL: `argv`/`env` run in the sandbox with the
    /// fd layout of docs/repl-protocol.md; `source` is offered on fd 4.
    pub async fn start_repl(&self, argv: Vec<String>, env: Vec<String>, cwd: &str, source: &[u8]) -> Result<ReplProcess> {
        let (stdout_r, stdout_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| Error::sys("pipe", e))?;
        let (stderr_r, stderr_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| Error::sys("pipe", e))?;
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(|e| Error::io("socketpair", e))?;
        let memfd = source_memfd(source)?;
        let theirs_fd = OwnedFd::from(theirs);
        let fds = [stdout_w.as_raw_fd(), stderr_w.as_raw_fd(), theirs_fd.as_raw_fd(), memfd.as_raw_fd()];
        let (exited_tx, exited_rx) = oneshot::channel();
        let shim = self.shim();
        shim.repl_exits.lock().await.insert(self.id.clone(), exited_tx);
        let req = Request::SpawnRepl { member: self.id.clone(), cgroup_procs: self.cgroup.join_files(), argv, env, cwd: cwd.to_string() };
        let (reply, mut reply_fds) = shim.call(req, &fds).await?;
        drop((stdout_w, stderr_w, theirs_fd, memfd));
        let host_pid = match reply {
            Reply::ReplSpawned { host_pid } => host_pid,
            other => return Err(Error::Shim(format!("unexpected reply {other:?}"))),
        };
        let pidfd = reply_fds.pop().ok_or_else(|| Error::Shim("no pidfd for the REPL".into()))?;
        ours.set_nonblocking(true).map_err(|e| Error::io("nonblocking", e))?;
        Ok(ReplProcess {
            control: tokio::net::UnixStream::from_std(ours).map_err(|e| Error::io("register control socket", e))?,
            stdout: tokio::net::unix::pipe::Receiver::from_owned_fd(stdout_r).map_err(|e| Error::io("register pipe", e))?,
            stderr: tokio::net::unix::pipe::Receiver::from_owned_fd(stderr_r).map_err(|e| Error::io("register pipe", e))?,
            pidfd,
            host_pid,
            exited: exited_rx,
        })
    }

    /// Run `argv` in the sandbox through its init (for bash calls).
    pub async fn spawn_command(&self, argv: Vec<String>, env: Vec<String>, cwd: &str) -> Result<CommandProcess> {
        let (stdout_r, stdout_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| Error::sys("pipe", e))?;
        let (stderr_r, stderr_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| Error::sys("pipe", e))?;
        let null = OwnedFd::from(std::fs::File::open("/dev/null").map_err(|e| Error::io("open /dev/null", e))?);
        let launched = self.launch(argv, env, cwd, [null.as_raw_fd(), stdout_w.as_raw_fd(), stderr_w.as_raw_fd()], false).await?;
        Ok(CommandProcess {
            stdout: tokio::net::unix::pipe::Receiver::from_owned_fd(stdout_r).map_err(|e| Error::io("register pipe", e))?,
            stderr: tokio::net::unix::pipe::Receiver::from_owned_fd(stderr_r).map_err(|e| Error::io("register pipe", e))?,
            exited: launched.exited,
            started: launched.started,
            control: launched.control,
        })
    }

    /// Run `argv` on a new terminal of the sandbox's own devpts, as the
    /// leader of its session with the terminal as its controlling tty.
    pub async fn spawn_terminal(&self, argv: Vec<String>, env: Vec<String>, cwd: &str, size: crate::pty::Size) -> Result<TerminalProcess> {
        let terminal = self.fs()?.open_terminal(size)?;
        let slave = terminal.slave.as_raw_fd();
        let launched = self.launch(argv, env, cwd, [slave, slave, slave], true).await?;
        drop(terminal.slave);
        Ok(TerminalProcess { master: terminal.master, exited: launched.exited, control: launched.control })
    }

    /// Have init start `argv` with `stdio` as fds 0-2 (a terminal when `tty`).
    async fn launch(&self, argv: Vec<String>, env: Vec<String>, cwd: &str, stdio: [i32; 3], tty: bool) -> Result<Launched> {
        let id = self.next_command.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let (started_tx, started_rx) = oneshot::channel();
        let shim = self.shim();
        shim.commands.lock().await.insert((self.id.clone(), id), crate::supervisor::CommandWaiters { started: Some(started_tx), exited: tx });
        let req = Request::SpawnCommand { member: self.id.clone(), id, argv, env, cwd: cwd.to_string(), tty };
        if let Err(e) = shim.call(req, &stdio).await {
            shim.commands.lock().await.remove(&(self.id.clone(), id));
            return Err(e);
        }
        Ok(Launched { exited: rx, started: started_rx, control: CommandControl { shim, member: self.id.clone(), id } })
    }

    /// Kill every process of the sandbox and build its namespaces and init
    /// again over the same files (after its init died, e.g. to `kill -1`
    /// from the REPL, or its supervisor died): the filesystem survives,
    /// processes do not.
    pub async fn rebuild(&self) -> Result<()> {
        let cgroup = self.cgroup.clone();
        tokio::task::spawn_blocking(move || cgroup.kill_all(DESTROY_DEADLINE)).await.map_err(|e| Error::Shim(format!("join: {e}")))??;
        let shim = {
            let _one_at_a_time = self.family.restart.lock().await;
            let mut shim = self.shim();
            if shim.alive() {
                let _ = shim.call(Request::DestroyMember { member: self.id.clone() }, &[]).await;
            } else {
                // The supervisor died, and its family with it: start a new
                // one (the family's other members rebuild into it too).
                shim.shutdown().await;
                let config = &self.family.config;
                let range = crate::ids::IdRange { base: config.id_base, count: config.id_count };
                shim = ShimHandle::start(&self.family.shim_exe, config, range).await?;
                *self.family.shim.lock().unwrap_or_else(|e| e.into_inner()) = Arc::clone(&shim);
            }
            shim
        };
        let (_, fds) = shim.call(create_member_request(&self.id, &self.cgroup, &self.subvolume), &[]).await?;
        if let Ok(mut slot) = self.init_pidfd.lock() {
            *slot = fds.into_iter().next();
        }
        Ok(())
    }

    /// Wait up to `limit` for the member's init to be gone (after a failure
    /// that says it is dying: init exits only once every process of its pid
    /// namespace has). True when it is gone.
    pub async fn wait_init_gone(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        while self.init_alive() {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    /// Stop every process of the sandbox (cgroup freezer): no CPU, memory
    /// kept, until `resume`. Blocking.
    pub fn pause(&self) -> Result<()> {
        let mut paused = self.paused.lock().unwrap_or_else(|e| e.into_inner());
        self.cgroup.freeze()?;
        *paused = true;
        self.paused_now.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    /// Let a paused sandbox run on exactly where it stopped. Blocking.
    pub fn resume(&self) -> Result<()> {
        let mut paused = self.paused.lock().unwrap_or_else(|e| e.into_inner());
        if *paused {
            self.cgroup.thaw()?;
            *paused = false;
            self.paused_now.store(false, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(())
    }

    pub fn is_paused(&self) -> bool {
        self.paused_now.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The sandbox's root filesystem, opened for the host (the files API).
    /// Fails when the sandbox's init is gone (its root with it).
    pub fn fs(&self) -> Result<crate::fs::SandboxFs> {
        let root = self.open_init_proc("root", rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY)?;
        let config = &self.family.config;
        Ok(crate::fs::SandboxFs::new(root, config.id_base, config.id_count))
    }

    /// The sandbox's network namespace (for `setns` by one thread, to open
    /// sockets inside it, or by a child process such as `nft`).
    pub fn netns(&self) -> Result<OwnedFd> {
        self.open_init_proc("ns/net", rustix::fs::OFlags::RDONLY)
    }

    /// Connect to `port` on the sandbox's own loopback (the port proxy;
    /// see `ports::connect`).
    pub async fn connect_port(
        &self,
        port: u16,
        timeout: Duration,
    ) -> std::result::Result<(tokio::net::TcpStream, std::net::SocketAddr), crate::ports::PortError> {
        let netns = self.netns().map_err(|e| crate::ports::PortError::Unreachable(e.to_string()))?;
        crate::ports::connect(netns, port, timeout).await
    }

    /// Start `pasta` for the sandbox's network namespace (its way out; see
    /// `net::Pasta`). Blocking.
    pub fn start_pasta(&self) -> Result<crate::net::Pasta> {
        let netns = self.netns()?;
        let pid = self.init_pid()?;
        let pidfile = self.family.config.run_dir.join(format!("{}.pasta.pid", self.id));
        let pasta = crate::net::Pasta::start(pid, &pidfile)?;
        // pasta took a path; it must still name the namespace we hold (the
        // init's pid was not reused meanwhile).
        let same = match (rustix::fs::stat(format!("/proc/{pid}/ns/net").as_str()), rustix::fs::fstat(&netns)) {
            (Ok(a), Ok(b)) => a.st_ino == b.st_ino && a.st_dev == b.st_dev,
            _ => false,
        };
        if !same {
            pasta.stop();
            return Err(Error::Invalid("the sandbox's init went away while its network was set up".into()));
        }
        Ok(pasta)
    }

    fn init_pid(&self) -> Result<i32> {
        let slot = self.init_pidfd.lock().unwrap_or_else(|e| e.into_inner());
        let pidfd = slot.as_ref().ok_or_else(|| Error::Invalid("the sandbox has no init".into()))?;
        crate::sys::pidfd_pid(pidfd.as_fd()).ok_or_else(|| Error::Invalid("the sandbox's init has exited".into()))
    }

    /// Open `/proc/<init>/<what>` of the member's init, making sure the pid
    /// still names that init afterwards (its pidfd is alive, so the pid was
    /// not reused in between).
    fn open_init_proc(&self, what: &str, flags: rustix::fs::OFlags) -> Result<OwnedFd> {
        let pid = self.init_pid()?;
        let fd = rustix::fs::open(format!("/proc/{pid}/{what}").as_str(), flags | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty())
            .map_err(|e| Error::io("open the sandbox init's /proc entry", e.into()))?;
        self.init_pid()?;
        Ok(fd)
    }

    /// Whether the member's init (and so the sandbox's namespaces) is alive.
    pub fn init_alive(&self) -> bool {
        let exited = self.init_pidfd.lock().ok().and_then(|slot| {
            slot.as_ref().map(|fd| {
                let mut fds = [nix::poll::PollFd::new(fd.as_fd(), nix::poll::PollFlags::POLLIN)];
                nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO).map(|n| n > 0).unwrap_or(true)
            })
        });
        exited == Some(false) && self.shim().alive()
    }
}

fn source_memfd(source: &[u8]) -> Result<OwnedFd> {
    use std::io::{Seek, Write};
    let fd = nix::sys::memfd::memfd_create(c"forkbox-repl", nix::sys::memfd::MFdFlags::MFD_CLOEXEC).map_err(|e| Error::sys("memfd_create", e))?;
    let mut file = std::fs::File::from(fd);
    file.write_all(source).map_err(|e| Error::io("write REPL source", e))?;
    file.rewind().map_err(|e| Error::io("rewind REPL source", e))?;
    Ok(OwnedFd::from(file))
}
