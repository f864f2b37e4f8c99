//! Nodes: each is a key under a lease it keeps alive, so a node that dies
//! or is cut off vanishes on its own within the lease's TTL. Everyone
//! (nodes and gateways) follows the list; when a node vanishes, one
//! survivor marks its sandboxes lost (`reap`), and their quota went with
//! the lease.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, EventType, PutOptions, Txn, TxnOp};
use tokio::sync::watch;

use crate::error::{json, parse};
use crate::records::{LostRecord, NodeRecord, SandboxRecord};
use crate::{Cluster, ClusterError, Result};

/// How long records of lost sandboxes and of reaped nodes are kept.
pub const LOST_KEPT: i64 = 24 * 3600;

/// This process's place in the cluster as a node.
pub struct Membership {
    cluster: Cluster,
    lease: Mutex<i64>,
    record: Mutex<NodeRecord>,
    ttl: i64,
    lease_file: PathBuf,
    /// Joined under the lease a previous process of this node held.
    reused: bool,
    /// Moves each time the lease is replaced (the old one expired: the
    /// cluster took this node for lost).
    renewed: watch::Sender<u64>,
}

impl Cluster {
    /// Join as `record.name` under the lease saved in `lease_file` if etcd
    /// still keeps it (a restart within the TTL keeps this node's
    /// sandboxes and reservations), else under a new one. Refuses a name
    /// another live node holds.
    pub async fn join(&self, record: NodeRecord, ttl: i64, lease_file: &Path) -> Result<Arc<Membership>> {
        let saved = std::fs::read_to_string(lease_file).ok().and_then(|s| i64::from_str_radix(s.trim(), 16).ok());
        let mut lease = None;
        if let Some(id) = saved {
            if let Ok(r) = self.retry(|mut kv| async move { kv.lease_time_to_live(id, None).await }).await {
                if r.ttl() > 0 {
                    lease = Some(id);
                }
            }
        }
        let key = self.layout.node(&record.name);
        let held = self.get_key(key.clone()).await?;
        if let Some(kv_) = held.kvs().first() {
            if Some(kv_.lease()) != lease {
                let other: NodeRecord = parse(kv_.key(), kv_.value())?;
                return Err(ClusterError::Conflict(format!(
                    "node name `{}` is held by another live node ({}, started {}); pick another with --node-name",
                    record.name, other.api, other.started_ms
                )));
            }
        }
        let lease = match lease {
            Some(id) => id,
            None => self.grant(ttl).await?,
        };
        std::fs::write(lease_file, format!("{lease:x}\n")).map_err(|e| ClusterError::io(format!("write {}", lease_file.display()), e))?;
        self.txn(Txn::new().and_then([TxnOp::put(key, json(&record), Some(PutOptions::new().with_lease(lease)))])).await?;
        let (renewed, _) = watch::channel(0);
        let reused = saved == Some(lease);
        let me = Arc::new(Membership {
            cluster: self.clone(),
            lease: Mutex::new(lease),
            record: Mutex::new(record),
            ttl,
            lease_file: lease_file.to_path_buf(),
            renewed,
            reused,
        });
        tokio::spawn(Arc::clone(&me).keep_alive());
        tracing::info!(node = %me.name(), lease = format!("{lease:x}"), ttl, reused = saved == Some(lease), "joined the cluster");
        Ok(me)
    }

    /// The live nodes now.
    pub async fn nodes(&self) -> Result<Vec<NodeRecord>> {
        let r = self.get_prefix(self.layout.nodes()).await?;
        r.kvs().iter().map(|kv| parse(kv.key(), kv.value())).collect()
    }

    /// Follow the live nodes: the list now, then each change. With
    /// `reaper`, this process also marks the sandboxes of a node that left
    /// lost (any number of processes may: one wins each node).
    pub fn follow_nodes(&self, reaper: bool) -> watch::Receiver<Vec<NodeRecord>> {
        let (tx, rx) = watch::channel(Vec::new());
        tokio::spawn(self.clone().follow_loop(tx, reaper));
        rx
    }

    async fn follow_loop(self, tx: watch::Sender<Vec<NodeRecord>>, reaper: bool) {
        loop {
            if let Err(e) = self.follow_once(&tx, reaper).await {
                tracing::warn!(error = %e, "lost the cluster's node list; following again");
                self.stream_failed();
            }
            if tx.is_closed() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    async fn follow_once(&self, tx: &watch::Sender<Vec<NodeRecord>>, reaper: bool) -> Result<()> {
        let dir = self.layout.nodes();
        let now = self.get_prefix(dir.clone()).await?;
        let revision = now.header().map(|h| h.revision()).unwrap_or(0);
        let mut nodes: Vec<(NodeRecord, i64)> = Vec::new();
        for kv_ in now.kvs() {
            nodes.push((parse(kv_.key(), kv_.value())?, kv_.lease()));
        }
        tx.send_replace(nodes.iter().map(|(n, _)| n.clone()).collect());
        if reaper {
            // Nodes that left while nobody was following.
            self.reap_absent(&nodes.iter().map(|(n, _)| n.name.clone()).collect::<Vec<_>>()).await?;
        }
        let mut watch = self.watch_after(&dir, revision, true).await?;
        loop {
            let resp = watch.next().await?;
            for ev in resp.events() {
                let Some(kv_) = ev.kv() else { continue };
                let Some(name) = self.layout.name_in(&dir, kv_.key()) else { continue };
                match ev.event_type() {
                    EventType::Put => {
                        let record: NodeRecord = parse(kv_.key(), kv_.value())?;
                        nodes.retain(|(n, _)| n.name != name);
                        nodes.push((record, kv_.lease()));
                    }
                    EventType::Delete => {
                        let lease = ev.prev_kv().map(|p| p.lease()).or_else(|| nodes.iter().find(|(n, _)| n.name == name).map(|(_, l)| *l)).unwrap_or(0);
                        nodes.retain(|(n, _)| n.name != name);
                        if reaper {
                            let (me, name) = (self.clone(), name.to_string());
                            tokio::spawn(async move {
                                if let Err(e) = me.reap(&name, lease, "its lease expired").await {
                                    tracing::warn!(node = %name, error = %e, "could not mark a lost node's sandboxes");
                                }
                            });
                        }
                    }
                }
            }
            nodes.sort_by(|a, b| a.0.name.cmp(&b.0.name));
            if tx.send(nodes.iter().map(|(n, _)| n.clone()).collect()).is_err() {
                return Ok(());
            }
        }
    }

    /// Sandboxes recorded on nodes that are not live: their node left.
    async fn reap_absent(&self, live: &[String]) -> Result<()> {
        let mut gone: Vec<String> = self.all_sandboxes().await?.into_iter().map(|s| s.node).filter(|n| !live.contains(n)).collect();
        gone.sort();
        gone.dedup();
        for node in gone {
            self.reap(&node, 0, "it is no longer a member").await?;
        }
        Ok(())
    }

    /// Node `node` (under lease `lease`) left: mark each of its sandboxes
    /// lost, unless another process already did for this lease.
    pub async fn reap(&self, node: &str, lease: i64, why: &str) -> Result<usize> {
        let keep = self.grant(LOST_KEPT).await?;
        let mark = self.layout.reaped(node, lease);
        let first = Txn::new().when([Compare::create_revision(mark.clone(), CompareOp::Equal, 0)]).and_then([TxnOp::put(
            mark,
            "",
            Some(PutOptions::new().with_lease(keep)),
        )]);
        let won = self.txn(first).await?.succeeded();
        if !won && lease != 0 {
            return Ok(0);
        }
        let mut n = 0;
        for s in self.all_sandboxes().await?.into_iter().filter(|s| s.node == node) {
            let lost = LostRecord { id: s.id.clone(), node: node.to_string(), owner: s.owner.clone(), reason: format!("node {node} left ({why})") };
            // Only if it is still that node's (a drain may have moved it).
            let key = self.layout.sandbox(&s.id);
            let moved = self
                .txn(
                    Txn::new()
                        .when([Compare::value(key.clone(), CompareOp::Equal, json(&s))])
                        .and_then([TxnOp::put(self.layout.lost(&s.id), json(&lost), Some(PutOptions::new().with_lease(keep))), TxnOp::delete(key, None)]),
                )
                .await?;
            n += usize::from(moved.succeeded());
        }
        if n > 0 {
            tracing::warn!(node, sandboxes = n, "a node left: its sandboxes are lost");
        }
        Ok(n)
    }

    pub(crate) async fn all_sandboxes(&self) -> Result<Vec<SandboxRecord>> {
        let r = self.get_prefix(self.layout.sandboxes()).await?;
        r.kvs().iter().map(|kv| parse(kv.key(), kv.value())).collect()
    }

    /// A new lease of `ttl` seconds.
    pub(crate) async fn grant(&self, ttl: i64) -> Result<i64> {
        self.retry(|mut kv| async move { kv.lease_grant(ttl, None).await }).await.map(|r| r.id())
    }
}

impl Membership {
    pub fn name(&self) -> String {
        self.record.lock().map(|r| r.name.clone()).unwrap_or_default()
    }

    /// Whether this process took over the lease of the node's previous
    /// process (a restart within the lease), so its sandboxes are its own.
    pub fn lease_reused(&self) -> bool {
        self.reused
    }

    /// The lease this node's keys live under now.
    pub fn lease(&self) -> i64 {
        self.lease.lock().map(|l| *l).unwrap_or(0)
    }

    /// Told each time the lease had to be replaced: the cluster took this
    /// node for lost meanwhile, and its sandboxes with it.
    pub fn renewals(&self) -> watch::Receiver<u64> {
        self.renewed.subscribe()
    }

    /// Publish a new load or draining flag.
    pub async fn update(&self, change: impl FnOnce(&mut NodeRecord)) -> Result<()> {
        let record = {
            let mut r = self.record.lock().map_err(|_| ClusterError::Corrupt("node record lock poisoned".into()))?;
            change(&mut r);
            r.clone()
        };
        let put = TxnOp::put(self.cluster.layout.node(&record.name), json(&record), Some(PutOptions::new().with_lease(self.lease())));
        self.cluster.txn(Txn::new().and_then([put])).await.map(|_| ())
    }

    /// Leave: the node's key and every key under its lease go at once.
    pub async fn leave(&self) {
        let lease = self.lease();
        let _ = self.cluster.retry(|mut kv| async move { kv.lease_revoke(lease).await }).await;
        let _ = std::fs::remove_file(&self.lease_file);
    }

    /// For the process's life.
    async fn keep_alive(self: Arc<Self>) {
        let period = Duration::from_secs((self.ttl / 3).max(1) as u64);
        loop {
            let Err(e) = self.keep_alive_stream(period).await;
            tracing::warn!(node = %self.name(), error = %e, "the cluster lease's keep-alive failed; retrying");
            self.cluster.stream_failed();
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Keep the lease alive (taking a new one if it is gone) until the
    /// stream breaks.
    async fn keep_alive_stream(&self, period: Duration) -> Result<std::convert::Infallible> {
        let mut kv = self.cluster.kv();
        let (mut keeper, mut stream) = kv.lease_keep_alive(self.lease()).await.map_err(ClusterError::etcd)?;
        loop {
            keeper.keep_alive().await.map_err(ClusterError::etcd)?;
            let answer = tokio::time::timeout(crate::ETCD_TIMEOUT, stream.message()).await;
            match answer {
                Ok(Ok(Some(r))) if r.ttl() > 0 => {}
                Ok(Ok(Some(_))) => {
                    self.renew().await?;
                    let (k, s) = kv.lease_keep_alive(self.lease()).await.map_err(ClusterError::etcd)?;
                    (keeper, stream) = (k, s);
                }
                Ok(Ok(None)) => return Err(ClusterError::Unavailable("keep-alive stream closed".into())),
                Ok(Err(e)) => return Err(ClusterError::etcd(e)),
                Err(_) => return Err(ClusterError::Unavailable("no keep-alive answer".into())),
            }
            tokio::time::sleep(period).await;
        }
    }

    /// The lease expired (the node was cut off for longer than its TTL):
    /// take a new one and publish the node again.
    async fn renew(&self) -> Result<()> {
        let lease = self.cluster.grant(self.ttl).await?;
        if let Ok(mut l) = self.lease.lock() {
            *l = lease;
        }
        let _ = std::fs::write(&self.lease_file, format!("{lease:x}\n"));
        self.update(|_| {}).await?;
        tracing::error!(node = %self.name(), "this node's cluster lease expired: the cluster took it for lost; rejoined under a new lease");
        self.renewed.send_modify(|n| *n += 1);
        Ok(())
    }
}
