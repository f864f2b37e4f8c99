//! An engine that makes no sandboxes: its members are directories, their
//! REPLs are `repl_host::fake` tasks, and what a kernel would hold (a
//! pidfd per REPL) is a `sleep` child of the test. Any verb can be told
//! to fail once (`FakeEngine::fail`), so every step of the lifecycle can
//! be made to go wrong and what is left behind checked (`live`).

use std::collections::{BTreeSet, HashMap};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jail::{ExitStatus, Limits, MemberRecord, ReplProcess, SandboxSpec};
use repl_host::fake::{OnExec, OnFork, Reply};
use tokio::sync::oneshot;

use super::{Adoption, Engine, Forked, Member, MemberRef, VolumeUsage};

/// A verb of the fake that can be made to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    Create,
    Destroy,
    StartRepl,
    ForkMembers,
    SpareMembers,
    ExpectFork,
    AdoptForks,
    /// A forked child's REPL hangs up instead of saying it is ready.
    ChildReady,
    /// The parent REPL refuses the fork.
    ForkRefused,
    /// The parent REPL forks one child fewer than asked.
    ForkShort,
    Pause,
    Resume,
}

/// What the fake engine knows; shared by its clones and its members.
struct Shared {
    dir: tempfile::TempDir,
    /// Faults armed, each with how many calls it still fails.
    faults: Mutex<HashMap<Fault, usize>>,
    on_exec: Mutex<OnExec>,
    /// Ids of the members not destroyed yet.
    live: Mutex<BTreeSet<String>>,
    /// Calls per verb, in order (`create sb-…`, `destroy sb-…`, …).
    calls: Mutex<Vec<String>>,
    families: AtomicU64,
    left_running: AtomicBool,
}

impl Shared {
    /// Whether `fault` is armed; disarms one use of it.
    fn trips(&self, fault: Fault) -> bool {
        let mut faults = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        match faults.get_mut(&fault) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }

    fn check(&self, fault: Fault) -> jail::Result<()> {
        match self.trips(fault) {
            true => Err(jail::Error::Failed(format!("fake engine: {fault:?} fails"))),
            false => Ok(()),
        }
    }

    fn log(&self, call: String) {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).push(call);
    }

    fn on_exec(&self) -> OnExec {
        Arc::clone(&self.on_exec.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The fake engine (cheap to clone: clones share everything).
#[derive(Clone)]
pub struct FakeEngine {
    shared: Arc<Shared>,
}

impl Default for FakeEngine {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeEngine {
    /// REPLs that print what they ran and finish with exit code 0.
    pub fn new() -> FakeEngine {
        let echo: OnExec = Arc::new(|code| Reply::Ok { stdout: format!("ran {code}\n").into_bytes(), exit_code: 0 });
        FakeEngine {
            shared: Arc::new(Shared {
                dir: tempfile::tempdir().expect("a temporary directory"),
                faults: Default::default(),
                on_exec: Mutex::new(echo),
                live: Default::default(),
                calls: Default::default(),
                families: AtomicU64::new(0),
                left_running: AtomicBool::new(false),
            }),
        }
    }

    /// Make the next `times` calls of `fault`'s verb fail.
    pub fn fail(&self, fault: Fault, times: usize) {
        self.shared.faults.lock().unwrap_or_else(|e| e.into_inner()).insert(fault, times);
    }

    /// How REPLs started from now on answer execs.
    pub fn on_exec(&self, on_exec: OnExec) {
        *self.shared.on_exec.lock().unwrap_or_else(|e| e.into_inner()) = on_exec;
    }

    /// Ids of the members made and not destroyed.
    pub fn live(&self) -> BTreeSet<String> {
        self.shared.live.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The verbs called so far, with the member each was about.
    pub fn calls(&self) -> Vec<String> {
        self.shared.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn member(&self, id: &str, family: u64, limits: Limits, files_from: Option<&Path>) -> jail::Result<Arc<FakeMember>> {
        let upper = self.shared.dir.path().join(id);
        match files_from {
            Some(from) => copy_tree(from, &upper).map(drop).map_err(|e| jail::Error::io("copy the files", e))?,
            None => std::fs::create_dir_all(&upper).map_err(|e| jail::Error::io("make the files", e))?,
        }
        self.shared.live.lock().unwrap_or_else(|e| e.into_inner()).insert(id.to_string());
        Ok(Arc::new(FakeMember {
            id: id.to_string(),
            family,
            upper,
            limits: Mutex::new(limits),
            paused: AtomicBool::new(false),
            processes: Default::default(),
            repls: Default::default(),
            repl_exit: Default::default(),
            shared: Arc::clone(&self.shared),
        }))
    }

    /// One new member per id in `from`'s family, with `from`'s files.
    fn members_like(&self, from: &dyn Member, ids: &[String], limits: &Limits) -> jail::Result<Vec<Forked>> {
        let from = own(from)?;
        let mut made = Vec::with_capacity(ids.len());
        for id in ids {
            let member = self.member(id, from.family, *limits, Some(&from.upper))?;
            let (tx, exited) = oneshot::channel();
            *member.repl_exit.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
            made.push(Forked { member, ns: Vec::new(), exited });
        }
        Ok(made)
    }
}

fn own(member: &dyn Member) -> jail::Result<&FakeMember> {
    member.as_any().downcast_ref::<FakeMember>().ok_or_else(|| jail::Error::Invalid(format!("`{}` is not a fake member", member.id())))
}

/// A member: its files are a directory, its processes `sleep`s.
pub struct FakeMember {
    id: String,
    family: u64,
    upper: PathBuf,
    limits: Mutex<Limits>,
    paused: AtomicBool,
    /// Stand-ins for its REPLs' processes, killed when it is destroyed
    /// or dropped.
    processes: Mutex<Vec<tokio::process::Child>>,
    /// Its fake REPLs, killed with it.
    repls: Mutex<Vec<repl_host::fake::Kill>>,
    /// A forked member's REPL exit, sent once its fake REPL ends.
    repl_exit: Mutex<Option<oneshot::Sender<ExitStatus>>>,
    shared: Arc<Shared>,
}

impl FakeMember {
    /// A host process for a REPL's pidfd: (host pid, pidfd).
    fn stand_in(&self) -> jail::Result<(i32, OwnedFd)> {
        let child = tokio::process::Command::new("sleep").arg("600").kill_on_drop(true).spawn().map_err(|e| jail::Error::io("spawn sleep", e))?;
        let pid = child.id().unwrap_or_default() as i32;
        let pidfd = jail::sys::pidfd_open(nix::unistd::Pid::from_raw(pid)).map_err(|e| jail::Error::sys("pidfd_open", e))?;
        self.processes.lock().unwrap_or_else(|e| e.into_inner()).push(child);
        Ok((pid, pidfd))
    }

    fn on_fork(&self) -> OnFork {
        let shared = Arc::clone(&self.shared);
        Arc::new(move |n| {
            if shared.trips(Fault::ForkRefused) {
                return Err("fake engine: the REPL refuses to fork".into());
            }
            let n = if shared.trips(Fault::ForkShort) { n.saturating_sub(1) } else { n };
            Ok((0..n as i64).map(|i| 100 + i).collect())
        })
    }
}

#[async_trait::async_trait]
impl Engine for FakeEngine {
    async fn create(&self, spec: SandboxSpec) -> jail::Result<MemberRef> {
        self.shared.log(format!("create {}", spec.id));
        self.shared.check(Fault::Create)?;
        let family = self.shared.families.fetch_add(1, Ordering::Relaxed);
        Ok(self.member(&spec.id, family, spec.limits, spec.initial_upper.as_deref())?)
    }

    async fn destroy(&self, member: &dyn Member) -> jail::Result<()> {
        self.shared.log(format!("destroy {}", member.id()));
        self.shared.check(Fault::Destroy)?;
        let member = own(member)?;
        member.processes.lock().unwrap_or_else(|e| e.into_inner()).clear();
        member.repls.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let _ = std::fs::remove_dir_all(&member.upper);
        self.shared.live.lock().unwrap_or_else(|e| e.into_inner()).remove(&member.id);
        Ok(())
    }

    async fn fork_members(&self, parent: &dyn Member, ids: &[String], _repl: Option<i32>) -> jail::Result<(Vec<Forked>, jail::Rooting)> {
        self.shared.log(format!("fork_members {}", parent.id()));
        self.shared.check(Fault::ForkMembers)?;
        Ok((self.members_like(parent, ids, &parent.limits())?, jail::Rooting::done()))
    }

    async fn spare_members(&self, sibling: &dyn Member, ids: &[String], limits: &Limits) -> jail::Result<Vec<Forked>> {
        self.shared.log(format!("spare_members {}", sibling.id()));
        self.shared.check(Fault::SpareMembers)?;
        self.members_like(sibling, ids, limits)
    }

    async fn expect_fork(&self, parent: &dyn Member, _parent_repl: i32, _slot: usize, child: &dyn Member, fds: &[BorrowedFd<'_>]) -> jail::Result<()> {
        self.shared.log(format!("expect_fork {}", child.id()));
        self.shared.check(Fault::ExpectFork)?;
        let (parent, child) = (own(parent)?, own(child)?);
        let [control, stdout, stderr] = match fds {
            [c, o, e, ..] => [c, o, e].map(|fd| fd.try_clone_to_owned()),
            _ => return Err(jail::Error::Invalid("a fork child needs its three channels".into())),
        };
        let io = |e| jail::Error::io("take a fork child's channels", e);
        let (control, stdout, stderr) = (control.map_err(io)?, stdout.map_err(io)?, stderr.map_err(io)?);
        if self.shared.trips(Fault::ChildReady) {
            // Its ends close here: the child never says it is ready.
            return Ok(());
        }
        let control = std::os::unix::net::UnixStream::from(control);
        control.set_nonblocking(true).map_err(io)?;
        let control = tokio::net::UnixStream::from_std(control).map_err(io)?;
        let stdout = tokio::net::unix::pipe::Sender::from_owned_fd(stdout).map_err(io)?;
        let stderr = tokio::net::unix::pipe::Sender::from_owned_fd(stderr).map_err(io)?;
        // The forked REPL has its parent's behaviour and says ready at once;
        // the server reads that only after the parent's answer.
        let (exited, kill) = repl_host::fake::serve_on(control, stdout, stderr, self.shared.on_exec(), parent.on_fork(), Default::default());
        child.repls.lock().unwrap_or_else(|e| e.into_inner()).push(kill);
        if let Some(tx) = child.repl_exit.lock().unwrap_or_else(|e| e.into_inner()).take() {
            tokio::spawn(async move {
                if let Ok(status) = exited.await {
                    let _ = tx.send(status);
                }
            });
        }
        Ok(())
    }

    async fn adopt_forks(&self, parent: &dyn Member, _parent_repl: i32, children: &[&dyn Member]) -> jail::Result<Vec<(i32, OwnedFd)>> {
        self.shared.log(format!("adopt_forks {}", parent.id()));
        self.shared.check(Fault::AdoptForks)?;
        children.iter().map(|c| own(*c).and_then(|c| c.stand_in())).collect()
    }

    async fn refill_hollows(&self, _member: &dyn Member, _target: usize, _new_id: &(dyn Fn() -> String + Sync)) -> jail::Result<()> {
        Ok(())
    }

    async fn stop_refills(&self) {}

    fn spare_ids(&self) -> Vec<String> {
        Vec::new()
    }

    async fn take_over(&self, records: &[MemberRecord]) -> jail::Result<Vec<jail::Result<Adoption>>> {
        Ok(records.iter().map(|r| Err(jail::Error::NotAdopted(format!("fake engine: `{}` did not survive", r.member)))).collect())
    }

    fn volume_usage(&self) -> jail::Result<VolumeUsage> {
        Err(jail::Error::Unsupported("fake engine: no volume".into()))
    }

    fn sweep(&self) {}

    fn leave_running(&self) {
        self.shared.left_running.store(true, Ordering::SeqCst);
    }

    fn is_left_running(&self) -> bool {
        self.shared.left_running.load(Ordering::SeqCst)
    }

    fn close(&self) -> jail::Result<()> {
        Ok(())
    }
}

#[async_trait::async_trait]
impl Member for FakeMember {
    fn id(&self) -> &str {
        &self.id
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn pause(&self) -> jail::Result<()> {
        self.shared.check(Fault::Pause)?;
        self.paused.store(true, Ordering::SeqCst);
        Ok(())
    }

    fn resume(&self) -> jail::Result<()> {
        self.shared.check(Fault::Resume)?;
        self.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    async fn start_repl(&self, _argv: Vec<String>, _env: Vec<String>, _cwd: &str, _source: &[u8]) -> jail::Result<ReplProcess> {
        self.shared.log(format!("start_repl {}", self.id));
        self.shared.check(Fault::StartRepl)?;
        let ends = repl_host::fake::spawn(self.shared.on_exec(), self.on_fork()).map_err(|e| jail::Error::io("start a fake REPL", e))?;
        let (host_pid, pidfd) = self.stand_in()?;
        self.repls.lock().unwrap_or_else(|e| e.into_inner()).push(ends.kill);
        Ok(ReplProcess { control: ends.control, stdout: ends.stdout, stderr: ends.stderr, pidfd, host_pid, exited: ends.exited })
    }

    async fn keep_repl_ends(&self, _repl_host_pid: i32, _ends: [OwnedFd; 3]) -> jail::Result<()> {
        Ok(())
    }

    fn self_join_fds(&self) -> Vec<OwnedFd> {
        Vec::new()
    }

    fn same_family(&self, other: &dyn Member) -> bool {
        own(other).is_ok_and(|o| o.family == self.family)
    }

    fn record(&self) -> MemberRecord {
        let family = serde_json::json!({"family": format!("fake-{}", self.family), "id_base": 0, "id_count": 0, "template_rootfs": "/", "run_dir": "/"});
        MemberRecord { member: self.id.clone(), family: serde_json::from_value(family).expect("a family record"), limits: self.limits() }
    }

    fn limits(&self) -> Limits {
        *self.limits.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_limits(&self, limits: &Limits) -> jail::Result<()> {
        *self.limits.lock().unwrap_or_else(|e| e.into_inner()) = *limits;
        Ok(())
    }

    fn cgroup(&self) -> Option<&jail::cgroup::Cgroup> {
        None
    }

    fn init_alive(&self) -> bool {
        true
    }

    async fn wait_init_gone(&self, _limit: Duration) -> bool {
        false
    }

    async fn rebuild(&self) -> jail::Result<()> {
        Ok(())
    }

    fn layers(&self) -> (PathBuf, PathBuf) {
        (self.upper.clone(), PathBuf::from("/nonexistent-template"))
    }

    fn export_upper(&self, dst: &Path) -> jail::Result<jail::Copied> {
        copy_tree(&self.upper, dst).map_err(|e| jail::Error::io("copy the upper layer", e))
    }
}

/// Copy the regular files and directories under `src` to `dst`.
fn copy_tree(src: &Path, dst: &Path) -> std::io::Result<jail::Copied> {
    let mut copied = jail::Copied { entries: 0, bytes: 0 };
    std::fs::create_dir_all(dst)?;
    for entry in std::fs::read_dir(src)? {
        let entry = entry?;
        let to = dst.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            let below = copy_tree(&entry.path(), &to)?;
            copied.entries += below.entries + 1;
            copied.bytes += below.bytes;
        } else {
            copied.bytes += std::fs::copy(entry.path(), &to)?;
            copied.entries += 1;
        }
    }
    Ok(copied)
}
