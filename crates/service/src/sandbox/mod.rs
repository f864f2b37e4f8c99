//! One live sandbox: the engine's handle, its REPL, its FIFO exec queue, its
//! replay buffer and its timers. `run_python` and `run_bash` are the two
//! exec paths; both stream events into an `EventSink`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use jail::ExitStatus;
use nix::sys::signal::Signal;
use protocol::SandboxInfo;
use tokio::io::AsyncReadExt;
use tokio::sync::Mutex;

use repl_host::events::{now_ms, EventSink, Replay};
use repl_host::session::{ReplItem, ReplSession, REPL_BOOTSTRAP, REPL_SOURCE};

pub mod checkpoint_list;
pub mod contexts;
pub mod files;
pub mod freezer;
pub mod network;
pub mod processes;
pub mod pty;

/// Exit code of an exec stopped by its timeout (as GNU `timeout` does).
pub const TIMEOUT_EXIT: i32 = 124;
/// Exit status of an exec the server interrupted because it was shutting
/// down (128 + SIGTERM, as a shell reports a terminated command).
pub const SHUTDOWN_EXIT: i32 = 143;
/// Exit status of an exec interrupted because its client went away (128 + SIGINT).
pub const CANCELLED_EXIT: i32 = 130;

/// When an exec must stop early: at its timeout, or when the server's
/// drain runs out (src/drain.rs).
#[derive(Clone)]
pub struct ExecBounds {
    pub timeout: Duration,
    pub stop: tokio_util::sync::CancellationToken,
    /// Cancelled when the client went away and the exec should stop (E2B's
    /// code interpreter stops an execution whose client disconnected).
    pub cancel: tokio_util::sync::CancellationToken,
}

impl ExecBounds {
    /// Only the timeout (the server's own hidden runs: a shutdown's freeze
    /// must not be interrupted by the shutdown).
    pub fn timeout_only(timeout: Duration) -> ExecBounds {
        ExecBounds { timeout, stop: Default::default(), cancel: Default::default() }
    }
}

/// Why the server interrupted an exec.
#[derive(Clone, Copy, PartialEq)]
enum Interrupt {
    Timeout,
    Shutdown,
    /// The client went away.
    Cancelled,
}

#[derive(Clone)]
pub struct Settings {
    pub template: String,
    pub ram_mib: u64,
    pub rootfs_gb: u64,
    pub timeout: Duration,
    pub idle_timeout: Duration,
    pub interrupt_grace: Duration,
    /// The egress policy asked for at create (children: the parent's).
    pub egress: protocol::Egress,
    /// Freeze to a Space at the idle timeout instead of being destroyed.
    pub persistent: bool,
    /// A solo sandbox, whose freezes keep every process (docs/state.md);
    /// it forks through criu (src/process_fork.rs).
    pub keep_processes: bool,
    /// The name of the API key that owns it (src/keys.rs); `None` on a
    /// server without keys. Fork children, restores and merges keep it.
    pub owner: Option<String>,
    /// What the server's configuration gives every sandbox (src/setup.rs).
    pub setup: Arc<crate::setup::SandboxSetup>,
    /// Environment variables asked for at create, for every process a
    /// front end starts in it (E2B's `envVars`).
    pub env: Vec<(String, String)>,
    /// Labels asked for at create (E2B's `metadata`), listed and filtered on.
    pub metadata: std::collections::BTreeMap<String, String>,
    /// At the end of its lifetime, pause it (hibernated, or in memory,
    /// until a client gives it a new lifetime) instead of destroying it
    /// (E2B's `autoPause`, src/hibernate.rs).
    pub pause_at_timeout: bool,
    /// Its ports answer through the Host-routed proxy without an API key
    /// (E2B's public traffic, docs/e2b.md#ports).
    pub public_ports: bool,
}

/// The settings E2B's front door gives a sandbox beyond what its info
/// shows, as records and Spaces keep them.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct KeptSettings {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<(String, String)>,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub metadata: std::collections::BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pause_at_timeout: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub public_ports: bool,
}

impl KeptSettings {
    pub fn of(s: &Settings) -> KeptSettings {
        KeptSettings { env: s.env.clone(), metadata: s.metadata.clone(), pause_at_timeout: s.pause_at_timeout, public_ports: s.public_ports }
    }

    /// `settings` with these in place of its own.
    pub fn apply(self, settings: Settings) -> Settings {
        Settings { env: self.env, metadata: self.metadata, pause_at_timeout: self.pause_at_timeout, public_ports: self.public_ports, ..settings }
    }
}

pub struct SandboxEntry {
    pub id: String,
    pub settings: Settings,
    pub engine: crate::engine::MemberRef,
    /// Ids of the sandboxes this one was forked from, nearest last (a
    /// merge re-points them; see `Service::merge_into`).
    pub lineage: std::sync::Mutex<Vec<String>>,
    pub created_at: u64,
    pub last_active: AtomicU64,
    pub execs: AtomicU64,
    pub repl_restarts: AtomicU64,
    pub replay: Replay,
    /// Set once, when it is destroyed (or merged away, or frozen): read it
    /// through `lifecycle` or `is_destroyed`.
    destroyed: AtomicBool,
    /// Held for the whole of an exec: `tokio::sync::Mutex` is fair, so
    /// concurrent execs run in arrival order.
    pub slot: Mutex<ReplSlot>,
    /// Work running or queued on it (execs, a fork, a freeze or save): the
    /// idle timer and pause leave a busy sandbox alone. Only `Busy` moves it.
    busy: AtomicU64,
    /// Open connections of the port proxy (crates/server/src/routes/ports.rs).
    pub port_connections: std::sync::atomic::AtomicUsize,
    /// Open file watch streams (src/watch.rs).
    pub watches: std::sync::atomic::AtomicUsize,
    /// PTY sessions (pty.rs); a merge hands the winner's to the parent's id.
    pub ptys: Arc<pty::PtyTable>,
    /// Numbered processes a front end started (processes.rs), handed on as the PTYs are.
    pub processes: Arc<processes::ProcessTable>,
    /// Its code contexts besides its own REPL (src/contexts.rs).
    pub contexts: contexts::Contexts,
    /// Unix milliseconds at which its lifetime ends (`Service::set_timeout` moves it).
    expires: AtomicU64,
    /// The egress policy in force (network.rs).
    pub egress: std::sync::Mutex<protocol::Egress>,
    /// What runs for it (pasta, DNS proxy); held while it is being set up,
    /// so an exec waits for the network it was promised.
    pub network: Arc<Mutex<network::NetState>>,
    /// Its checkpoints (checkpoint_list.rs): they belong to the id, so a
    /// restore or a merge hands them to the entry that takes the id over.
    pub checkpoints: checkpoint_list::Checkpoints,
    /// A freeze paused it, and is under way: a server that adopts it after
    /// a crash lets it run again (its record says so).
    pub freezing: AtomicBool,
}

/// The REPL as the exec queue sees it.
pub struct ReplSlot {
    pub session: Option<ReplSession>,
    /// Why the last REPL died, told to the next Python call.
    pub lost_state: Option<String>,
    /// The sandbox was rebuilt after its init died: told to the next bash call.
    pub rebuilt: bool,
    /// Told to the next exec, Python or bash, as a warning (what a resumed
    /// Space could not bring back).
    pub notice: Option<String>,
    /// The cgroup's OOM-kill count when the REPL was last seen alive, to tell
    /// an OOM kill between calls from other deaths.
    pub oom_seen: u64,
    /// Its REPLs survive a server restart (the sandbox's own REPL does;
    /// a code context's does not: docs/e2b.md#contexts).
    pub keep_ends: bool,
}

impl ReplSlot {
    /// A slot whose REPL is started on its first call.
    pub fn empty(keep_ends: bool) -> ReplSlot {
        ReplSlot { session: None, lost_state: None, rebuilt: false, notice: None, oom_seen: 0, keep_ends }
    }
}

/// Refuse an environment variable no process could be given: an empty
/// name, `=` in the name, or a NUL anywhere.
pub fn check_env_var(name: &str, value: &str) -> Result<(), crate::Error> {
    if name.is_empty() || name.contains('=') || name.contains('\0') || value.contains('\0') {
        return Err(crate::Error::Invalid(format!("invalid environment variable name or value `{name}`")));
    }
    Ok(())
}

/// Every process's environment in sandbox `id`: the defaults, then what
/// the server's configuration adds.
pub fn sandbox_env(id: &str, setup: &crate::setup::SandboxSetup) -> Vec<String> {
    [
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME=/root",
        "USER=root",
        "LOGNAME=root",
        "SHELL=/bin/bash",
        "LANG=C.UTF-8",
        "TERM=dumb",
        "MPLBACKEND=Agg",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(std::iter::once(format!("HOSTNAME={id}")))
    .chain(setup.env.iter().cloned())
    .collect()
}

/// Scheduler slice of a REPL (`set_time_slice`; a forked REPL asks for it
/// again itself, repl/repl.py `_short_slice`) and of the server's threads.
pub const REPL_TIME_SLICE: Duration = Duration::from_micros(300);

/// Why a sandbox has no REPL to run code in. The messages are the
/// client's (an exec's error event, a fork's 409).
#[derive(Debug, thiserror::Error)]
pub enum ReplError {
    #[error("start the Python REPL: {0}")]
    Spawn(jail::Error),
    #[error("{0}")]
    Session(#[from] repl_host::session::SessionError),
    #[error("the sandbox could not be restarted after its init process died")]
    Rebuild,
    #[error("the sandbox was destroyed")]
    Destroyed,
}

/// Spawn a REPL in `engine` and wait until it is ready.
pub async fn start_repl(engine: &dyn crate::engine::Member, setup: &crate::setup::SandboxSetup) -> Result<ReplSession, ReplError> {
    start_repl_with(engine, setup, true).await
}

/// [`start_repl`]; `keep_ends`: have the family's shim keep its ends, so
/// it survives a server restart (one REPL per sandbox can be).
pub async fn start_repl_with(engine: &dyn crate::engine::Member, setup: &crate::setup::SandboxSetup, keep_ends: bool) -> Result<ReplSession, ReplError> {
    let argv = vec!["/usr/bin/python3".to_string(), "-u".into(), "-c".into(), REPL_BOOTSTRAP.to_string()];
    let process = engine.start_repl(argv, sandbox_env(engine.id(), setup), "/root", REPL_SOURCE.as_bytes()).await.map_err(ReplError::Spawn)?;
    let mut session = ReplSession::start(process).await?;
    // A short time slice: a REPL that wakes for an exec runs soon beside
    // CPU hogs in other sandboxes (bench/noisy.py). What it starts gets the
    // default slice; a REPL that computes itself goes to the idle
    // scheduling class instead (src/cpu_boost.rs).
    if let Err(e) = jail::sys::set_time_slice(session.host_pid, REPL_TIME_SLICE) {
        tracing::debug!(sandbox = %engine.id(), err = %e, "could not set the REPL's time slice");
    }
    if let Some(ends) = session.take_ends() {
        if keep_ends {
            keep_repl_ends(engine, session.host_pid, ends).await;
        }
    }
    // (A solo sandbox's REPL starts in the sandbox's pid namespace.)
    if !session.ready.pidns && !engine.is_solo() {
        tracing::warn!(sandbox = %engine.id(), "the REPL could not switch pid namespaces: its subprocesses will not show in the sandbox's ps");
    }
    Ok(session)
}

/// Have the family's shim keep the server's ends of a new REPL, so it
/// survives a server restart (docs/state.md#restarts).
pub async fn keep_repl_ends(engine: &dyn crate::engine::Member, repl_host_pid: i32, ends: [std::os::fd::OwnedFd; 3]) {
    if let Err(e) = engine.keep_repl_ends(repl_host_pid, ends).await {
        if engine.init_alive() {
            tracing::warn!(sandbox = %engine.id(), error = %e, "the REPL will not survive a server restart");
        } else {
            // Destroyed before its ends were kept (fork children deleted at
            // once under load: bench/load.py logged hundreds): nothing to keep.
            tracing::debug!(sandbox = %engine.id(), error = %e, "a destroyed sandbox's REPL ends were not kept");
        }
    }
}

/// Holds its sandbox busy until dropped, so no path that returns early can
/// leave the count raised (or lower it twice).
pub struct Busy(Arc<SandboxEntry>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

impl SandboxEntry {
    /// Mark it busy (and active now) for as long as the guard lives.
    pub fn hold_busy(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Ordering::SeqCst);
        self.touch();
        Busy(Arc::clone(self))
    }

    /// Its state now, from the destroyed mark, the freezer and the busy count.
    pub fn lifecycle(&self) -> crate::lifecycle::Lifecycle {
        crate::lifecycle::Lifecycle::of(self.is_destroyed(), self.engine.is_paused(), self.is_busy())
    }

    pub fn is_destroyed(&self) -> bool {
        self.destroyed.load(Ordering::SeqCst)
    }

    /// Mark it destroyed, for good: nothing new may start on it.
    pub fn mark_destroyed(&self) {
        self.destroyed.store(true, Ordering::SeqCst);
    }

    pub fn is_busy(&self) -> bool {
        self.busy_count() > 0
    }

    /// How much work runs or waits on it.
    pub fn busy_count(&self) -> u64 {
        self.busy.load(Ordering::SeqCst)
    }

    pub fn touch(&self) {
        self.last_active.store(now_ms(), Ordering::Relaxed);
    }

    pub fn expires_at(&self) -> u64 {
        self.expires.load(Ordering::Relaxed)
    }

    pub fn set_expires_at(&self, unix_ms: u64) {
        self.expires.store(unix_ms, Ordering::Relaxed);
    }

    /// End its lifetime `from_now` from now instead.
    pub fn set_expiry(&self, from_now: Duration) {
        self.expires.store(now_ms() + from_now.as_millis() as u64, Ordering::Relaxed);
    }

    pub fn info(&self) -> SandboxInfo {
        SandboxInfo {
            id: self.id.clone(),
            state: self.lifecycle().as_str().into(),
            template: self.settings.template.clone(),
            ram_mib: self.settings.ram_mib,
            rootfs_gb: self.settings.rootfs_gb,
            egress: self.egress.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            persistent: self.settings.persistent,
            keep_processes: self.settings.keep_processes,
            space_id: None,
            created_at: self.created_at,
            last_active_at: self.last_active.load(Ordering::Relaxed),
            expires_at: self.expires_at(),
            timeout_seconds: self.settings.timeout.as_secs(),
            idle_timeout_seconds: self.settings.idle_timeout.as_secs(),
            execs: self.execs.load(Ordering::Relaxed),
            repl_restarts: self.repl_restarts.load(Ordering::Relaxed),
            memory_bytes: self.engine.memory_usage(),
            cpu_seconds: self.engine.cpu_usage_ns() as f64 / 1e9,
        }
    }

    /// If the sandbox's init died (say, to `os.kill(-1, 9)` from the REPL,
    /// which reaches it), nothing can start in the sandbox any more: rebuild
    /// its namespaces over the same files. The REPL goes with them.
    pub async fn heal(&self, slot: &mut ReplSlot) -> Result<(), ReplError> {
        if self.engine.init_alive() || self.is_destroyed() {
            return Ok(());
        }
        tracing::warn!(sandbox = %self.id, "sandbox init or supervisor died: rebuilding its namespaces");
        slot.session = None;
        slot.lost_state = Some("ended because the sandbox's init process (or its supervisor) died; the sandbox was restarted with its files kept".into());
        slot.rebuilt = true;
        self.repl_restarts.fetch_add(1, Ordering::Relaxed);
        self.engine.rebuild().await.map_err(|e| {
            tracing::error!(sandbox = %self.id, err = %e, "rebuild failed");
            ReplError::Rebuild
        })?;
        network::reapply(self).await;
        Ok(())
    }

    /// Heal a sandbox whose init died before work that needs its
    /// namespaces but not its REPL (files, terminals, processes). The REPL's
    /// slot is taken only then, so a long exec does not hold files up.
    pub async fn revive(&self) -> Result<(), crate::error::Error> {
        if self.engine.init_alive() || self.is_destroyed() {
            return Ok(());
        }
        let mut slot = self.slot.lock().await;
        self.heal(&mut slot).await.map_err(|e| crate::error::Error::internal("could not restart the sandbox", e))
    }

    /// Make sure the sandbox has a live REPL (before a fork).
    pub async fn ensure_repl(&self, slot: &mut ReplSlot) -> Result<(), ReplError> {
        self.heal(slot).await?;
        if slot.session.is_none() {
            slot.session = Some(self.restart_repl(slot.keep_ends).await?);
        }
        Ok(())
    }

    /// Run Python code in the REPL (the caller holds the slot).
    pub async fn run_python(&self, slot: &mut ReplSlot, code: &str, bounds: &ExecBounds, sink: &mut EventSink) {
        let timeout = bounds.timeout;
        tell_notice(slot, sink).await;
        if let Err(e) = self.heal(slot).await {
            sink.error(e.to_string(), None, None, None).await;
            sink.exit(1).await;
            return;
        }
        if let Some(reason) = slot.lost_state.take() {
            let msg = format!("[forkbox] the previous Python process {reason}; this is a fresh one, so earlier variables and imports are gone");
            sink.warning(msg.clone()).await;
            sink.stderr(format!("{msg}\n").as_bytes()).await;
        }
        if slot.session.is_none() {
            match self.restart_repl(slot.keep_ends).await {
                Ok(s) => slot.session = Some(s),
                Err(e) => {
                    sink.error(e.to_string(), None, None, None).await;
                    sink.exit(1).await;
                    return;
                }
            }
        }
        let Some(session) = slot.session.as_mut() else { return };
        // Output that background threads wrote since the last exec.
        while let Some(item) = session.try_next() {
            match item {
                ReplItem::Stdout(b) => sink.stdout(&b).await,
                ReplItem::Stderr(b) => sink.stderr(&b).await,
                ReplItem::Display(v) => sink.display(v).await,
                ReplItem::Died(status) => {
                    // It died between calls (a background thread's doing, an
                    // OOM kill by another process's growth, ...).
                    slot.session = None;
                    let oom = self.engine.oom_kills() > slot.oom_seen;
                    slot.lost_state = Some(self.death_reason(status, oom));
                    self.repl_restarts.fetch_add(1, Ordering::Relaxed);
                    return Box::pin(self.run_python(slot, code, bounds, sink)).await;
                }
                _ => {}
            }
        }
        let oom_before = self.engine.oom_kills();
        let id = match session.send_exec(code).await {
            Ok(id) => id,
            Err(_) => {
                // The REPL died while idle; its death item is queued.
                slot.session = None;
                slot.lost_state = Some("died while idle".into());
                self.repl_restarts.fetch_add(1, Ordering::Relaxed);
                return Box::pin(self.run_python(slot, code, bounds, sink)).await;
            }
        };
        let deadline = tokio::time::Instant::now() + timeout;
        let mut interrupted: Option<Interrupt> = None;
        let kill_at = tokio::time::sleep(Duration::from_secs(u32::MAX as u64));
        tokio::pin!(kill_at);
        loop {
            tokio::select! {
                item = session.next() => match item {
                    Some(ReplItem::Stdout(b)) => sink.stdout(&b).await,
                    Some(ReplItem::Stderr(b)) => sink.stderr(&b).await,
                    Some(ReplItem::Result(v)) => sink.result(v).await,
                    Some(ReplItem::Display(v)) => sink.display(v).await,
                    Some(ReplItem::Done(d)) if d.id == id => {
                        sink.flush().await;
                        let code = if let Some(why) = interrupted {
                            interrupted_error(why, timeout, sink).await
                        } else {
                            if let Some(e) = d.error {
                                sink.error(format!("{}: {}", e.ename, e.evalue), Some(e.ename), Some(e.evalue), Some(e.traceback)).await;
                            }
                            d.exit_code
                        };
                        sink.exit(code).await;
                        slot.oom_seen = self.engine.oom_kills();
                        return;
                    }
                    Some(ReplItem::Done(_)) | Some(ReplItem::Forked(_)) => {}
                    Some(ReplItem::Died(status)) => {
                        self.on_repl_death(slot, status, oom_before, interrupted, timeout, sink).await;
                        return;
                    }
                    None => {
                        self.on_repl_death(slot, None, oom_before, interrupted, timeout, sink).await;
                        return;
                    }
                },
                why = stop_reason(deadline, bounds), if interrupted.is_none() => {
                    interrupted = Some(why);
                    session.signal(Signal::SIGINT);
                    kill_at.as_mut().reset(tokio::time::Instant::now() + self.settings.interrupt_grace);
                }
                _ = &mut kill_at, if interrupted.is_some() => {
                    session.signal(Signal::SIGKILL);
                    kill_at.as_mut().reset(tokio::time::Instant::now() + Duration::from_secs(3600));
                }
            }
        }
    }

    /// The REPL died during an exec: end the exec with a clear error and
    /// start a fresh REPL at once, so the next call does not wait for it.
    async fn on_repl_death(
        &self,
        slot: &mut ReplSlot,
        status: Option<ExitStatus>,
        oom_before: u64,
        interrupted: Option<Interrupt>,
        timeout: Duration,
        sink: &mut EventSink,
    ) {
        slot.session = None;
        let oom = self.engine.oom_kills() > oom_before;
        let reason = self.death_reason(status, oom);
        sink.flush().await;
        let code = match interrupted {
            Some(Interrupt::Timeout) => TIMEOUT_EXIT,
            Some(Interrupt::Shutdown) => SHUTDOWN_EXIT,
            Some(Interrupt::Cancelled) => CANCELLED_EXIT,
            None => status.map(|s| s.code()).filter(|c| *c != 0).unwrap_or(1),
        };
        let msg = match interrupted {
            Some(Interrupt::Timeout) => format!(
                "execution timed out after {} ms and did not stop when interrupted, so the Python process was killed; its state was lost",
                timeout.as_millis()
            ),
            Some(Interrupt::Shutdown) => "the server is shutting down; the execution did not stop when interrupted, so the Python process was killed".into(),
            Some(Interrupt::Cancelled) => "the client went away; the execution did not stop when interrupted, so the Python process was killed".into(),
            None => format!("the Python process {reason}; its state was lost"),
        };
        sink.error(msg, Some(if oom { "MemoryError".into() } else { "ReplDied".into() }), None, None).await;
        sink.exit(code).await;
        self.repl_restarts.fetch_add(1, Ordering::Relaxed);
        slot.lost_state = Some(match interrupted {
            Some(Interrupt::Timeout) => "was killed after a timeout".into(),
            Some(Interrupt::Shutdown) => "was killed when the server shut down".into(),
            Some(Interrupt::Cancelled) => "was killed when its client went away".into(),
            None => reason,
        });
        if let Ok(s) = self.restart_repl(slot.keep_ends).await {
            slot.session = Some(s);
        }
        slot.oom_seen = self.engine.oom_kills();
    }

    async fn restart_repl(&self, keep_ends: bool) -> Result<ReplSession, ReplError> {
        if self.is_destroyed() {
            return Err(ReplError::Destroyed);
        }
        start_repl_with(self.engine.as_ref(), &self.settings.setup, keep_ends).await
    }

    fn death_reason(&self, status: Option<ExitStatus>, oom: bool) -> String {
        if self.is_destroyed() {
            return "ended because the sandbox was destroyed".into();
        }
        if oom {
            return format!("was killed for using more than the sandbox's {} MiB of memory", self.settings.ram_mib);
        }
        match status {
            Some(ExitStatus::Signal(s)) => {
                let name = Signal::try_from(s).map(|s| s.as_str()).unwrap_or("?");
                format!("was killed by signal {s} ({name})")
            }
            Some(ExitStatus::Code(c)) => format!("exited with status {c}"),
            None => "died".into(),
        }
    }

    /// Run `code` in the REPL for the server's own purposes (a Space's
    /// freeze and thaw): nothing shows in the sandbox's replay. Returns its
    /// stdout, or why it failed.
    pub async fn run_hidden(&self, slot: &mut ReplSlot, code: &str, timeout: Duration) -> Result<String, String> {
        let (tx, mut rx) = tokio::sync::mpsc::channel(64);
        let sink = EventSink::new(tx, Default::default());
        let run = async move {
            let mut sink = sink;
            self.run_python(slot, code, &ExecBounds::timeout_only(timeout), &mut sink).await;
        };
        let collect = async move {
            let mut events = Vec::new();
            while let Some(ev) = rx.recv().await {
                events.push(ev);
            }
            events
        };
        let ((), events) = tokio::join!(run, collect);
        let mut stdout = String::new();
        let mut error = None;
        for ev in events {
            match ev.kind {
                protocol::EventKind::Stdout => {
                    stdout.push_str(ev.data.as_str().unwrap_or_default());
                    if ev.nl == Some(true) {
                        stdout.push('\n');
                    }
                }
                protocol::EventKind::Error => error = Some(ev.data.as_str().unwrap_or("failed").to_string()),
                _ => {}
            }
        }
        match error {
            Some(e) => Err(e),
            None => Ok(stdout),
        }
    }

    /// Run a fresh `bash -c` in the sandbox (cwd /root).
    pub async fn run_bash(&self, slot: &mut ReplSlot, code: &str, bounds: &ExecBounds, sink: &mut EventSink) {
        tell_notice(slot, sink).await;
        if let Err(e) = self.heal(slot).await {
            sink.error(e.to_string(), None, None, None).await;
            sink.exit(1).await;
            return;
        }
        tell_rebuilt(slot, sink).await;
        let argv = vec!["/bin/bash".to_string(), "-c".into(), code.to_string()];
        // One retry, only for a command that provably never started: init
        // may be dying when we hand it over (SIGKILL is not instant, and init
        // exits last in its namespace), after a kill(-1) from the REPL.
        for attempt in 0..2 {
            let spawned = match self.engine.spawn_command(argv.clone(), sandbox_env(&self.id, &self.settings.setup), "/root").await {
                Ok(cmd) => Some(cmd),
                Err(e) => {
                    tracing::warn!(sandbox = %self.id, err = %e, "bash spawn failed");
                    None
                }
            };
            let never_started = match spawned {
                Some(cmd) => match self.stream_command(cmd, bounds, sink).await {
                    CommandEnd::NeverStarted => true,
                    CommandEnd::Done => return,
                },
                None => true,
            };
            if never_started && attempt == 0 {
                self.engine.wait_init_gone(Duration::from_secs(3)).await;
                if self.heal(slot).await.is_ok() {
                    tell_rebuilt(slot, sink).await;
                    continue;
                }
            }
            break;
        }
        sink.error("could not start bash in the sandbox".into(), None, None, None).await;
        sink.exit(127).await;
    }

    /// Stream a running command's output into `sink` until it exits (not
    /// until EOF: a background child may hold the pipes open).
    async fn stream_command(&self, mut cmd: jail::CommandProcess, bounds: &ExecBounds, sink: &mut EventSink) -> CommandEnd {
        let timeout = bounds.timeout;
        let mut out = vec![0u8; 64 * 1024];
        let mut err = vec![0u8; 64 * 1024];
        let (mut out_open, mut err_open) = (true, true);
        let deadline = tokio::time::Instant::now() + timeout;
        let mut interrupted: Option<Interrupt> = None;
        let status = loop {
            tokio::select! {
                n = cmd.stdout.read(&mut out), if out_open => match n {
                    Ok(0) | Err(_) => out_open = false,
                    Ok(n) => sink.stdout(&out[..n]).await,
                },
                n = cmd.stderr.read(&mut err), if err_open => match n {
                    Ok(0) | Err(_) => err_open = false,
                    Ok(n) => sink.stderr(&err[..n]).await,
                },
                s = &mut cmd.exited => break s.ok(),
                why = stop_reason(deadline, bounds), if interrupted.is_none() => {
                    interrupted = Some(why);
                    cmd.kill().await;
                }
            }
        };
        // Everything bash wrote before it exited is in the pipes now; what
        // background children write later is not part of this call.
        for (pipe, is_out) in [(&mut cmd.stdout, true), (&mut cmd.stderr, false)] {
            let buf = if is_out { &mut out } else { &mut err };
            while let Some(n) = repl_host::session::read_now(pipe, buf) {
                if is_out {
                    sink.stdout(&buf[..n]).await
                } else {
                    sink.stderr(&buf[..n]).await
                }
            }
        }
        if let Some(why) = interrupted {
            let code = interrupted_error(why, timeout, sink).await;
            sink.exit(code).await;
            return CommandEnd::Done;
        }
        match status {
            Some(s) => sink.exit(s.code()).await,
            // The command's end was lost with init; if init never even
            // forked it, the caller may try again.
            None if cmd.started.try_recv().is_err() => return CommandEnd::NeverStarted,
            None => {
                sink.error("the sandbox ended while bash was running".into(), None, None, None).await;
                sink.exit(1).await;
            }
        }
        CommandEnd::Done
    }
}

/// Wait for whichever comes first: the exec's deadline or the drain's end.
async fn stop_reason(deadline: tokio::time::Instant, bounds: &ExecBounds) -> Interrupt {
    tokio::select! {
        _ = tokio::time::sleep_until(deadline) => Interrupt::Timeout,
        _ = bounds.stop.cancelled() => Interrupt::Shutdown,
        _ = bounds.cancel.cancelled() => Interrupt::Cancelled,
    }
}

/// Report an exec the server interrupted; returns its exit status.
async fn interrupted_error(why: Interrupt, timeout: Duration, sink: &mut EventSink) -> i32 {
    match why {
        Interrupt::Timeout => {
            sink.error(format!("execution timed out after {} ms", timeout.as_millis()), Some("TimeoutError".into()), None, None).await;
            TIMEOUT_EXIT
        }
        Interrupt::Shutdown => {
            let msg = "the server is shutting down and its drain time ran out, so this execution was interrupted";
            sink.error(msg.into(), Some("ServerShutdown".into()), None, None).await;
            SHUTDOWN_EXIT
        }
        Interrupt::Cancelled => {
            sink.error("the client went away, so this execution was interrupted".into(), Some("KeyboardInterrupt".into()), None, None).await;
            CANCELLED_EXIT
        }
    }
}

/// An exec still queued when the drain ran out: it ends without running.
pub async fn never_started_for_shutdown(sink: &mut EventSink) {
    let msg = "the server is shutting down and its drain time ran out before this execution could start; it did not run";
    sink.error(msg.into(), Some("ServerShutdown".into()), None, None).await;
    sink.exit(SHUTDOWN_EXIT).await;
}

/// How streaming a command ended.
enum CommandEnd {
    /// Its exit (or failure) was reported to the sink.
    Done,
    /// Init died before forking it: nothing ran, nothing was reported.
    NeverStarted,
}

/// Pass on, once, what the next exec must hear first.
async fn tell_notice(slot: &mut ReplSlot, sink: &mut EventSink) {
    if let Some(msg) = slot.notice.take() {
        sink.warning(msg).await;
    }
}

/// Tell a bash call, once, that the sandbox was rebuilt since the last one.
async fn tell_rebuilt(slot: &mut ReplSlot, sink: &mut EventSink) {
    if std::mem::take(&mut slot.rebuilt) {
        sink.warning(
            "[forkbox] the sandbox's init process (or its supervisor) died, so the sandbox was restarted with its files kept; its processes are gone".into(),
        )
        .await;
    }
}

pub fn new_entry(id: String, settings: Settings, engine: crate::engine::MemberRef, session: ReplSession, lineage: Vec<String>) -> Arc<SandboxEntry> {
    let slot = ReplSlot { session: Some(session), ..ReplSlot::empty(true) };
    Arc::new(entry_with(id, settings, engine, lineage, now_ms(), slot))
}

/// A sandbox entry with nothing run yet, created at `created_at`.
pub fn entry_with(id: String, settings: Settings, engine: crate::engine::MemberRef, lineage: Vec<String>, created_at: u64, slot: ReplSlot) -> SandboxEntry {
    let settings_timeout_ms = settings.timeout.as_millis() as u64;
    SandboxEntry {
        id,
        settings,
        engine,
        lineage: std::sync::Mutex::new(lineage),
        created_at,
        last_active: AtomicU64::new(now_ms()),
        execs: AtomicU64::new(0),
        repl_restarts: AtomicU64::new(0),
        replay: Default::default(),
        destroyed: AtomicBool::new(false),
        slot: Mutex::new(slot),
        busy: AtomicU64::new(0),
        port_connections: Default::default(),
        watches: Default::default(),
        ptys: Default::default(),
        processes: Default::default(),
        contexts: Default::default(),
        expires: AtomicU64::new(created_at.saturating_add(settings_timeout_ms)),
        egress: std::sync::Mutex::new(protocol::Egress::On(false)),
        network: Default::default(),
        checkpoints: Default::default(),
        freezing: AtomicBool::new(false),
    }
}

/// The entry that takes over `old`'s id, settings, lifetime and
/// checkpoints with `new`'s engine, REPL, PTYs and network (a merge, a
/// restore).
pub fn successor_entry(old: &SandboxEntry, new: &SandboxEntry, new_slot: &mut ReplSlot, lineage: Vec<String>) -> Arc<SandboxEntry> {
    let now = now_ms();
    Arc::new(SandboxEntry {
        id: old.id.clone(),
        settings: old.settings.clone(),
        engine: Arc::clone(&new.engine),
        lineage: std::sync::Mutex::new(lineage),
        created_at: old.created_at,
        last_active: AtomicU64::new(now),
        execs: AtomicU64::new(new.execs.load(Ordering::Relaxed)),
        repl_restarts: AtomicU64::new(new.repl_restarts.load(Ordering::Relaxed)),
        replay: Default::default(),
        destroyed: AtomicBool::new(false),
        slot: Mutex::new(ReplSlot {
            session: new_slot.session.take(),
            lost_state: new_slot.lost_state.take(),
            rebuilt: std::mem::take(&mut new_slot.rebuilt),
            notice: new_slot.notice.take(),
            oom_seen: new_slot.oom_seen,
            keep_ends: true,
        }),
        busy: AtomicU64::new(0),
        port_connections: Default::default(),
        watches: Default::default(),
        ptys: Arc::clone(&new.ptys),
        processes: Arc::clone(&new.processes),
        contexts: Default::default(),
        expires: AtomicU64::new(old.expires_at()),
        egress: std::sync::Mutex::new(new.egress.lock().unwrap_or_else(|e| e.into_inner()).clone()),
        network: Arc::clone(&new.network),
        checkpoints: Arc::clone(&old.checkpoints),
        freezing: AtomicBool::new(false),
    })
}

/// One unit of a per-sandbox cap (open watches, proxied connections),
/// given back when dropped.
pub struct CapSlot {
    entry: Arc<SandboxEntry>,
    count: fn(&SandboxEntry) -> &std::sync::atomic::AtomicUsize,
}

impl CapSlot {
    /// Take a unit of the counter `count` picks, or refuse (429) at `max`.
    pub fn take(
        entry: &Arc<SandboxEntry>,
        count: fn(&SandboxEntry) -> &std::sync::atomic::AtomicUsize,
        max: usize,
        refusal: impl FnOnce() -> String,
    ) -> Result<CapSlot, crate::error::Error> {
        if count(entry).fetch_add(1, Ordering::SeqCst) >= max {
            count(entry).fetch_sub(1, Ordering::SeqCst);
            return Err(crate::error::Error::Capacity(refusal()));
        }
        Ok(CapSlot { entry: Arc::clone(entry), count })
    }

    pub fn entry(&self) -> &Arc<SandboxEntry> {
        &self.entry
    }
}

impl Drop for CapSlot {
    fn drop(&mut self) {
        (self.count)(&self.entry).fetch_sub(1, Ordering::SeqCst);
    }
}
