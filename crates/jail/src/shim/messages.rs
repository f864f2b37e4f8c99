//! What the server, the shim and a sandbox's init say to each other.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Everything a shim needs to set up its family, passed on its command line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShimConfig {
    pub family: String,
    /// First host uid/gid of the family's range; uid 0 inside maps to it.
    pub id_base: u32,
    pub id_count: u32,
    /// The template's root filesystem (the overlay's lowest layer).
    pub template_rootfs: PathBuf,
    /// Layers over it, top first (a custom template's; docs/templates.md).
    #[serde(default)]
    pub template_layers: Vec<PathBuf>,
    /// The host's CAs (crates/jail/src/trust), above the template's layers.
    #[serde(default)]
    pub trust_layer: Option<PathBuf>,
    /// A directory of the shim's own for mount points.
    pub run_dir: PathBuf,
    /// How long the family outlives a server that went away without saying
    /// `Shutdown` (a crash, an upgrade), waiting on `run_dir/shim.sock` for
    /// a new server to adopt it. Zero: it ends with the server.
    #[serde(default)]
    pub orphan_grace_ms: u64,
    /// A family of one whose process tree criu can dump: its init is
    /// bound into its root, its REPL is init's child, no notify filter
    /// (docs/state.md, "the sandbox shape a process-keeping Space needs").
    #[serde(default)]
    pub solo: bool,
}

impl ShimConfig {
    /// The template's layers, top first.
    pub fn template_lowers(&self) -> Vec<PathBuf> {
        match self.template_layers.is_empty() {
            true => vec![self.template_rootfs.clone()],
            false => self.template_layers.clone(),
        }
    }

    /// The overlay's lower layers, top first: the trust layer, then the
    /// template's.
    pub fn lower_layers(&self) -> Vec<PathBuf> {
        self.trust_layer.iter().cloned().chain(self.template_lowers()).collect()
    }
}

/// What this binary's shim and init understand. A new server adopting a
/// family an older binary started learns the family's number from
/// `Reply::Members` and sends it nothing the family would misread: serde
/// drops fields it does not know, so a `SpawnCommand`'s `run_as` sent to a
/// protocol-1 shim would run the command as root.
/// 2: `SpawnCommand::run_as` (init drops to the user itself).
/// 3: network gates (`CloseNetwork`, `OpenNetwork`, `NetworkWanted`): an
/// older shim knows neither request, so a member's way out is started
/// ahead of use in its families.
/// 4: `PagesIn` (an older shim never restores lazily, and would take the
/// unknown request for a server gone).
/// 5: a fork child's hand-over waits for its member's root (`RootMember`
/// answered), so a fork need not wait for its members' roots before the
/// REPL forks; an older shim would hand a child a namespace without one.
/// 6: a hand-over into a hollow member waits for its root even before
/// `RootMember` came, so a fork may snapshot its parent while the REPL
/// forks and send `RootMember` after; an older shim would hand the child
/// the hollow member's namespaces at once.
pub const PROTOCOL: u32 = 6;

/// The first [`PROTOCOL`] with network gates.
pub const NETWORK_GATES: u32 = 3;
/// The first [`PROTOCOL`] that answers `PagesIn`.
pub const PAGES_IN: u32 = 4;
/// The first [`PROTOCOL`] whose hand-overs wait for a member's root.
pub const ROOTING_HOLDS_HANDOVERS: u32 = 5;
/// The first [`PROTOCOL`] whose hand-overs into a hollow member wait for
/// its root before `RootMember` came.
pub const HOLLOWS_HOLD_HANDOVERS: u32 = 6;

/// Who a command runs as inside the sandbox. Supplementary groups stay
/// init's (as `setpriv --keep-groups`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
}

impl RunAs {
    pub const ROOT: RunAs = RunAs { uid: 0, gid: 0 };

    /// `argv` and who to ask init to run it as, for a family of `protocol`.
    /// One older than 2 would drop `run_as` unread and run the command as
    /// root: there util-linux's setpriv (in every Debian root) drops to the
    /// user in front of the command instead.
    pub fn for_protocol(self, protocol: u32, mut argv: Vec<String>) -> (Vec<String>, RunAs) {
        if self == RunAs::ROOT || protocol >= 2 {
            return (argv, self);
        }
        let drop_to = ["/usr/bin/setpriv".to_string(), format!("--reuid={}", self.uid), format!("--regid={}", self.gid), "--keep-groups".into(), "--".into()];
        argv.splice(0..0, drop_to);
        (argv, RunAs::ROOT)
    }
}

/// The edge of a dumped solo sandbox: the descriptors that led out of its
/// tree, as `/proc/<pid>/fd` names them, which a restore replaces.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Edges {
    /// `socket:[ino]` of init's channel to the shim (its fd 3).
    pub init_channel: String,
    /// The REPL's fds 1, 2 and 3 (`pipe:[ino]`, `pipe:[ino]`,
    /// `socket:[ino]`), when one ran.
    pub repl: Option<[String; 3]>,
    /// Whether a task of the tree runs as another user than its root,
    /// which only a criu that restores other users brings back
    /// (`criu::Criu::restores_other_users`). Absent in older dumps, which
    /// never held one.
    #[serde(default)]
    pub other_users: bool,
}

impl Edges {
    /// Inode numbers of the unix sockets among them.
    pub fn sockets(&self) -> Vec<u64> {
        self.all().filter(|(kind, _)| *kind == "socket").map(|(_, ino)| ino).collect()
    }

    /// Every edge as (kind, inode): init's channel, then the REPL's fds 1, 2, 3.
    pub fn all(&self) -> impl Iterator<Item = (&str, u64)> {
        let repl = self.repl.iter().flat_map(|r| r.iter());
        [&self.init_channel].into_iter().chain(repl).filter_map(|link| {
            let (kind, rest) = link.split_once(":[")?;
            Some((kind, rest.strip_suffix(']')?.parse().ok()?))
        })
    }
}

/// The socket in a family's run directory where an orphaned shim waits.
pub const SHIM_SOCKET_NAME: &str = "shim.sock";

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExitStatus {
    Code(i32),
    Signal(i32),
}

impl ExitStatus {
    /// Shell-style exit code: the code, or 128 + signal number.
    pub fn code(self) -> i32 {
        match self {
            ExitStatus::Code(c) => c,
            ExitStatus::Signal(s) => 128 + s,
        }
    }
}

/// Server → shim. Attached descriptors are listed per variant.
#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    /// Build a member: overlay root, namespaces, init. Reply fds: [pidfd of
    /// init, then its mnt, net, uts, ipc and leaf pid namespaces]. Without
    /// layers (`upper`/`work` None) the member is *hollow*: everything but
    /// its root, which `RootMember` attaches later (a fork's spare).
    CreateMember { member: String, hostname: String, upper: Option<PathBuf>, work: Option<PathBuf>, cgroup_procs: Vec<PathBuf> },
    /// (A solo family) build the member from criu's `images` of a dumped
    /// one (`edges` from the dump), over these layers, running criu of the
    /// tools root `criu_root` (or the host's). Reply: `Restored`; fds:
    /// [pidfd of init, its mnt, net, uts, ipc and pid namespaces], then, when
    /// a REPL was dumped, [pidfd of the REPL, control socket, stdout read
    /// end, stderr read end] (the server's new ends of it).
    /// `lazily`: the tree runs before its memory is all in, where criu can
    /// (shim/lazy.rs).
    RestoreMember {
        member: String,
        upper: PathBuf,
        work: PathBuf,
        cgroup_procs: Vec<PathBuf>,
        images: PathBuf,
        edges: Edges,
        criu_root: Option<PathBuf>,
        #[serde(default)]
        lazily: bool,
    },
    /// Give a hollow member its root over these layers (answered once its
    /// init has moved into it).
    RootMember { member: String, upper: PathBuf, work: PathBuf },
    /// Start the member's REPL. fds: [stdout write end, stderr write end,
    /// control socket, source memfd].
    SpawnRepl { member: String, cgroup_procs: Vec<PathBuf>, argv: Vec<String>, env: Vec<String>, cwd: String },
    /// Run a command through the member's init. fds: [stdin, stdout, stderr]
    /// (with `tty`, all three are a terminal that becomes its controlling tty).
    /// `run_as` from protocol 2 on (see [`PROTOCOL`]).
    SpawnCommand {
        member: String,
        id: u64,
        argv: Vec<String>,
        env: Vec<String>,
        cwd: String,
        tty: bool,
        #[serde(default)]
        run_as: RunAs,
    },
    /// Send a signal to every process of a command's session.
    SignalCommand { member: String, id: u64, signal: i32 },
    /// Kill every process of the member and release its mounts.
    DestroyMember { member: String },
    /// Before a REPL forks itself into new members: hold these descriptors
    /// of the child it forks as `slot` into `member` (fds: [control socket,
    /// stdout write end, stderr write end, then the cgroup files it joins
    /// by]) and copy them, after the member's mnt, net, uts, ipc and leaf
    /// pid namespaces, into that child once its parent named it (shim's
    /// `handover`); the forking REPL never holds them.
    ExpectFork { parent_repl: i32, slot: usize, member: String },
    /// After a REPL forked itself into new members (docs/architecture.md#processes-and-namespaces): find
    /// each child among the forking REPL's children (by the mount namespace
    /// it entered), move it into its member's cgroup and watch it.
    /// Reply: `Adopted`, fds: [pidfd of each child, in order].
    AdoptForks { parent_repl: i32, children: Vec<ForkedChild> },
    /// Keep duplicates of the server's ends of a member's REPL (fds:
    /// [control socket, stdout read end, stderr read end]) so the REPL
    /// never sees them close if the server dies; replaces earlier ones.
    /// `repl` is its host pid: ends of a REPL that is gone are refused.
    Deposit { member: String, repl: i32 },
    /// Hold the member's network sockets: from now on a process of the
    /// member that asks for a socket of any domain but `AF_UNIX` waits, and
    /// the first such call sends `NetworkWanted`, until `OpenNetwork`.
    /// (A member starts open: nothing waits.)
    CloseNetwork { member: String },
    /// Let the member's waiting and future network sockets through.
    OpenNetwork { member: String },
    /// (A new server, adopting the family.) Reply: `Members`.
    ListMembers,
    /// Answered (`Done`) once a lazily restored member's memory is all in
    /// (shim/lazy.rs): a dump must not find pages still missing.
    PagesIn,
    /// (A new server) take a member back. Reply: `Reattached`, fds: [pidfd
    /// of init], then, when it has a live REPL with deposited ends, [pidfd
    /// of the REPL, control socket, stdout, stderr].
    Reattach { member: String },
    /// (A new server) every waiter is registered: send the events that
    /// happened while no server was there, and from now on as they come.
    Attached,
    /// The server is done with the family: end it (closing the socket
    /// without this leaves the family waiting for a new server).
    Shutdown,
}

/// A member as `ListMembers` reports it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberState {
    pub member: String,
    pub init_alive: bool,
    /// Host pid of its REPL, if one runs.
    pub repl: Option<i32>,
}

/// One child of a REPL fork, as `AdoptForks` names it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ForkedChild {
    pub member: String,
    pub cgroup_procs: Vec<PathBuf>,
}

/// Shim → server.
#[derive(Debug, Serialize, Deserialize)]
pub enum ShimMessage {
    /// The family is set up; requests may follow.
    Ready,
    Reply {
        req: u64,
        reply: Reply,
    },
    Event(ShimEvent),
}

#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    Done,
    /// fds: [pidfd of the REPL].
    ReplSpawned {
        host_pid: i32,
    },
    /// Host pids of the adopted fork children, in request order.
    Adopted {
        host_pids: Vec<i32>,
    },
    Members {
        members: Vec<MemberState>,
        /// The family's [`PROTOCOL`] (absent, so 1, from older shims).
        #[serde(default = "protocol_1")]
        protocol: u32,
    },
    Reattached {
        repl_host_pid: Option<i32>,
    },
    Restored {
        repl_host_pid: Option<i32>,
    },
    Failed {
        error: String,
    },
}

#[derive(Debug, Serialize, Deserialize)]
pub enum ShimEvent {
    /// `status` is None when it could not be learnt (a forked REPL whose
    /// zombie was reaped by someone else first).
    ReplExited {
        member: String,
        host_pid: i32,
        status: Option<ExitStatus>,
    },
    /// Init forked the command (it may have side effects from here on).
    CommandStarted {
        member: String,
        id: u64,
    },
    CommandExited {
        member: String,
        id: u64,
        status: ExitStatus,
    },
    /// The member's init died: its namespaces are unusable.
    InitExited {
        member: String,
    },
    /// A process of a member whose network is closed asked for a network
    /// socket and waits for `OpenNetwork` (sent once per `CloseNetwork`).
    NetworkWanted {
        member: String,
    },
}

/// Server → shim envelope.
#[derive(Debug, Serialize, Deserialize)]
pub struct Envelope {
    pub req: u64,
    pub request: Request,
}

/// Shim → init.
#[derive(Debug, Serialize, Deserialize)]
pub enum InitRequest {
    /// fds: [stdin, stdout, stderr]; with `tty` they are a terminal, made
    /// the command's controlling terminal.
    /// The command runs as `run_as` (shim and init are one binary, so they
    /// always agree on this message).
    Spawn { id: u64, argv: Vec<String>, env: Vec<String>, cwd: String, tty: bool, run_as: RunAs },
    /// A solo member's REPL (init's child, docs/state.md). fds: [stdout
    /// write end, stderr write end, control socket, source memfd];
    /// answered with `ReplStarted`.
    SpawnRepl { id: u64, argv: Vec<String>, env: Vec<String>, cwd: String },
    /// Signal every process of a running command's session.
    Signal { id: u64, signal: i32 },
    /// (A restored solo member's init) fds: [the channel to use from now
    /// on, made in the member's network namespace]. Init answers
    /// `ChannelMoved` on the old one, the last thing sent there, then
    /// executes itself afresh and says `Renewed` on the new one.
    Renew,
    /// A hollow member gets its root: an overlay the shim mounted at `root`
    /// in the member's mount namespace. Answered with `Rooted`.
    Root { root: PathBuf },
}

/// Init → shim.
#[derive(Debug, Serialize, Deserialize)]
pub enum InitMessage {
    /// Sent with credentials, so the shim learns init's host pid.
    Ready,
    /// (A solo member's init, right after `Ready`) fds: [the channel to
    /// use from now on, made in the member's network namespace].
    Channel,
    /// fds: [the listener of init's filter, `notify::socket_filter`],
    /// which every command of the member inherits.
    Listener,
    SetupFailed {
        error: String,
    },
    Started {
        id: u64,
    },
    /// The REPL of `SpawnRepl` runs as `pid` of the member's namespace.
    ReplStarted {
        id: u64,
        pid: i32,
    },
    /// The member's root is in place (answer to `InitRequest::Root`).
    Rooted,
    /// Init uses the channel of `InitRequest::Renew` from now on.
    ChannelMoved,
    /// A renewed init serves again (first message on the new channel).
    Renewed,
    SpawnFailed {
        id: u64,
        error: String,
    },
    Exited {
        id: u64,
        status: ExitStatus,
    },
}

fn protocol_1() -> u32 {
    1
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `SpawnCommand` as protocol-1 binaries declare it.
    #[derive(Deserialize)]
    enum OldRequest {
        SpawnCommand {
            #[allow(dead_code)]
            argv: Vec<String>,
        },
    }

    fn spawn(run_as: RunAs) -> Request {
        Request::SpawnCommand { member: "m".into(), id: 1, argv: vec!["id".into()], env: vec![], cwd: "/".into(), tty: false, run_as }
    }

    #[test]
    fn an_old_shim_would_read_a_users_command_without_its_user() {
        // Why the protocol number exists: serde drops the unknown field.
        let json = serde_json::to_string(&spawn(RunAs { uid: 1000, gid: 1000 })).unwrap();
        assert!(matches!(serde_json::from_str::<OldRequest>(&json), Ok(OldRequest::SpawnCommand { .. })));
    }

    #[test]
    fn old_families_get_setpriv_and_new_ones_run_as() {
        let user = RunAs { uid: 1000, gid: 1001 };
        let (argv, sent) = user.for_protocol(1, vec!["id".into()]);
        assert_eq!(sent, RunAs::ROOT);
        assert_eq!(argv, ["/usr/bin/setpriv", "--reuid=1000", "--regid=1001", "--keep-groups", "--", "id"]);
        assert_eq!(user.for_protocol(PROTOCOL, vec!["id".into()]), (vec!["id".to_string()], user));
        assert_eq!(RunAs::ROOT.for_protocol(1, vec!["id".into()]), (vec!["id".to_string()], RunAs::ROOT));
    }

    #[test]
    fn members_from_an_old_shim_say_protocol_1() {
        let old = r#"{"Members":{"members":[]}}"#;
        assert!(matches!(serde_json::from_str::<Reply>(old), Ok(Reply::Members { protocol: 1, .. })));
        let new = serde_json::to_string(&Reply::Members { members: vec![], protocol: PROTOCOL }).unwrap();
        assert!(matches!(serde_json::from_str::<Reply>(&new), Ok(Reply::Members { protocol: PROTOCOL, .. })));
        // An old server's SpawnCommand (no run_as) still reads, as root.
        let old_spawn = r#"{"SpawnCommand":{"member":"m","id":1,"argv":["id"],"env":[],"cwd":"/","tty":false}}"#;
        assert!(matches!(serde_json::from_str::<Request>(old_spawn), Ok(Request::SpawnCommand { run_as: RunAs::ROOT, .. })));
    }
}
