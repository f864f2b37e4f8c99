//! A forkbox cluster's shared state (docs/cluster.md).
//!
//! Nodes (`forkbox serve --cluster-etcd …`) and gateways (`forkbox
//! gateway`) share two well-kept systems and nothing of their own:
//!
//! - **etcd** holds who the nodes are (each under a lease it keeps alive,
//!   so a node that dies vanishes on its own), which node holds each
//!   sandbox, the API keys, cluster-wide quotas (reserved in transactions,
//!   so two nodes cannot both take a key's last slot) and the Spaces'
//!   records. Consensus, election and replication are etcd's.
//! - **object storage** (S3-compatible, or a local directory) holds the
//!   bytes: Spaces, so one frozen on a node resumes on any other.
//!
//! Every key lives under one prefix (`layout`); every record is JSON
//! (`records`). The crate knows nothing of sandboxes beyond those records:
//! the node's service and the gateway use it.

pub mod archive;
pub mod blobs;
pub mod error;
pub mod keys;
pub mod layout;
pub mod membership;
pub mod moves;
pub mod quota;
pub mod records;
pub mod registry;
pub mod secret;
pub mod spaces;
pub mod templates;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use error::ClusterError;
pub use records::{FrozenRecord, Load, LostRecord, NodeRecord, SandboxRecord, SpaceRecord};

pub type Result<T> = std::result::Result<T, ClusterError>;

/// How long one etcd request may take before it is tried on another
/// member, and the caller is at last told the cluster is unavailable (503)
/// rather than left waiting.
pub const ETCD_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a request is tried, round after round of members, before the
/// caller is told the cluster is unavailable. Long enough for an election
/// whose first rounds split their votes: with etcd's default timeouts one
/// took 4.6 s on a loaded two-core machine (each round waits 1–2 s).
const RETRY_FOR: Duration = Duration::from_secs(10);
/// How often the member in use is checked (and another taken if it
/// stopped answering or lost its quorum).
const MEMBER_CHECK: Duration = Duration::from_millis(500);

/// Where the cluster's state is.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// etcd endpoints (`http://host:port`), any members of one etcd cluster.
    pub etcd: Vec<String>,
    /// Every key of this cluster starts with it (several clusters can
    /// share one etcd).
    pub prefix: String,
    /// Where bytes go: `s3://bucket[/path]` (credentials and endpoint from
    /// the `AWS_*` environment variables) or `file:///dir`; none for what
    /// needs etcd only (gateways, keys).
    pub store: Option<String>,
}

/// A handle on the cluster's state: cheap to clone, one per process.
#[derive(Clone)]
pub struct Cluster {
    members: Arc<Members>,
    pub layout: layout::Layout,
    blobs: Option<blobs::Blobs>,
}

/// One client per etcd member, and which is in use. A request goes to one
/// member; one that fails (down, or cut off from its quorum: the clients
/// ask for a leader) is left for the next, and every request is tried on
/// each member before it fails. A member is never sent a request twice
/// for one call.
struct Members {
    clients: Vec<etcd_client::Client>,
    current: AtomicUsize,
}

impl Members {
    fn client(&self) -> etcd_client::Client {
        self.clients[self.current.load(Ordering::Relaxed) % self.clients.len()].clone()
    }

    /// The member in use failed a request: use the next.
    fn suspect(&self, failed: usize) {
        let _ = self.current.compare_exchange(failed, (failed + 1) % self.clients.len(), Ordering::SeqCst, Ordering::SeqCst);
    }
}

impl Cluster {
    /// Connect to etcd (and check it answers) and open the object store.
    pub async fn connect(config: &ClusterConfig) -> Result<Cluster> {
        if config.etcd.is_empty() {
            return Err(ClusterError::Config("no etcd endpoints".into()));
        }
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(ETCD_TIMEOUT)
            .with_timeout(ETCD_TIMEOUT)
            .with_keep_alive(Duration::from_secs(5), ETCD_TIMEOUT)
            .with_keep_alive_while_idle(true)
            // Refuse answers from a member cut off from its quorum: a
            // write there would hang, a read could be stale.
            .with_require_leader(true);
        let mut clients = Vec::new();
        for endpoint in &config.etcd {
            // Connections are made lazily: a member down now is used once it is back.
            clients.push(etcd_client::Client::connect([endpoint], Some(options.clone())).await.map_err(ClusterError::etcd)?);
        }
        let blobs = config.store.as_deref().map(blobs::Blobs::open).transpose()?;
        let members = Arc::new(Members { clients, current: AtomicUsize::new(0) });
        let cluster = Cluster { members: Arc::clone(&members), layout: layout::Layout::new(&config.prefix), blobs };
        cluster.retry(|mut kv| async move { kv.status().await }).await?;
        tokio::spawn(check_members(Arc::downgrade(&members)));
        Ok(cluster)
    }

    /// A client of the member in use, for a stream (a watch, the lease's
    /// keep-alive): one that breaks is opened again on whichever member is
    /// in use then.
    pub(crate) fn kv(&self) -> etcd_client::Client {
        self.members.client()
    }

    /// Run `op` on the member in use; if it fails, on the next, round
    /// after round for up to `RETRY_FOR` (an election after a member died
    /// takes about a second, and meanwhile every member says it has no
    /// leader). Every caller's `op` may so run more than once for one call:
    /// each is a read, an idempotent write, or a transaction whose compare
    /// makes a second run harmless.
    pub(crate) async fn retry<T, F, Fut>(&self, mut op: F) -> Result<T>
    where
        F: FnMut(etcd_client::Client) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let deadline = tokio::time::Instant::now() + RETRY_FOR;
        let mut last = ClusterError::Unavailable("no etcd member".into());
        loop {
            for _ in 0..self.members.clients.len() {
                // No try outlives the deadline, so a refusal comes in RETRY_FOR.
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                if left.is_zero() {
                    return Err(last);
                }
                let i = self.members.current.load(Ordering::Relaxed) % self.members.clients.len();
                match tokio::time::timeout(left, op(self.members.clients[i].clone())).await {
                    Ok(Ok(v)) => return Ok(v),
                    Ok(Err(e)) => last = ClusterError::etcd(e),
                    Err(_) => last = ClusterError::Unavailable(format!("no answer in {}s", RETRY_FOR.as_secs())),
                }
                self.members.suspect(i);
            }
            tokio::time::sleep(Duration::from_millis(150).min(deadline.saturating_duration_since(tokio::time::Instant::now()))).await;
        }
    }

    /// Every key under `prefix`.
    pub(crate) async fn get_prefix(&self, prefix: String) -> Result<etcd_client::GetResponse> {
        self.retry(|mut kv| {
            let prefix = prefix.clone();
            async move { kv.get(prefix, Some(etcd_client::GetOptions::new().with_prefix())).await }
        })
        .await
    }

    pub(crate) async fn get_key(&self, key: String) -> Result<etcd_client::GetResponse> {
        self.retry(|mut kv| {
            let key = key.clone();
            async move { kv.get(key, None).await }
        })
        .await
    }

    pub(crate) async fn txn(&self, txn: etcd_client::Txn) -> Result<etcd_client::TxnResponse> {
        self.retry(|mut kv| {
            let txn = txn.clone();
            async move { kv.txn(txn).await }
        })
        .await
    }

    /// A watch of every change under `dir` after `revision` (with each
    /// deleted key's last value when `prev`).
    pub(crate) async fn watch_after(&self, dir: &str, revision: i64, prev: bool) -> Result<Watch> {
        let mut options = etcd_client::WatchOptions::new().with_prefix().with_start_revision(revision + 1);
        if prev {
            options = options.with_prev_key();
        }
        let stream = self.kv().watch(dir, Some(options)).await.map_err(ClusterError::etcd)?;
        Ok(Watch { stream, what: dir.to_string() })
    }

    /// A write that failed may still be applied later: etcd answered no,
    /// but a member cut off from its quorum can keep it in its log and
    /// commit it once the quorum is back. Delete `keys` then too, retrying
    /// for up to ten minutes, so no record of what was undone appears.
    pub(crate) fn forget_later(&self, keys: Vec<String>) {
        if keys.is_empty() {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
            // Past the moment a stuck proposal could still be committed.
            let mut settled = 0;
            while tokio::time::Instant::now() < deadline && settled < 3 {
                let ops: Vec<etcd_client::TxnOp> = keys.iter().map(|k| etcd_client::TxnOp::delete(k.clone(), None)).collect();
                match me.txn(etcd_client::Txn::new().and_then(ops)).await {
                    Ok(_) => settled += 1,
                    Err(_) => settled = 0,
                }
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        });
    }

    /// A stream on the member in use broke: use the next.
    pub(crate) fn stream_failed(&self) {
        let i = self.members.current.load(Ordering::Relaxed);
        self.members.suspect(i);
    }

    /// The object store (a cluster handle made for etcd only has none).
    pub fn blobs(&self) -> Result<&blobs::Blobs> {
        self.blobs.as_ref().ok_or_else(|| ClusterError::Config("this process has no object store".into()))
    }

    /// Whether etcd answers now (with a leader).
    pub async fn healthy(&self) -> Result<()> {
        self.retry(|mut kv| async move { kv.status().await }).await.map(|_| ())
    }
}

/// A watch's events, batch by batch.
pub(crate) struct Watch {
    stream: etcd_client::WatchStream,
    what: String,
}

impl Watch {
    /// The next batch; an error when the watch was cancelled or ended (the
    /// follower starts again from a fresh read).
    pub(crate) async fn next(&mut self) -> Result<etcd_client::WatchResponse> {
        match self.stream.message().await.map_err(ClusterError::etcd)? {
            Some(r) if r.canceled() => Err(ClusterError::Unavailable(format!("the watch of {} was cancelled: {}", self.what, r.cancel_reason()))),
            Some(r) => Ok(r),
            None => Err(ClusterError::Unavailable(format!("the watch of {} ended", self.what))),
        }
    }
}

/// Keep the member in use one that answers with a leader, so requests
/// seldom meet a dead one first.
async fn check_members(members: std::sync::Weak<Members>) {
    loop {
        tokio::time::sleep(MEMBER_CHECK).await;
        let Some(members) = members.upgrade() else { return };
        let i = members.current.load(Ordering::Relaxed) % members.clients.len();
        let ok = |mut c: etcd_client::Client| async move { matches!(tokio::time::timeout(ETCD_TIMEOUT, c.status()).await, Ok(Ok(_))) };
        if ok(members.clients[i].clone()).await {
            continue;
        }
        for step in 1..members.clients.len() {
            let j = (i + step) % members.clients.len();
            if ok(members.clients[j].clone()).await {
                tracing::info!(member = j, "an etcd member stopped answering; using another");
                members.current.store(j, Ordering::SeqCst);
                break;
            }
        }
    }
}

/// `bytes` random bytes in hex (incarnations, tickets).
pub fn random_hex(bytes: usize) -> String {
    (0..bytes).map(|_| format!("{:02x}", rand::random::<u8>())).collect()
}

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
