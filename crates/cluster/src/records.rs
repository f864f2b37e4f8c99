//! The records kept in etcd (JSON), one type per kind of key (`layout`).

use serde::{Deserialize, Serialize};

/// A node, under its lease: present while it is alive.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NodeRecord {
    pub name: String,
    /// Where its API answers (`http://host:port`), for gateways only: it
    /// wants the cluster secret.
    pub api: String,
    /// Random per process start: a restarted node is a new incarnation.
    pub incarnation: String,
    pub started_ms: u64,
    /// Refusing new work while its sandboxes move away (`drain`).
    #[serde(default)]
    pub draining: bool,
    #[serde(default)]
    pub load: Load,
}

/// What a node holds and has room for, updated every few seconds.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Load {
    pub sandboxes: u64,
    pub max_sandboxes: u64,
    /// Memory its sandboxes' cgroups use now.
    pub memory_mib: u64,
    pub max_memory_mib: u64,
    /// Templates with a warm zygote on this node (creates there are forks).
    #[serde(default)]
    pub warm: Vec<String>,
}

impl Load {
    /// Whether a sandbox of `ram_mib` fits (the node checks again).
    pub fn has_room(&self) -> bool {
        self.sandboxes < self.max_sandboxes && self.memory_mib < self.max_memory_mib
    }
}

/// Where a sandbox lives. Written once it is live on its node, removed
/// when it is destroyed; it has no lease, so when its node dies the
/// record still says where it was ("lost: node N left").
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SandboxRecord {
    pub id: String,
    pub node: String,
    /// The key (by name) that owns it; none without keys.
    #[serde(default)]
    pub owner: Option<String>,
    pub template: String,
    pub ram_mib: u64,
    pub created_at: u64,
}

/// A sandbox whose node left, kept a day so calls with its id are told why.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LostRecord {
    pub id: String,
    pub node: String,
    #[serde(default)]
    pub owner: Option<String>,
    pub reason: String,
}

/// A Space any node can resume: its metadata as the freezing node wrote
/// it, and where its bytes are.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SpaceRecord {
    pub space_id: String,
    #[serde(default)]
    pub owner: Option<String>,
    /// The node that froze it (it keeps a copy until it is resumed).
    pub node: String,
    /// The object holding the Space's directory (an archive).
    pub blob: String,
    pub archive_bytes: u64,
    /// The Space's `meta.json`, as the service wrote it.
    pub meta: serde_json::Value,
    /// Taken for a resume (`Cluster::claim_space`), and by whom.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed: Option<Claim>,
    /// What its sandbox's id points at while the Space exists (written
    /// with it, gone with it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frozen: Option<FrozenRecord>,
}

/// A frozen sandbox's id: the Space that holds it, so a call naming the id
/// finds it, and a hibernating one (which keeps its id) is woken from it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FrozenRecord {
    pub sandbox_id: String,
    pub space_id: String,
    /// The node that froze it: a wake there finds no other sandbox's work
    /// in the way of its memory, and the gateway prefers it.
    pub node: String,
    #[serde(default)]
    pub owner: Option<String>,
    /// Hibernating (keeps its id: any call wakes it), not frozen.
    pub hibernated: bool,
}

/// A resume in progress on some node.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Claim {
    /// Random per claim: a claim retried on another etcd member finds its own.
    pub by: String,
    pub at_ms: u64,
}
