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
    /// The template's root filesystem (the overlay's lower layer).
    pub template_rootfs: PathBuf,
    /// A directory of the shim's own for mount points.
    pub run_dir: PathBuf,
}

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
    /// Build a member: overlay root, namespaces, init.
    CreateMember { member: String, hostname: String, upper: PathBuf, work: PathBuf, cgroup_procs: Vec<PathBuf> },
    /// Start the member's REPL. fds: [stdout write end, stderr write end,
    /// control socket, source memfd].
    SpawnRepl { member: String, cgroup_procs: Vec<PathBuf>, argv: Vec<String>, env: Vec<String>, cwd: String },
    /// Run a command through the member's init. fds: [stdin, stdout, stderr].
    SpawnCommand { member: String, id: u64, argv: Vec<String>, env: Vec<String>, cwd: String },
    /// Send a signal to a command's whole process group.
    SignalCommand { member: String, id: u64, signal: i32 },
    /// Kill every process of the member and release its mounts.
    DestroyMember { member: String },
}

/// Shim → server.
#[derive(Debug, Serialize, Deserialize)]
pub enum ShimMessage {
    /// The family is set up; requests may follow.
    Ready,
    Reply { req: u64, reply: Reply },
    Event(ShimEvent),
}

#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    Done,
    /// fds: [pidfd of the REPL].
    ReplSpawned { host_pid: i32 },
    Failed { error: String },
}

#[derive(Debug, Serialize, Deserialize)]
pub enum ShimEvent {
    ReplExited { member: String, host_pid: i32, status: ExitStatus },
    /// Init forked the command (it may have side effects from here on).
    CommandStarted { member: String, id: u64 },
    CommandExited { member: String, id: u64, status: ExitStatus },
    /// The member's init died: its namespaces are unusable.
    InitExited { member: String },
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
    /// fds: [stdin, stdout, stderr].
    Spawn { id: u64, argv: Vec<String>, env: Vec<String>, cwd: String },
    /// Signal the process group of a running command.
    Signal { id: u64, signal: i32 },
}

/// Init → shim.
#[derive(Debug, Serialize, Deserialize)]
pub enum InitMessage {
    /// Sent with credentials, so the shim learns init's host pid.
    Ready,
    SetupFailed { error: String },
    Started { id: u64 },
    SpawnFailed { id: u64, error: String },
    Exited { id: u64, status: ExitStatus },
}
