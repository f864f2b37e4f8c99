//! The engine as the service sees it: the verbs it calls on the engine
//! (`Engine`) and on one sandbox the engine made (`Member`). `jail`
//! implements both (engine/jail.rs); the fake in engine/fake.rs stands in
//! for it in unit tests, which then run without root or a kernel.
//!
//! The traits use the engine's own vocabulary (`jail::SandboxSpec`,
//! `jail::Limits`, `jail::Error`, the process handles): those are plain
//! data, and keeping them avoids a translation layer that would only
//! copy fields. What the fake cannot do (files, commands, terminals,
//! networks) has a default that says so.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use jail::{ExitStatus, Limits, MemberRecord, ReplProcess, SandboxSpec};
use tokio::sync::oneshot;

mod jail_engine;

#[cfg(test)]
pub mod fake;

/// A sandbox the engine made, as the registry holds it.
pub type MemberRef = Arc<dyn Member>;

/// A new member made by `Engine::fork_members`, waiting for its REPL.
pub struct Forked {
    pub member: MemberRef,
    /// Its namespaces (the shim hands its own copies to the forked REPL).
    pub ns: Vec<OwnedFd>,
    /// Resolves with its REPL's exit status once that REPL dies.
    pub exited: oneshot::Receiver<ExitStatus>,
}

/// A member a previous server left running, taken over.
pub struct Adoption {
    pub member: MemberRef,
    /// The server's ends of its REPL, when one was running.
    pub repl: Option<ReplProcess>,
}

/// What the volume the sandboxes' files live on holds.
pub use jail::volume::Usage as VolumeUsage;

/// What the service asks of the engine.
#[async_trait::async_trait]
pub trait Engine: Send + Sync + 'static {
    /// Make a sandbox with no processes but its init.
    async fn create(&self, spec: SandboxSpec) -> jail::Result<MemberRef>;
    /// Kill a member's processes and free its files.
    async fn destroy(&self, member: &dyn Member) -> jail::Result<()>;

    /// Snapshot `parent`'s files into one new member per id (step one of a
    /// fork, docs/fork.md); their REPLs come from `parent`'s REPL (host pid
    /// `repl`) forking, which may start before their roots are attached, or
    /// even before the snapshot is taken (`jail::Rooting`).
    async fn fork_members(&self, parent: &dyn Member, ids: &[String], repl: Option<i32>) -> jail::Result<(Vec<Forked>, jail::Rooting)>;
    /// Members for `sibling`'s family with `limits`, for the warm pool.
    async fn spare_members(&self, sibling: &dyn Member, ids: &[String], limits: &Limits) -> jail::Result<Vec<Forked>>;
    /// Hand the supervisor child `slot`'s descriptors for the REPL that
    /// `parent_repl` (a host pid) is about to fork.
    async fn expect_fork(&self, parent: &dyn Member, parent_repl: i32, slot: usize, child: &dyn Member, fds: &[BorrowedFd<'_>]) -> jail::Result<()>;
    /// The forked REPLs of `children`, as host pids and pidfds, in order.
    async fn adopt_forks(&self, parent: &dyn Member, parent_repl: i32, children: &[&dyn Member]) -> jail::Result<Vec<(i32, OwnedFd)>>;
    /// Build up to `target` spare members for `member`'s family's next fork.
    async fn refill_hollows(&self, member: &dyn Member, target: usize, new_id: &(dyn Fn() -> String + Sync)) -> jail::Result<()>;
    /// No more refills (shutdown); waits for those in flight.
    async fn stop_refills(&self);
    /// Ids of the spare members it holds.
    fn spare_ids(&self) -> Vec<String>;

    /// Dump solo `member`'s every process into `images` (criu); see
    /// `jail::AfterDump` for what becomes of it.
    async fn dump(&self, _member: &dyn Member, _criu: &criu::Criu, _images: &Path, _after: jail::AfterDump) -> jail::Result<jail::Edges> {
        Err(unsupported("dumping a sandbox's processes"))
    }
    /// A new solo member from `dump`'s images, with its REPL when one was
    /// dumped; `lazily`, running before its memory is all in.
    async fn restore(
        &self,
        _spec: SandboxSpec,
        _images: &Path,
        _edges: &jail::Edges,
        _criu: &criu::Criu,
        _lazily: bool,
    ) -> jail::Result<(MemberRef, Option<ReplProcess>)> {
        Err(unsupported("restoring a sandbox's processes"))
    }

    /// Take over the members a previous server left running (`records`,
    /// one result each, in order), and clear away everything else it left.
    async fn take_over(&self, records: &[MemberRecord]) -> jail::Result<Vec<jail::Result<Adoption>>>;

    /// The volume's usage (Err: it has none to report).
    fn volume_usage(&self) -> jail::Result<VolumeUsage>;
    /// Remove the leftovers of destroyed members (blocking; called often).
    fn sweep(&self);
    /// Keep the sandboxes running when the server exits (an upgrade).
    fn leave_running(&self);
    fn is_left_running(&self) -> bool;
    /// Release what the engine holds, once every member is destroyed.
    fn close(&self) -> jail::Result<()>;
}

/// What the service asks of one member.
#[async_trait::async_trait]
pub trait Member: Send + Sync + 'static {
    fn id(&self) -> &str;
    /// For an engine to find its own type behind a `&dyn Member`.
    fn as_any(&self) -> &dyn std::any::Any;

    /// Freeze every process (blocking).
    fn pause(&self) -> jail::Result<()>;
    fn resume(&self) -> jail::Result<()>;
    fn is_paused(&self) -> bool;
    /// A solo member (`SandboxSpec::solo`): criu can dump it; it forks
    /// through criu (process_fork.rs), not `fork_members`.
    fn is_solo(&self) -> bool {
        false
    }

    /// Start its REPL: `argv`/`env` with the fd layout of
    /// docs/repl-protocol.md, `source` offered on fd 4.
    async fn start_repl(&self, argv: Vec<String>, env: Vec<String>, cwd: &str, source: &[u8]) -> jail::Result<ReplProcess>;
    /// Have its supervisor keep the server's ends of a REPL, so it
    /// survives a server restart.
    async fn keep_repl_ends(&self, repl_host_pid: i32, ends: [OwnedFd; 3]) -> jail::Result<()>;
    /// Descriptors a forked REPL uses to join its cgroup (may be none).
    fn self_join_fds(&self) -> Vec<OwnedFd>;
    fn same_family(&self, other: &dyn Member) -> bool;
    /// What a restarted server needs to adopt it.
    fn record(&self) -> MemberRecord;

    fn limits(&self) -> Limits;
    fn set_limits(&self, limits: &Limits) -> jail::Result<()>;
    /// Its cgroup (None: the engine has none, so no usage to report).
    fn cgroup(&self) -> Option<&jail::cgroup::Cgroup>;
    /// How often the kernel's OOM killer struck in it.
    fn oom_kills(&self) -> u64 {
        self.cgroup().map_or(0, |c| c.oom_kills())
    }
    fn memory_usage(&self) -> u64 {
        self.cgroup().map_or(0, |c| c.memory_usage())
    }
    fn cpu_usage_ns(&self) -> u64 {
        self.cgroup().map_or(0, |c| c.cpu_usage_ns())
    }

    /// Whether its init still runs.
    fn init_alive(&self) -> bool;
    /// Wait up to `limit` for its init to be gone; whether it is.
    async fn wait_init_gone(&self, limit: Duration) -> bool;
    /// Build its processes again over the same files (after init died).
    async fn rebuild(&self) -> jail::Result<()>;

    /// Its upper layer and the template root under it.
    fn layers(&self) -> (PathBuf, PathBuf);
    /// Copy its upper layer (every file it changed) to `dst`.
    fn export_upper(&self, dst: &Path) -> jail::Result<jail::Copied>;

    fn fs(&self) -> jail::Result<jail::fs::SandboxFs> {
        Err(unsupported("files"))
    }
    async fn spawn_command(&self, _argv: Vec<String>, _env: Vec<String>, _cwd: &str) -> jail::Result<jail::CommandProcess> {
        Err(unsupported("commands"))
    }
    /// A command whose stdin is a pipe when `stdin` (E2B's processes).
    async fn spawn_piped(&self, _argv: Vec<String>, _env: Vec<String>, _cwd: &str, _stdin: bool, _run_as: jail::RunAs) -> jail::Result<jail::CommandProcess> {
        Err(unsupported("commands"))
    }
    async fn spawn_terminal(
        &self,
        _argv: Vec<String>,
        _env: Vec<String>,
        _cwd: &str,
        _size: jail::pty::Size,
        _run_as: jail::RunAs,
    ) -> jail::Result<jail::TerminalProcess> {
        Err(unsupported("terminals"))
    }
    fn netns(&self) -> jail::Result<OwnedFd> {
        Err(unsupported("networks"))
    }
    async fn connect_port(&self, _port: u16, _timeout: Duration) -> Result<(tokio::net::TcpStream, std::net::SocketAddr), jail::ports::PortError> {
        Err(jail::ports::PortError::Unreachable(unsupported("ports").to_string()))
    }
    /// Give it the network and rules asked for (blocking): its pasta, when
    /// started, and its network namespace.
    fn set_up_network(&self, _rules: &jail::net::Rules, _need_pasta: bool, _need_rules: bool) -> jail::Result<(Option<jail::net::Pasta>, OwnedFd)> {
        Err(unsupported("networks"))
    }
    /// Point its resolver at the egress proxy's DNS (blocking).
    fn point_resolver(&self) -> jail::Result<()> {
        Err(unsupported("networks"))
    }
    /// Hold its network sockets until [`open_network`](Self::open_network);
    /// resolves when one waits (`jail::Sandbox::hold_network`). `None`: it
    /// cannot, start its way out ahead.
    async fn hold_network(&self) -> jail::Result<Option<tokio::sync::oneshot::Receiver<()>>> {
        Ok(None)
    }
    /// Let its network sockets through.
    async fn open_network(&self) -> jail::Result<()> {
        Ok(())
    }
}

fn unsupported(what: &str) -> jail::Error {
    jail::Error::Unsupported(format!("this engine has no {what}"))
}
