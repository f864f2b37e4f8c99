//! Per-sandbox cgroups on cgroup v1 (one hierarchy per controller) or v2
//! (unified). Each sandbox gets `forkbox-<instance>/<name>` with a memory limit, a pids
//! limit and the default CPU share; every process of the sandbox joins it,
//! which is also how destroy finds and kills all of them.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::error::{Error, Result};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
/// The v1 controllers we use; each is its own hierarchy, or shares one
/// with another (`cpu,cpuacct`: then both names lead to one directory,
/// which create, join and remove all tolerate).
const V1_CONTROLLERS: [&str; 5] = ["memory", "pids", "cpu", "freezer", "cpuacct"];
/// The v1 controllers a sandbox cannot do without. `cpuacct` is used
/// where it is mounted (CPU time that counts exited processes); a host
/// without it, or a cgroup made by a server before it counted CPU time,
/// sums the live processes' time instead.
const V1_ESSENTIAL: usize = 4;

/// Resource limits of one sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Limits {
    pub memory_bytes: u64,
    pub pids: u64,
    /// Relative CPU weight, 1..=10000 (100 = an ordinary process group).
    pub cpu_weight: u64,
    /// What the sandbox may write to its layer, in bytes (its subvolume's
    /// quota; not a cgroup limit); 0: no limit. Absent from the records
    /// of servers before quotas.
    #[serde(default)]
    pub disk_bytes: u64,
}

impl Limits {
    /// Whether `other` differs in what the cgroup enforces.
    pub fn cgroup_differs(&self, other: &Limits) -> bool {
        (self.memory_bytes, self.pids, self.cpu_weight) != (other.memory_bytes, other.pids, other.cpu_weight)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// The host's cgroup hierarchy.
#[derive(Debug, Clone)]
pub struct Cgroups {
    version: Version,
    root: PathBuf,
    /// `forkbox-<instance>`: one parent per server instance, so a server
    /// cleaning up after a crash never touches another server's sandboxes.
    parent: String,
}

/// The CPU weight of the families' supervisors' cgroup: an ordinary one.
/// It sits beside the sandboxes' parent, so under contention the
/// supervisors together get as much CPU as all the sandboxes together.
/// Every create, fork, exec and destroy goes through a supervisor; among
/// the sandboxes' groups (the server's cgroup, before) they queued behind
/// busy sandboxes. The most weight there is (10000) served bench/load.py's
/// forks and destroys, but cost a fifth of bench/churn.py's throughput
/// against this one, which serves both better (docs/fork.md).
pub const SUPERVISOR_CPU_WEIGHT: u64 = 100;

/// The CPU weight of a new member's cgroup while its init sets it up
/// (mounts, namespaces), the most there is: at a sandbox's, behind every
/// busy sandbox, a member took 0.3 s at the median and 2.6 s at p99 to
/// build (bench/load.py). Only init runs in it at that weight.
pub const MEMBER_SETUP_CPU_WEIGHT: u64 = 10_000;

/// The cgroup of the families' supervisors (`Cgroups::supervisors`).
#[derive(Debug, Clone)]
pub struct SupervisorGroup {
    dir: PathBuf,
}

impl SupervisorGroup {
    /// Move process `pid` (all its threads) into the group.
    pub fn place(&self, pid: u32) -> Result<()> {
        write(&self.dir.join("cgroup.procs"), &pid.to_string())
    }
}

/// One sandbox's cgroup (a directory per hierarchy on v1, one on v2).
#[derive(Debug, Clone)]
pub struct Cgroup {
    version: Version,
    dirs: Vec<PathBuf>,
}

impl Cgroups {
    pub fn detect(instance: &str) -> Result<Cgroups> {
        Self::at(Path::new(CGROUP_ROOT), instance)
    }

    fn at(root: &Path, instance: &str) -> Result<Cgroups> {
        let st = nix::sys::statfs::statfs(root).map_err(|e| Error::sys("statfs cgroup root", e))?;
        let version = if st.filesystem_type().0 as i64 == CGROUP2_SUPER_MAGIC { Version::V2 } else { Version::V1 };
        let cg = Cgroups { version, root: root.to_path_buf(), parent: format!("forkbox-{instance}") };
        cg.prepare_parent()?;
        Ok(cg)
    }

    pub fn version(&self) -> Version {
        self.version
    }

    fn parents(&self) -> Vec<PathBuf> {
        match self.version {
            Version::V2 => vec![self.root.join(&self.parent)],
            Version::V1 => V1_CONTROLLERS
                .iter()
                .enumerate()
                .filter(|(i, c)| *i < V1_ESSENTIAL || self.root.join(c).join("cgroup.procs").exists())
                .map(|(_, c)| self.root.join(c).join(&self.parent))
                .collect(),
        }
    }

    fn prepare_parent(&self) -> Result<()> {
        if self.version == Version::V1 {
            for c in &V1_CONTROLLERS[..V1_ESSENTIAL] {
                if !self.root.join(c).join("cgroup.procs").exists() {
                    return Err(Error::Unsupported(format!("cgroup v1 controller `{c}` is not mounted at {}", self.root.display())));
                }
            }
        }
        for dir in self.parents() {
            fs::create_dir_all(&dir).map_err(|e| Error::io("create cgroup parent", e))?;
        }
        if self.version == Version::V1 {
            self.keep_freezer_on()?;
        }
        if self.version == Version::V2 {
            // Controllers must be enabled on every level above a leaf.
            for dir in [self.root.clone(), self.root.join(&self.parent)] {
                write(&dir.join("cgroup.subtree_control"), "+memory +pids +cpu")?;
            }
        }
        Ok(())
    }

    /// Create `forkbox/<name>` with `limits`.
    pub fn create(&self, name: &str, limits: &Limits) -> Result<Cgroup> {
        // Someone (an admin tidying up) may have removed our empty parent.
        if self.parents().iter().any(|p| !p.exists()) {
            self.prepare_parent()?;
        }
        let cg = Cgroup { version: self.version, dirs: self.parents().into_iter().map(|p| p.join(name)).collect() };
        for dir in &cg.dirs {
            match fs::create_dir(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(Error::io("create cgroup", e)),
            }
        }
        cg.set_limits(limits)?;
        Ok(cg)
    }

    /// Names of the sandbox cgroups that exist now (e.g. left by a crash).
    pub fn existing(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .parents()
            .iter()
            .filter_map(|p| fs::read_dir(p).ok())
            .flat_map(|rd| rd.filter_map(|e| e.ok()))
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// Remove this server's (empty) parent cgroups, at shutdown.
    pub fn remove_parent(&self) {
        for dir in self.parents() {
            let _ = fs::remove_dir(dir);
        }
        if self.version == Version::V1 {
            let _ = fs::remove_dir(self.freezer_anchor());
        }
        // Still busy while families wait for the next server to adopt them.
        let _ = fs::remove_dir(self.supervisors_dir());
    }

    fn supervisors_dir(&self) -> PathBuf {
        let hierarchy = match self.version {
            Version::V1 => self.root.join("cpu"),
            Version::V2 => self.root.clone(),
        };
        hierarchy.join(format!("{}.supervisors", self.parent))
    }

    /// v1: an empty cgroup, beside the parent, kept frozen for the server's
    /// life. The kernel turns a machine-wide static key (`freezer_active`)
    /// on when the first cgroup starts freezing and off when the last thaws,
    /// by patching kernel text on every CPU with IPIs. A server whose v1
    /// freezes were all short (a fork's parent, a destroy's `kill_all`)
    /// flipped it twice per freeze: 6% of all CPU under bench/load.py, on
    /// the server's workers. With the key left on, a freeze is a write.
    /// (v2's freezer has no such key.)
    fn keep_freezer_on(&self) -> Result<()> {
        let anchor = self.freezer_anchor();
        fs::create_dir_all(&anchor).map_err(|e| Error::io("create the freezer anchor cgroup", e))?;
        write(&anchor.join("freezer.state"), "FROZEN")
    }

    /// Where [`Self::keep_freezer_on`]'s cgroup lives: outside the parent,
    /// so it is never taken for a sandbox's.
    fn freezer_anchor(&self) -> PathBuf {
        self.root.join("freezer").join(format!("{}.freezer-on", self.parent))
    }

    /// The cgroup the families' supervisors (`__shim` processes) run in,
    /// made if missing: beside the parent, so it is never taken for a
    /// sandbox's, in the CPU controller alone, at `SUPERVISOR_CPU_WEIGHT`.
    pub fn supervisors(&self) -> Result<SupervisorGroup> {
        let dir = self.supervisors_dir();
        fs::create_dir_all(&dir).map_err(|e| Error::io("create the supervisors' cgroup", e))?;
        write(&dir.join(weight_file_name(self.version)), &weight_value(self.version, SUPERVISOR_CPU_WEIGHT).to_string())?;
        Ok(SupervisorGroup { dir })
    }

    /// The cgroup of an existing sandbox (without creating it).
    pub fn open(&self, name: &str) -> Cgroup {
        Cgroup { version: self.version, dirs: self.parents().into_iter().map(|p| p.join(name)).collect() }
    }
}

impl Cgroup {
    pub fn version(&self) -> Version {
        self.version
    }

    fn dir(&self, controller: &str) -> &Path {
        self.optional_dir(controller).unwrap_or(&self.dirs[0])
    }

    /// The directory of `controller`, if this cgroup has one (v1 `cpuacct`
    /// may be missing).
    fn optional_dir(&self, controller: &str) -> Option<&Path> {
        match self.version {
            Version::V2 => Some(&self.dirs[0]),
            Version::V1 => self.dirs.get(V1_CONTROLLERS.iter().position(|c| *c == controller)?).map(PathBuf::as_path),
        }
    }

    /// Write the limits (at creation, and when a spare is handed out).
    pub fn set_limits(&self, l: &Limits) -> Result<()> {
        match self.version {
            Version::V1 => {
                // memory.limit_in_bytes may never exceed memsw's (the file that
                // exists with swap accounting; it says: no swap), so a raise
                // writes memsw first and a cut writes it last.
                let mem = self.dir("memory").join("memory.limit_in_bytes");
                let memsw = self.dir("memory").join("memory.memsw.limit_in_bytes");
                let value = l.memory_bytes.to_string();
                if write(&mem, &value).is_err() && memsw.exists() {
                    write(&memsw, &value)?;
                    write(&mem, &value)?;
                }
                if memsw.exists() {
                    write(&memsw, &value)?;
                }
                write(&self.dir("pids").join("pids.max"), &l.pids.to_string())?;
            }
            Version::V2 => {
                let d = &self.dirs[0];
                write(&d.join("memory.max"), &l.memory_bytes.to_string())?;
                let swap = d.join("memory.swap.max");
                if swap.exists() {
                    write(&swap, "0")?;
                }
                // Kill only the biggest process on OOM, never the whole group.
                write(&d.join("memory.oom.group"), "0")?;
                write(&d.join("pids.max"), &l.pids.to_string())?;
            }
        }
        // An idle-class group (the server's CPU boost put it there) takes no weight.
        if self.cpu_idle() == Some(true) {
            self.set_cpu_idle(false)?;
        }
        self.set_cpu_weight(l.cpu_weight)
    }

    /// The cgroup's CPU weight file: v1 `cpu.shares` (1024 for a weight
    /// of 100), v2 `cpu.weight`.
    fn cpu_weight_file(&self) -> PathBuf {
        self.dir("cpu").join(weight_file_name(self.version))
    }

    /// Set the relative CPU weight alone (100 = an ordinary group).
    pub fn set_cpu_weight(&self, weight: u64) -> Result<()> {
        write(&self.cpu_weight_file(), &weight_value(self.version, weight).to_string())
    }

    /// The relative CPU weight in force now, as `set_cpu_weight` takes it.
    pub fn cpu_weight(&self) -> Option<u64> {
        let value: u64 = fs::read_to_string(self.cpu_weight_file()).ok()?.trim().parse().ok()?;
        Some(match self.version {
            Version::V1 => (value * 100).div_ceil(1024),
            Version::V2 => value,
        })
    }

    fn cpu_idle_file(&self) -> PathBuf {
        self.dir("cpu").join("cpu.idle")
    }

    /// Put the group in the idle scheduling class or take it out (Linux ≥
    /// 5.15, v1 and v2): an idle group weighs next to nothing beside its
    /// non-idle siblings, and a non-idle task that wakes preempts it at once.
    /// While idle its weight cannot be set; taken out, it has the ordinary one.
    pub fn set_cpu_idle(&self, idle: bool) -> Result<()> {
        write(&self.cpu_idle_file(), if idle { "1" } else { "0" })
    }

    /// Whether the group is in the idle class; None where the kernel has no `cpu.idle`.
    pub fn cpu_idle(&self) -> Option<bool> {
        Some(fs::read_to_string(self.cpu_idle_file()).ok()?.trim() == "1")
    }

    /// The `cgroup.procs` files a process writes its pid to, to join.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// The files a *single-threaded* process writes "0" to, to join. On v1
    /// these are the `tasks` files: moving only the calling thread skips
    /// the global threadgroup lock (and its RCU grace period, 7-30 ms here)
    /// that a `cgroup.procs` write takes. v2 has no such file; `cgroup.procs`.
    pub fn join_files(&self) -> Vec<PathBuf> {
        let name = if self.version == Version::V1 { "tasks" } else { "cgroup.procs" };
        self.dirs.iter().map(|d| d.join(name)).collect()
    }

    /// Host pids of every process in the cgroup.
    pub fn pids(&self) -> Vec<i32> {
        read_ids(&self.dir("pids").join("cgroup.procs"))
    }

    /// Host tids of every thread in the cgroup (v1 `tasks`, v2
    /// `cgroup.threads`).
    pub fn threads(&self) -> Vec<i32> {
        let name = if self.version == Version::V1 { "tasks" } else { "cgroup.threads" };
        read_ids(&self.dir("pids").join(name))
    }

    /// How many processes the kernel's OOM killer has killed in this cgroup.
    pub fn oom_kills(&self) -> u64 {
        let (file, key) = match self.version {
            Version::V1 => (self.dir("memory").join("memory.oom_control"), "oom_kill"),
            Version::V2 => (self.dirs[0].join("memory.events"), "oom_kill"),
        };
        fs::read_to_string(file).unwrap_or_default().lines().find_map(|l| l.strip_prefix(key).and_then(|v| v.trim().parse().ok())).unwrap_or(0)
    }

    /// Memory in use now, in bytes.
    pub fn memory_usage(&self) -> u64 {
        let file = match self.version {
            Version::V1 => self.dir("memory").join("memory.usage_in_bytes"),
            Version::V2 => self.dirs[0].join("memory.current"),
        };
        fs::read_to_string(file).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
    }

    /// CPU time its processes have used, in nanoseconds, counting every
    /// process that ever ran in it (v2 `cpu.stat`, v1 `cpuacct.usage`). A
    /// v1 cgroup without cpuacct (an adopted sandbox of an older server)
    /// sums its live processes' user and system time instead.
    pub fn cpu_usage_ns(&self) -> u64 {
        self.cpu_times().total_ns
    }

    /// CPU time of every process that ever ran in the cgroup, and the part
    /// of it spent in the kernel (v2 `cpu.stat`, v1 `cpuacct.usage` and
    /// `cpuacct.usage_sys`; a v1 cgroup without cpuacct sums its live
    /// processes' times).
    pub fn cpu_times(&self) -> CpuTimes {
        match self.version {
            Version::V2 => {
                let stat = fs::read_to_string(self.dirs[0].join("cpu.stat")).unwrap_or_default();
                let field = |name: &str| stat.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse::<u64>().ok())).map_or(0, |us| us * 1000);
                CpuTimes { total_ns: field("usage_usec "), system_ns: field("system_usec ") }
            }
            Version::V1 => {
                let read = |name: &str| -> Option<u64> { fs::read_to_string(self.optional_dir("cpuacct")?.join(name)).ok()?.trim().parse().ok() };
                if let Some(total_ns) = read("cpuacct.usage") {
                    return CpuTimes { total_ns, system_ns: read("cpuacct.usage_sys").unwrap_or(0) };
                }
                let tick = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100).max(1) as u64;
                let (user, system) = self.pids().iter().filter_map(|pid| proc_cpu_ticks(*pid)).fold((0, 0), |(u, s), (pu, ps)| (u + pu, s + ps));
                CpuTimes { total_ns: (user + system) * (1_000_000_000 / tick), system_ns: system * (1_000_000_000 / tick) }
            }
        }
    }

    /// Whether the cgroup is frozen (a paused sandbox, as a restarted
    /// server finds it).
    pub fn is_frozen(&self) -> bool {
        match self.version {
            Version::V1 => fs::read_to_string(self.dir("freezer").join("freezer.state")).map(|s| s.trim() == "FROZEN").unwrap_or(false),
            Version::V2 => fs::read_to_string(self.dirs[0].join("cgroup.freeze")).map(|s| s.trim() == "1").unwrap_or(false),
        }
    }

    /// Whether the cgroup exists (in every hierarchy it cannot do without).
    pub fn exists(&self) -> bool {
        let essential = if self.version == Version::V1 { V1_ESSENTIAL } else { 1 };
        self.dirs.iter().take(essential).all(|d| d.is_dir())
    }

    /// The directory of the cgroup that freezes it (criu's `--freeze-cgroup`).
    pub fn freezer_dir(&self) -> &Path {
        self.dir("freezer")
    }

    /// Stop every process of the cgroup and wait until they all are.
    pub fn freeze(&self) -> Result<()> {
        self.set_frozen(true)
    }

    pub fn thaw(&self) -> Result<()> {
        self.set_frozen(false)
    }

    fn set_frozen(&self, frozen: bool) -> Result<()> {
        type Reached = Box<dyn Fn() -> std::io::Result<bool>>;
        let (file, value, done): (PathBuf, &'static str, Reached) = match self.version {
            Version::V1 => {
                let file = self.dir("freezer").join("freezer.state");
                let want = if frozen { "FROZEN" } else { "THAWED" };
                let check = file.clone();
                (file, want, Box::new(move || fs::read_to_string(&check).map(|s| s.trim() == want)))
            }
            Version::V2 => {
                let events = self.dirs[0].join("cgroup.events");
                let want = if frozen { "frozen 1" } else { "frozen 0" };
                (
                    self.dirs[0].join("cgroup.freeze"),
                    if frozen { "1" } else { "0" },
                    Box::new(move || fs::read_to_string(&events).map(|s| s.lines().any(|l| l.trim() == want))),
                )
            }
        };
        // A freeze that does not finish is taken back: a cgroup left part
        // frozen would stop the sandbox for good, with nobody to thaw it.
        let undo = frozen.then_some(match self.version {
            Version::V1 => "THAWED",
            Version::V2 => "0",
        });
        change_state(|v| write(&file, v), done, value, undo, STATE_CHANGE_DEADLINE)
    }

    /// SIGKILL every process in the cgroup and wait until it is empty.
    /// Processes forking meanwhile cannot escape: v2 kills atomically, v1
    /// freezes the group first.
    pub fn kill_all(&self, deadline: Duration) -> Result<()> {
        let start = Instant::now();
        if self.version == Version::V2 && self.dirs[0].join("cgroup.kill").exists() {
            write(&self.dirs[0].join("cgroup.kill"), "1")?;
        } else if self.version == Version::V1 {
            let freezer = self.dir("freezer").join("freezer.state");
            let _ = write(&freezer, "FROZEN");
            loop {
                let pids = self.pids();
                for pid in &pids {
                    let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
                }
                if pids.is_empty() || start.elapsed() > deadline {
                    break;
                }
                let _ = write(&freezer, "THAWED");
                std::thread::sleep(Duration::from_millis(2));
                let _ = write(&freezer, "FROZEN");
            }
            let _ = write(&freezer, "THAWED");
        }
        while !self.pids().is_empty() {
            if start.elapsed() > deadline {
                return Err(Error::Invalid("processes survived SIGKILL in a sandbox cgroup".into()));
            }
            for pid in self.pids() {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }

    /// Remove the (empty) cgroup directories.
    pub fn remove(&self) -> Result<()> {
        for dir in &self.dirs {
            // rmdir can race with the last exiting process: retry briefly.
            let mut tries = 0;
            loop {
                match fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(e) if tries < 200 => {
                        tries += 1;
                        let _ = e;
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => return Err(Error::io("remove cgroup", e)),
                }
            }
        }
        Ok(())
    }
}

/// The file a cgroup's CPU weight is written to: v1 `cpu.shares`, v2 `cpu.weight`.
fn weight_file_name(version: Version) -> &'static str {
    match version {
        Version::V1 => "cpu.shares",
        Version::V2 => "cpu.weight",
    }
}

/// What a weight (1..=10000, 100 = an ordinary group) is written as: v1
/// `cpu.shares` (1024 for 100), v2 `cpu.weight` as it is.
fn weight_value(version: Version, weight: u64) -> u64 {
    match version {
        Version::V1 => (weight.clamp(1, 10000) * 1024 / 100).max(2),
        Version::V2 => weight.clamp(1, 10000),
    }
}

/// The ids, one per line, of a `cgroup.procs`-like file (none if it is gone).
fn read_ids(file: &Path) -> Vec<i32> {
    fs::read_to_string(file).unwrap_or_default().lines().filter_map(|l| l.trim().parse().ok()).collect()
}

fn write(path: &Path, value: &str) -> Result<()> {
    fs::write(path, value).map_err(|e| Error::Io { what: "write cgroup file", source: std::io::Error::new(e.kind(), format!("{}: {e}", path.display())) })
}

/// A process's user and system time (all its threads), in clock ticks.
fn proc_cpu_ticks(pid: i32) -> Option<(u64, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's closing parenthesis: state is field 3, utime 14, stime 15.
    let rest: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some((rest.get(11)?.parse::<u64>().ok()?, rest.get(12)?.parse::<u64>().ok()?))
}

/// CPU time a cgroup has used (`Cgroup::cpu_times`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTimes {
    pub total_ns: u64,
    /// Of which in the kernel (system calls, page faults).
    pub system_ns: u64,
}

/// How long a freeze or thaw may take. Freezing is asynchronous (a task
/// in a system call stops when it leaves it), and under load the kernel
/// was seen holding tasks for about 10 s (docs/reliability.md): a fork
/// that waits that long is slow, one that gives up at 5 s failed.
const STATE_CHANGE_DEADLINE: Duration = Duration::from_secs(30);

/// Ask for state `want` with `ask`, then wait until `reached()`: polled
/// every 200 µs at first, as most changes take under a millisecond, then
/// less often. Past `deadline`, ask for `undo` (when given) and fail. A
/// state that can no longer be read (the cgroup was removed: its sandbox
/// destroyed meanwhile) fails at once.
fn change_state(
    ask: impl Fn(&str) -> Result<()>,
    reached: impl Fn() -> std::io::Result<bool>,
    want: &str,
    undo: Option<&str>,
    deadline: Duration,
) -> Result<()> {
    ask(want)?;
    let start = Instant::now();
    let mut pause = Duration::from_micros(200);
    loop {
        match reached() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => {
                if let Some(undo) = undo {
                    let _ = ask(undo);
                }
                return Err(Error::io("read the cgroup's freezer state", e));
            }
        }
        if start.elapsed() > deadline {
            if let Some(undo) = undo {
                ask(undo)?;
            }
            return Err(Error::Invalid(format!("sandbox cgroup did not become {want} within {} s", deadline.as_secs_f64())));
        }
        std::thread::sleep(pause);
        if start.elapsed() > Duration::from_millis(10) {
            pause = (pause * 2).min(Duration::from_millis(10));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake v1 root (plain files; statfs says it is not cgroup2) with
    /// the four essential controllers, and `cpuacct` if asked.
    fn fake_v1_root(with_cpuacct: bool) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let controllers = if with_cpuacct { &V1_CONTROLLERS[..] } else { &V1_CONTROLLERS[..V1_ESSENTIAL] };
        for c in controllers {
            fs::create_dir(root.path().join(c)).unwrap();
            fs::write(root.path().join(c).join("cgroup.procs"), "").unwrap();
        }
        root
    }

    const LIMITS: Limits = Limits { memory_bytes: 64 << 20, pids: 10, cpu_weight: 100, disk_bytes: 0 };

    #[test]
    fn a_v1_host_without_cpuacct_still_makes_sandboxes_and_counts_live_processes() {
        let root = fake_v1_root(false);
        let cgroups = Cgroups::at(root.path(), "t").unwrap();
        let cg = cgroups.create("sb", &LIMITS).unwrap();
        assert_eq!(cg.dirs.len(), V1_ESSENTIAL);
        assert!(cg.exists());
        fs::write(cg.dir("pids").join("cgroup.procs"), "").unwrap();
        assert_eq!(cg.cpu_usage_ns(), 0, "no live process, no cpuacct: nothing counted");
        assert_eq!(cg.cpu_weight(), Some(100));
    }

    #[test]
    fn a_v1_server_keeps_a_frozen_cgroup_beside_its_parent_and_removes_it_at_shutdown() {
        let root = fake_v1_root(false);
        let cgroups = Cgroups::at(root.path(), "t").unwrap();
        let anchor = root.path().join("freezer/forkbox-t.freezer-on");
        assert_eq!(fs::read_to_string(anchor.join("freezer.state")).unwrap(), "FROZEN");
        assert_eq!(cgroups.existing(), Vec::<String>::new(), "the anchor is not a sandbox's cgroup");
        fs::remove_file(anchor.join("freezer.state")).unwrap(); // a real cgroup's files go with it
        cgroups.remove_parent();
        assert!(!anchor.exists());
    }

    #[test]
    fn supervisors_run_beside_the_parent_at_an_ordinary_weight_and_go_at_shutdown() {
        let root = fake_v1_root(false);
        let cgroups = Cgroups::at(root.path(), "t").unwrap();
        let group = cgroups.supervisors().unwrap();
        let dir = root.path().join("cpu/forkbox-t.supervisors");
        assert_eq!(fs::read_to_string(dir.join("cpu.shares")).unwrap(), "1024");
        group.place(4242).unwrap();
        assert_eq!(fs::read_to_string(dir.join("cgroup.procs")).unwrap(), "4242");
        assert_eq!(cgroups.existing(), Vec::<String>::new(), "not a sandbox's cgroup");
        for f in ["cpu.shares", "cgroup.procs"] {
            fs::remove_file(dir.join(f)).unwrap(); // a real cgroup's files go with it
        }
        cgroups.remove_parent();
        assert!(!dir.exists());
    }

    #[test]
    fn with_cpuacct_the_cpu_time_comes_from_it() {
        let root = fake_v1_root(true);
        let cg = Cgroups::at(root.path(), "t").unwrap().create("sb", &LIMITS).unwrap();
        assert_eq!(cg.dirs.len(), V1_CONTROLLERS.len());
        fs::write(cg.optional_dir("cpuacct").unwrap().join("cpuacct.usage"), "123456789\n").unwrap();
        assert_eq!(cg.cpu_usage_ns(), 123_456_789);
        assert_eq!(cg.cpu_times(), CpuTimes { total_ns: 123_456_789, system_ns: 0 }, "no usage_sys: no kernel time known");
        fs::write(cg.optional_dir("cpuacct").unwrap().join("cpuacct.usage_sys"), "23456789\n").unwrap();
        assert_eq!(cg.cpu_times(), CpuTimes { total_ns: 123_456_789, system_ns: 23_456_789 });
        cg.set_cpu_weight(2000).unwrap();
        assert_eq!(fs::read_to_string(cg.dir("cpu").join("cpu.shares")).unwrap(), "20480");
    }

    #[test]
    fn the_idle_class_reads_back_and_new_limits_take_a_group_out_of_it() {
        let root = fake_v1_root(true);
        let cg = Cgroups::at(root.path(), "t").unwrap().create("sb", &LIMITS).unwrap();
        assert_eq!(cg.cpu_idle(), None, "a kernel without cpu.idle");
        fs::write(cg.dir("cpu").join("cpu.idle"), "0\n").unwrap();
        cg.set_cpu_idle(true).unwrap();
        assert_eq!(cg.cpu_idle(), Some(true));
        // The kernel refuses a weight while idle: set_limits leaves the class first.
        cg.set_limits(&LIMITS).unwrap();
        assert_eq!(cg.cpu_idle(), Some(false));
        assert_eq!(cg.cpu_weight(), Some(100));
    }

    mod change_state {
        use super::super::*;
        use std::cell::{Cell, RefCell};

        /// A fake of the write into the freezer file: it records what it is asked.
        fn recorder(asked: &RefCell<Vec<String>>) -> impl Fn(&str) -> Result<()> + '_ {
            move |v| {
                asked.borrow_mut().push(v.to_string());
                Ok(())
            }
        }

        #[test]
        fn a_change_that_finishes_is_asked_for_once() {
            let (asked, polls) = (RefCell::new(Vec::new()), Cell::new(0));
            let ask = recorder(&asked);
            let reached = || {
                polls.set(polls.get() + 1);
                Ok(polls.get() > 20)
            };
            change_state(ask, reached, "FROZEN", Some("THAWED"), Duration::from_secs(5)).unwrap();
            assert_eq!(*asked.borrow(), ["FROZEN"]);
        }

        #[test]
        fn a_freeze_past_its_deadline_is_taken_back_and_fails() {
            let asked = RefCell::new(Vec::new());
            let ask = recorder(&asked);
            let started = Instant::now();
            let err = change_state(ask, || Ok(false), "FROZEN", Some("THAWED"), Duration::from_millis(100)).unwrap_err().to_string();
            assert!(started.elapsed() >= Duration::from_millis(100));
            assert_eq!(*asked.borrow(), ["FROZEN", "THAWED"], "the freeze was not taken back");
            assert!(err.contains("did not become FROZEN within 0.1 s"), "{err}");
        }

        #[test]
        fn a_freeze_just_within_its_deadline_succeeds() {
            // Reached after 60 ms of a 100 ms deadline, as one reached
            // after 6 s of 30 once failed at the old 5 s.
            let asked = RefCell::new(Vec::new());
            let ask = recorder(&asked);
            let started = Instant::now();
            change_state(ask, || Ok(started.elapsed() > Duration::from_millis(60)), "FROZEN", Some("THAWED"), Duration::from_millis(100)).unwrap();
            assert_eq!(*asked.borrow(), ["FROZEN"]);
        }

        #[test]
        fn a_cgroup_removed_mid_freeze_fails_at_once() {
            // Its sandbox destroyed while a fork froze it: the fork's
            // children waited the whole deadline, seen as leaks.
            let asked = RefCell::new(Vec::new());
            let started = Instant::now();
            let gone = || Err(std::io::Error::from(std::io::ErrorKind::NotFound));
            assert!(change_state(recorder(&asked), gone, "FROZEN", Some("THAWED"), Duration::from_secs(30)).is_err());
            assert!(started.elapsed() < Duration::from_secs(1), "waited {:?}", started.elapsed());
            assert_eq!(*asked.borrow(), ["FROZEN", "THAWED"], "the freeze was not taken back");
        }

        #[test]
        fn a_thaw_past_its_deadline_fails_without_freezing_again() {
            let asked = RefCell::new(Vec::new());
            let ask = recorder(&asked);
            assert!(change_state(ask, || Ok(false), "THAWED", None, Duration::from_millis(20)).is_err());
            assert_eq!(*asked.borrow(), ["THAWED"]);
        }
    }
}
