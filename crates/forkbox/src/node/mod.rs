//! `forkbox serve` as a cluster node (docs/cluster.md): the server as
//! always, plus its place in the cluster. It joins under a lease, records
//! its sandboxes and reserves keys' quotas in etcd (`NodeDirectory`, the
//! service's `Directory`), publishes Spaces to the object store, follows
//! the cluster's API keys, publishes its load for placement, and answers
//! only requests that show the cluster secret (its gateways').

mod directory;
mod drain;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use cluster::{Cluster, ClusterConfig, NodeRecord};

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
    /// Networks no sandbox may reach, not even through an allow-list:
    /// where gateways and the cluster's services live (on Kubernetes, the
    /// pod and service CIDRs). etcd's members, the object store and the
    /// other nodes are denied without being named.
    #[arg(long = "cluster-deny", env = "FORKBOX_CLUSTER_DENY", value_delimiter = ',', value_parser = parse_net)]
    pub deny: Vec<ipnet::IpNet>,
}

/// A network (`10.0.0.0/8`) or one address (`10.0.0.5`).
fn parse_net(s: &str) -> Result<ipnet::IpNet, String> {
    s.parse::<ipnet::IpNet>()
        .or_else(|_| s.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| format!("`{s}` is neither a network nor an address"))
}

/// The addresses `url`'s host has (none if it does not resolve now).
async fn addresses_of(url: &str) -> Vec<ipnet::IpNet> {
    let Ok(parsed) = reqwest::Url::parse(url) else { return Vec::new() };
    let Some(host) = parsed.host_str() else { return Vec::new() };
    let target = (host.trim_start_matches('[').trim_end_matches(']').to_string(), parsed.port_or_known_default().unwrap_or(80));
    let found = tokio::net::lookup_host(target).await;
    match found {
        Ok(addrs) => addrs.map(|a| ipnet::IpNet::from(a.ip())).collect(),
        Err(_) => Vec::new(),
    }
}

/// A joined node: what `serve` keeps for after the server starts and ends.
pub struct Node {
    cluster: Cluster,
    membership: Arc<cluster::membership::Membership>,
    state: std::sync::OnceLock<server::AppState>,
    /// Denied to sandboxes whatever the peers: the operator's networks,
    /// etcd's members, the object store.
    denied: Vec<ipnet::IpNet>,
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
    let directory = directory::NodeDirectory::new(cluster.clone(), Arc::clone(&membership), config.state_dir.join("spaces"));
    config.directory = service::config::DirectoryHandle(Arc::new(directory));
    use sha2::Digest;
    config.cluster_secret_sha256 = Some(sha2::Sha256::digest(secret.expose().as_bytes()).into());
    tracing::info!(node = %name, store = %args.cluster.config(&default_store).store.unwrap_or_default(), "a cluster node");
    // No sandbox reaches the cluster's parts (docs/cluster.md#security).
    let mut denied = args.deny.clone();
    for endpoint in &args.cluster.etcd {
        denied.extend(addresses_of(endpoint).await);
    }
    if let Some(endpoint) = std::env::var("AWS_ENDPOINT").ok().filter(|_| args.cluster.store.as_deref().is_some_and(|s| s.starts_with("s3://"))) {
        denied.extend(addresses_of(&endpoint).await);
    }
    jail::host_addrs::deny(denied.clone());
    Ok(Node { cluster, membership, state: std::sync::OnceLock::new(), denied })
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
        // Every node reaps (whichever sees a node leave first marks its
        // sandboxes lost), and denies its sandboxes the other nodes' APIs,
        // wherever they are.
        let mut nodes = self.cluster.follow_nodes(true);
        let denied = self.denied.clone();
        tokio::spawn(async move {
            while nodes.changed().await.is_ok() {
                let apis: Vec<String> = nodes.borrow_and_update().iter().map(|n| n.api.clone()).collect();
                let mut all = denied.clone();
                for api in apis {
                    all.extend(addresses_of(&api).await);
                }
                all.sort();
                all.dedup();
                jail::host_addrs::deny(all);
            }
        });
        tokio::spawn(publish_load(Arc::clone(&self.membership), state.clone()));
        tokio::spawn(drain::answer_resumes(self.cluster.clone(), self.membership.name(), state.clone()));
        tokio::spawn(drain::follow_drains(self.cluster.clone(), Arc::clone(&self.membership), state.clone()));
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
