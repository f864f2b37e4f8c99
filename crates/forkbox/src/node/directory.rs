//! The cluster as the service's directory (`service::directory`): where
//! sandboxes are recorded, keys' quotas reserved, Spaces published and
//! claimed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use cluster::{Cluster, ClusterError, SpaceRecord};
use service::directory::{Directory, Registered, TemplateBeyond, Ticket};
use service::keys::{KeyLimits, Limit, Refusal};
use service::space_store::SpaceMeta;
use service::templates::user::UserTemplate;
use service::Error;

/// The cluster as the service's directory.
pub(super) struct NodeDirectory {
    cluster: Cluster,
    membership: Arc<cluster::membership::Membership>,
    /// Spaces claimed for a resume here: their records (to put back or
    /// forget) and whether their directory was fetched for it.
    claimed: Mutex<HashMap<String, (SpaceRecord, bool)>>,
    spaces_dir: PathBuf,
}

/// The service's error for a cluster's failure.
fn service_error(e: ClusterError) -> Error {
    match e {
        ClusterError::Quota(r) => Error::Quota(Refusal {
            limit: match r.limit {
                "max_memory_mib" => Limit::Memory,
                "forks_per_minute" => Limit::ForksPerMinute,
                _ => Limit::Sandboxes,
            },
            message: r.message,
            retry_after_s: r.retry_after_s,
        }),
        ClusterError::Conflict(m) => Error::Conflict(m),
        e if e.is_unavailable() => Error::Unavailable { message: e.to_string(), progress: None },
        e => Error::internal("the cluster failed", e),
    }
}

impl NodeDirectory {
    pub(super) fn new(cluster: Cluster, membership: Arc<cluster::membership::Membership>, spaces_dir: PathBuf) -> NodeDirectory {
        NodeDirectory { cluster, membership, claimed: Mutex::new(HashMap::new()), spaces_dir }
    }
}

#[async_trait]
impl Directory for NodeDirectory {
    fn counts_quotas(&self) -> bool {
        true
    }

    async fn reserve(&self, owner: &str, limits: KeyLimits, n: u64, ram_mib: u64, fork: bool) -> Result<Option<Ticket>, Error> {
        let t = self.cluster.reserve(self.membership.lease(), owner, &limits, n, ram_mib, fork).await.map_err(service_error)?;
        Ok(Some(Ticket(t.owner, t.id)))
    }

    async fn release(&self, ticket: Ticket) {
        if let Err(e) = self.cluster.release(&cluster::quota::Ticket { owner: ticket.0, id: ticket.1 }).await {
            // It goes with this node's lease at worst.
            tracing::warn!(error = %e, "could not give back a quota reservation");
        }
    }

    async fn register(&self, ticket: Option<Ticket>, sandboxes: &[Registered]) -> Result<(), Error> {
        let node = self.membership.name();
        let records: Vec<cluster::SandboxRecord> = sandboxes
            .iter()
            .map(|s| cluster::SandboxRecord {
                id: s.id.clone(),
                node: node.clone(),
                owner: s.owner.clone(),
                template: s.template.clone(),
                ram_mib: s.ram_mib,
                created_at: s.created_at,
            })
            .collect();
        let ticket = ticket.map(|t| cluster::quota::Ticket { owner: t.0, id: t.1 });
        self.cluster.register(self.membership.lease(), ticket.as_ref(), &records).await.map_err(service_error)
    }

    async fn readopt(&self, sandboxes: &[Registered]) -> Vec<String> {
        if !self.membership.lease_reused() {
            // The lease this node had expired while it was away: the
            // cluster marked its sandboxes lost and gave their quota back.
            return sandboxes.iter().map(|s| s.id.clone()).collect();
        }
        if let Err(e) = self.register(None, sandboxes).await {
            tracing::error!(error = %e, "could not record the adopted sandboxes in the cluster; they are reachable through this node only");
        }
        Vec::new()
    }

    async fn unregister(&self, id: &str, owner: Option<&str>) {
        // A sandbox that stays recorded would route calls here and hold its
        // key's quota: keep trying while etcd is away (its quota entry goes
        // with this node's lease anyway).
        for attempt in 0..300u32 {
            match self.cluster.unregister(id, owner).await {
                Ok(()) => return,
                Err(e) if attempt == 0 => tracing::warn!(sandbox = %id, error = %e, "could not forget a sandbox in the cluster; retrying"),
                Err(_) => {}
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        tracing::error!(sandbox = %id, "gave up forgetting a sandbox in the cluster");
    }

    async fn publish_space(&self, meta: &SpaceMeta, dir: &Path) -> Result<(), Error> {
        let value = serde_json::to_value(meta).map_err(|e| Error::internal("could not describe a space", e))?;
        let from = (meta.info.sandbox_id.as_str(), meta.hibernated);
        self.cluster.publish_space(&self.membership.name(), &meta.info.space_id, meta.owner.clone(), value, dir, from).await.map_err(service_error)?;
        // The cluster's copy is the one: a local one could be resumed here
        // after another node took it.
        let doomed = dir.to_path_buf();
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(doomed)).await;
        Ok(())
    }

    async fn spaces(&self) -> Result<Option<Vec<SpaceMeta>>, Error> {
        let all = self.cluster.spaces().await.map_err(service_error)?;
        Ok(Some(all.into_iter().filter_map(|r| serde_json::from_value(r.meta).ok()).collect()))
    }

    async fn frozen(&self, sandbox_id: &str) -> Result<Option<SpaceMeta>, Error> {
        let record = self.cluster.frozen_space(sandbox_id).await.map_err(service_error)?;
        Ok(record.and_then(|r| serde_json::from_value(r.meta).ok()))
    }

    async fn claim_space(&self, id: &str, dir: &Path) -> Result<bool, Error> {
        let Some(record) = self.cluster.claim_space(id).await.map_err(service_error)? else {
            return Err(Error::NotFound(format!("no space `{id}`")));
        };
        let fetched = !dir.exists();
        if fetched {
            let _ = std::fs::create_dir_all(&self.spaces_dir);
            if let Err(e) = self.cluster.fetch_space(&record, dir).await {
                let _ = self.cluster.unclaim_space(&record).await;
                return Err(service_error(e));
            }
        }
        if let Ok(mut c) = self.claimed.lock() {
            c.insert(id.to_string(), (record, fetched));
        }
        Ok(true)
    }

    async fn space_resumed(&self, id: &str) {
        let claimed = self.claimed.lock().ok().and_then(|mut c| c.remove(id));
        if let Some((record, _)) = claimed {
            if let Err(e) = self.cluster.forget_space(&record).await {
                tracing::warn!(space = %id, error = %e, "could not delete a resumed space's bytes from the store");
            }
        }
    }

    async fn space_unclaimed(&self, id: &str) {
        let claimed = self.claimed.lock().ok().and_then(|mut c| c.remove(id));
        if let Some((record, fetched)) = claimed {
            if let Err(e) = self.cluster.unclaim_space(&record).await {
                tracing::error!(space = %id, error = %e, "could not put a space back in the cluster after a failed resume");
            }
            if fetched {
                let _ = std::fs::remove_dir_all(self.spaces_dir.join(id));
            }
        }
    }

    async fn delete_space(&self, id: &str) -> Result<bool, Error> {
        self.cluster.delete_space(id).await.map_err(service_error)
    }

    async fn publish_template(&self, t: &UserTemplate, layers: &[(String, PathBuf)]) -> Result<(), Error> {
        let record = serde_json::to_value(t).map_err(|e| Error::internal("could not describe a template", e))?;
        self.cluster.publish_template(&self.membership.name(), &t.name, t.owner.clone(), record, layers).await.map_err(service_error)
    }

    async fn template(&self, name: &str) -> Result<TemplateBeyond, Error> {
        match self.cluster.template(name).await.map_err(service_error)? {
            None => Ok(TemplateBeyond::Unknown),
            Some(r) => {
                let t: UserTemplate = serde_json::from_value(r.record).map_err(|e| Error::internal("a cluster template record is unreadable", e))?;
                Ok(TemplateBeyond::Known(Box::new(t), r.layers))
            }
        }
    }

    async fn templates(&self) -> Result<Option<Vec<UserTemplate>>, Error> {
        let all = self.cluster.templates().await.map_err(service_error)?;
        Ok(Some(all.into_iter().filter_map(|r| serde_json::from_value(r.record).ok()).collect()))
    }

    async fn fetch_layer(&self, key: &str, into: &Path) -> Result<(), Error> {
        if let Some(parent) = into.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        self.cluster.fetch_layer(key, into).await.map_err(service_error)
    }

    async fn forget_template(&self, name: &str) -> Result<(), Error> {
        self.cluster.delete_template(name).await.map_err(service_error)
    }
}
