//! `forkbox serve` as a cluster node (docs/cluster.md): the server as
//! always, plus its place in the cluster. It joins under a lease, records
//! its sandboxes and reserves keys' quotas in etcd (`NodeDirectory`, the
//! service's `Directory`), publishes Spaces to the object store, follows
//! the cluster's API keys, publishes its load for placement, and answers
//! only requests that show the cluster secret (its gateways').

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use async_trait::async_trait;
use clap::Args;
use cluster::{Cluster, ClusterConfig, ClusterError, NodeRecord, SpaceRecord};
use service::directory::{Directory, Registered, Ticket};
use service::keys::{KeyLimits, Limit, Refusal};
use service::space_store::SpaceMeta;
use service::Error;

/// Where the cluster is (shared by `serve`, `gateway` and `key`).
#[derive(Args, Debug, Clone)]
pub struct ClusterArgs {
    /// etcd endpoints of the cluster (comma-separated `http://host:port`);
    /// with them, this is a cluster node (docs/cluster.md).
    #[arg(long = "cluster-etcd", env = "FORKBOX_CLUSTER_ETCD", value_delimiter = ',')]
    pub etcd: Vec<String>,
    /// Where Spaces' bytes go: `s3://bucket[/prefix]` (endpoint and
    /// credentials from the AWS_* variables) or `file:///dir`.
    #[arg(long = "cluster-store", env = "FORKBOX_CLUSTER_STORE")]
    pub store: Option<String>,
    /// Prefix of the cluster's keys in etcd.
    #[arg(long = "cluster-prefix", env = "FORKBOX_CLUSTER_PREFIX", default_value = "/forkbox")]
    pub prefix: String,
    /// A file holding the cluster secret (mode 0600, at least 32
    /// characters), shown by gateways to nodes.
    #[arg(long = "cluster-secret-file", env = "FORKBOX_CLUSTER_SECRET_FILE")]
    pub secret_file: Option<PathBuf>,
}

impl ClusterArgs {
    pub fn enabled(&self) -> bool {
        !self.etcd.is_empty()
    }

    pub fn config(&self, default_store: &str) -> ClusterConfig {
        ClusterConfig { etcd: self.etcd.clone(), prefix: self.prefix.clone(), store: Some(self.store.clone().unwrap_or_else(|| default_store.to_string())) }
    }

    /// For what needs etcd only (gateways, keys).
    pub fn etcd_only(&self) -> ClusterConfig {
        ClusterConfig { etcd: self.etcd.clone(), prefix: self.prefix.clone(), store: None }
    }

    pub fn secret(&self) -> anyhow::Result<cluster::secret::Secret> {
        let path = self.secret_file.as_ref().context("a cluster needs --cluster-secret-file (a file holding at least 32 random characters, mode 0600)")?;
        Ok(cluster::secret::Secret::from_file(path)?)
    }
}

/// This node's own settings.
#[derive(Args, Debug, Clone)]
pub struct NodeArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// This node's name in the cluster [default: the host's name].
    #[arg(long, env = "FORKBOX_NODE_NAME")]
    pub node_name: Option<String>,
    /// Where gateways reach this node's API [default: http://<listen>].
    #[arg(long, env = "FORKBOX_ADVERTISE")]
    pub advertise: Option<String>,
    /// Seconds the cluster waits for this node's keep-alive before taking
    /// it for lost.
    #[arg(long = "cluster-lease-seconds", env = "FORKBOX_CLUSTER_LEASE_SECONDS", default_value_t = 10, value_parser = clap::value_parser!(i64).range(2..=600))]
    pub lease_seconds: i64,
}

/// A joined node: what `serve` keeps for after the server starts and ends.
pub struct Node {
    cluster: Cluster,
    membership: Arc<cluster::membership::Membership>,
    state: std::sync::OnceLock<server::AppState>,
}

/// Join the cluster and make `config` a node's.
pub async fn join(args: &NodeArgs, config: &mut server::ServerConfig) -> anyhow::Result<Node> {
    let secret = args.cluster.secret()?;
    let default_store = format!("file://{}", config.state_dir.join("cluster-store").display());
    let cluster = Cluster::connect(&args.cluster.config(&default_store)).await.context("connect to the cluster")?;
    let name = match &args.node_name {
        Some(n) => n.clone(),
        None => std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "node".into()),
    };
    if name.is_empty() || name.len() > 64 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_') {
        anyhow::bail!("invalid node name `{name}`: 1 to 64 of [A-Za-z0-9._-]");
    }
    let api = args.advertise.clone().unwrap_or_else(|| format!("http://{}", config.listen));
    let record =
        NodeRecord { name: name.clone(), api, incarnation: cluster::random_hex(8), started_ms: cluster::now_ms(), draining: false, load: Default::default() };
    std::fs::create_dir_all(&config.state_dir).with_context(|| format!("create {}", config.state_dir.display()))?;
    let membership = cluster.join(record, args.lease_seconds, &config.state_dir.join("cluster-lease")).await?;
    let directory = NodeDirectory {
        cluster: cluster.clone(),
        membership: Arc::clone(&membership),
        claimed: Mutex::new(HashMap::new()),
        spaces_dir: config.state_dir.join("spaces"),
    };
    config.directory = service::config::DirectoryHandle(Arc::new(directory));
    use sha2::Digest;
    config.cluster_secret_sha256 = Some(sha2::Sha256::digest(secret.expose().as_bytes()).into());
    tracing::info!(node = %name, store = %args.cluster.config(&default_store).store.unwrap_or_default(), "a cluster node");
    Ok(Node { cluster, membership, state: std::sync::OnceLock::new() })
}

impl Node {
    /// Once the service runs: follow the cluster's keys and nodes, publish
    /// this node's load, and give up the sandboxes the cluster declared
    /// lost if this node was cut off past its lease.
    pub fn started(&self, state: server::AppState) {
        let _ = self.state.set(state.clone());
        let cluster = self.cluster.clone();
        let keys_state = state.clone();
        tokio::spawn(async move {
            match cluster.follow_keys().await {
                Ok(mut keys) => loop {
                    let now: Vec<service::keys::StoredKey> = keys.borrow_and_update().iter().map(stored_key).collect();
                    keys_state.inner.keys.set_cluster_keys(now);
                    if keys.changed().await.is_err() {
                        return;
                    }
                },
                Err(e) => tracing::error!(error = %e, "could not follow the cluster's API keys"),
            }
        });
        // Every node reaps: whichever sees a node leave first marks its
        // sandboxes lost.
        let mut nodes = self.cluster.follow_nodes(true);
        tokio::spawn(async move { while nodes.changed().await.is_ok() {} });
        tokio::spawn(publish_load(Arc::clone(&self.membership), state.clone()));
        let mut renewals = self.membership.renewals();
        tokio::spawn(async move {
            while renewals.changed().await.is_ok() {
                let caller = service::keys::Caller::anonymous();
                let all = state.list(&caller).await;
                tracing::error!(sandboxes = all.len(), "this node was taken for lost: its sandboxes were released in the cluster and are destroyed here");
                for e in all {
                    let _ = state.destroy(&caller, &e.id).await;
                }
            }
        });
    }

    /// After the server stopped: forget what is left of this node in the
    /// cluster and leave it, unless its sandboxes stay for the next server
    /// (an upgrade), which takes the lease over.
    pub async fn stopped(&self) {
        if self.state.get().is_some_and(|s| s.inner.engine.is_left_running()) {
            return;
        }
        if let Ok(mine) = self.cluster.sandboxes_on(&self.membership.name()).await {
            for s in mine {
                let _ = self.cluster.unregister(&s.id, s.owner.as_deref()).await;
            }
        }
        self.membership.leave().await;
    }
}

fn stored_key(k: &cluster::keys::ClusterKey) -> service::keys::StoredKey {
    service::keys::StoredKey { name: k.name.clone(), sha256: k.sha256.clone(), created: k.created, limits: k.limits }
}

/// Publish what this node holds and has room for, every two seconds.
async fn publish_load(membership: Arc<cluster::membership::Membership>, state: server::AppState) {
    let config = &state.inner.config;
    let max_memory_mib = config.limits.max_memory_mib.unwrap_or_else(service::config::default_memory_cap_mib);
    loop {
        let sandboxes = state.inner.sandboxes.read().await.len() as u64;
        let mut warm: Vec<String> = state.pool_info(&service::keys::Caller::anonymous()).await.templates.into_keys().collect();
        warm.sort();
        let load = cluster::Load { sandboxes, max_sandboxes: config.limits.max_sandboxes as u64, memory_mib: state.memory_in_use_mib(), max_memory_mib, warm };
        if let Err(e) = membership.update(|r| r.load = load).await {
            tracing::debug!(error = %e, "could not publish this node's load");
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The cluster as the service's directory.
struct NodeDirectory {
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
        self.cluster.publish_space(&self.membership.name(), &meta.info.space_id, meta.owner.clone(), value, dir).await.map_err(service_error)?;
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
}
