//! The egress policy of a sandbox (docs/network.md).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `false` (loopback only), `true` (the internet), or an allow-list of
/// domains (`pypi.org`, `*.pythonhosted.org`) and CIDRs (`203.0.113.0/24`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Egress {
    On(bool),
    Allow(EgressAllow),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EgressAllow {
    pub allow: Vec<String>,
}

impl Egress {
    pub fn is_off(&self) -> bool {
        *self == Egress::On(false)
    }
}

/// Body of `PATCH /v1/sandboxes/{id}/egress` and answer of `GET`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EgressBody {
    pub egress: Egress,
}
