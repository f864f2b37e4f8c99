//! The cluster secret: what a gateway shows a node on every request
//! (`X-Forkbox-Cluster` header), so only gateways reach nodes' APIs.
//! Nodes compare it in constant time; it never appears in a log.

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::{ClusterError, Result};

/// The header a gateway sends it in.
pub const HEADER: &str = "x-forkbox-cluster";
/// The shortest secret accepted.
pub const SHORTEST: usize = 32;

#[derive(Clone)]
pub struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

impl Secret {
    /// From a file holding it (trailing whitespace ignored); at least 32
    /// characters, and the file must not be open to every user (a group
    /// may read it: Kubernetes mounts secrets for a pod's `fsGroup`).
    pub fn from_file(path: &Path) -> Result<Secret> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).map_err(|e| ClusterError::io(format!("read the cluster secret {}", path.display()), e))?;
        if meta.mode() & 0o007 != 0 {
            return Err(ClusterError::Config(format!("the cluster secret {} is open to every user (chmod o-rwx it)", path.display())));
        }
        let text = std::fs::read_to_string(path).map_err(|e| ClusterError::io(format!("read the cluster secret {}", path.display()), e))?;
        Secret::new(text.trim_end())
    }

    pub fn new(text: &str) -> Result<Secret> {
        if text.len() < SHORTEST || !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ClusterError::Config(format!("the cluster secret must be at least {SHORTEST} printable characters")));
        }
        Ok(Secret(text.to_string()))
    }

    /// A new random one (`./dev cluster`, `forkbox cluster secret`).
    pub fn generate() -> Secret {
        Secret(hex::encode(rand::random::<[u8; 32]>()))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `shown` is the secret, in time independent of where they
    /// differ (both sides hashed first, so their lengths leak nothing).
    pub fn matches(&self, shown: &[u8]) -> bool {
        let (a, b) = (Sha256::digest(self.0.as_bytes()), Sha256::digest(shown));
        a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_or_shared_secrets_are_refused_and_matching_is_exact() {
        assert!(Secret::new("short").is_err());
        let s = Secret::generate();
        assert!(s.matches(s.expose().as_bytes()));
        assert!(!s.matches(&s.expose().as_bytes()[1..]));
        assert!(!s.matches(b""));
        assert!(!format!("{s:?}").contains(s.expose()));
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("secret");
        std::fs::write(&p, format!("{}\n", s.expose())).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(Secret::from_file(&p).is_err(), "a world-readable secret is refused");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(Secret::from_file(&p).unwrap().matches(s.expose().as_bytes()));
    }
}
