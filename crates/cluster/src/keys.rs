//! API keys of the cluster, stored hashed, as a single server keeps them
//! in its keys file: `forkbox key add --cluster-etcd …` writes them here
//! and every node follows them.

use etcd_client::{Compare, CompareOp, EventType, Txn, TxnOp};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::error::{json, parse};
use crate::quota::Limits;
use crate::{Cluster, ClusterError, Result};

/// One key: its name (what owns sandboxes), the SHA-256 of the key itself
/// (never the key), when it was made, its limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterKey {
    pub name: String,
    pub sha256: String,
    pub created: u64,
    #[serde(default)]
    pub limits: Limits,
}

impl Cluster {
    /// Add `key`; refused if its name is taken.
    pub async fn add_key(&self, key: &ClusterKey) -> Result<()> {
        let k = self.layout.api_key(&key.name);
        let txn = Txn::new().when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)]).and_then([TxnOp::put(k.clone(), json(key), None)]);
        let added = self.txn(txn).await?.succeeded();
        // A retry after a first try that did add it finds it added.
        if !added && self.keys().await?.iter().any(|k| k == key) {
            return Ok(());
        }
        if !added {
            return Err(ClusterError::Conflict(format!("a key named `{}` exists", key.name)));
        }
        Ok(())
    }

    /// Remove key `name`; false if there was none.
    pub async fn remove_key(&self, name: &str) -> Result<bool> {
        let r = self.txn(Txn::new().and_then([TxnOp::delete(self.layout.api_key(name), None)])).await?;
        Ok(r.op_responses().iter().any(|o| matches!(o, etcd_client::TxnOpResponse::Delete(d) if d.deleted() > 0)))
    }

    pub async fn keys(&self) -> Result<Vec<ClusterKey>> {
        let r = self.get_prefix(self.layout.keys()).await?;
        r.kvs().iter().map(|kv| parse(kv.key(), kv.value())).collect()
    }

    /// The keys now, then after each change. The first value is read
    /// before this returns (a node starts with the cluster's keys).
    pub async fn follow_keys(&self) -> Result<watch::Receiver<Vec<ClusterKey>>> {
        let first = self.keys().await?;
        let (tx, rx) = watch::channel(first);
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                if let Err(e) = me.follow_keys_once(&tx).await {
                    tracing::warn!(error = %e, "lost the cluster's keys; following again");
                    me.stream_failed();
                }
                if tx.is_closed() {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        });
        Ok(rx)
    }

    async fn follow_keys_once(&self, tx: &watch::Sender<Vec<ClusterKey>>) -> Result<()> {
        let dir = self.layout.keys();
        let now = self.get_prefix(dir.clone()).await?;
        let revision = now.header().map(|h| h.revision()).unwrap_or(0);
        let mut keys: Vec<ClusterKey> = now.kvs().iter().map(|kv| parse(kv.key(), kv.value())).collect::<Result<_>>()?;
        tx.send_replace(keys.clone());
        let mut watch = self.watch_after(&dir, revision, false).await?;
        loop {
            let resp = watch.next().await?;
            for ev in resp.events() {
                let Some(kv_) = ev.kv() else { continue };
                let Some(name) = self.layout.name_in(&dir, kv_.key()) else { continue };
                keys.retain(|k| k.name != name);
                if ev.event_type() == EventType::Put {
                    keys.push(parse(kv_.key(), kv_.value())?);
                }
            }
            if tx.send(keys.clone()).is_err() {
                return Ok(());
            }
        }
    }
}
