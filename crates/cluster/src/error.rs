//! What can go wrong with the cluster's state. Front ends answer
//! `Unavailable` and `Store` with 503 and the reason: the request did not
//! happen, and may be tried again.

/// Which limit of a key's quota refused a reservation, as
/// `forkbox_quota_refusals_total` labels it, and when to try again.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub limit: &'static str,
    pub message: String,
    pub retry_after_s: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// etcd did not answer in time, has no leader, or refused the
    /// connection.
    #[error("the cluster's etcd is unavailable: {0}")]
    Unavailable(String),
    /// The object store did not take or give the bytes.
    #[error("the cluster's object store failed: {0}")]
    Store(String),
    /// A record in etcd is not what this version writes.
    #[error("a cluster record is unreadable: {0}")]
    Corrupt(String),
    /// A key's cluster-wide quota refused the reservation.
    #[error("{}", .0.message)]
    Quota(Refusal),
    /// Another node or request got there first (a Space claimed twice).
    #[error("{0}")]
    Conflict(String),
    #[error("invalid cluster settings: {0}")]
    Config(String),
    #[error("{what}: {err}")]
    Io { what: String, err: std::io::Error },
}

impl ClusterError {
    pub(crate) fn etcd(e: etcd_client::Error) -> ClusterError {
        ClusterError::Unavailable(e.to_string())
    }

    pub(crate) fn store(e: object_store::Error) -> ClusterError {
        ClusterError::Store(e.to_string())
    }

    pub(crate) fn io(what: impl Into<String>, err: std::io::Error) -> ClusterError {
        ClusterError::Io { what: what.into(), err }
    }

    /// Whether the cause is a part of the cluster being down (503), not
    /// the request (4xx) or this node (500).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, ClusterError::Unavailable(_) | ClusterError::Store(_))
    }
}

/// A record read back from etcd.
pub(crate) fn parse<T: serde::de::DeserializeOwned>(key: &[u8], value: &[u8]) -> Result<T, ClusterError> {
    serde_json::from_slice(value).map_err(|e| ClusterError::Corrupt(format!("{}: {e}", String::from_utf8_lossy(key))))
}

pub(crate) fn json<T: serde::Serialize>(record: &T) -> Vec<u8> {
    // Records are plain structs of strings and numbers: they always serialise.
    serde_json::to_vec(record).unwrap_or_default()
}
