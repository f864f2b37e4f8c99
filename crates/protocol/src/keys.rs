//! A key's limits: what a single server keeps in its keys file and a
//! cluster in etcd (docs/operations.md#api-keys, docs/cluster.md#keys).

use serde::{Deserialize, Serialize};

/// A key's limits; `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sandboxes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forks_per_minute: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_memory_mib: Option<u64>,
}

impl std::fmt::Display for KeyLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |v: Option<u64>| v.map_or_else(|| "unlimited".to_string(), |n| n.to_string());
        write!(f, "max_sandboxes={} forks_per_minute={} max_memory_mib={}", show(self.max_sandboxes), show(self.forks_per_minute), show(self.max_memory_mib))
    }
}
