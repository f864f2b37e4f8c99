//! Draining a node: moving each of its sandboxes to another node under the
//! same id, then taking no new work (docs/cluster.md#drain). Nodes and
//! gateways coordinate it through etcd alone:
//!
//! 1. a gateway writes `drain/<node>` and waits for `drained/<node>`;
//! 2. the node marks itself draining (placement skips it) and, for each
//!    sandbox, marks it `moving` (gateways hold its calls), freezes it into
//!    a Space, and asks a peer to resume that Space under the same id
//!    (`resume/<peer>/<space>`), waiting for the peer's answer
//!    (`resumed/<ticket>`); if the peer cannot, it resumes it itself;
//! 3. it writes its report.

use std::time::Duration;

use etcd_client::{PutOptions, Txn, TxnOp};
use serde::{Deserialize, Serialize};

use crate::error::{json, parse};
use crate::{now_ms, Cluster, Result};

/// How long a moving mark, a resume request and its answer live.
const MOVE_KEPT: i64 = 600;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DrainRequest {
    pub ticket: String,
    pub at_ms: u64,
}

/// What a drain did: each sandbox moved (and where) or why not.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DrainReport {
    pub ticket: String,
    pub node: String,
    pub moved: Vec<Moved>,
    pub failed: Vec<NotMoved>,
    pub took_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Moved {
    pub id: String,
    pub to: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NotMoved {
    pub id: String,
    pub error: String,
}

/// A sandbox on its way between nodes: calls with its id wait.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Moving {
    pub id: String,
    pub from: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ResumeRequest {
    pub space: String,
    /// The id the resumed sandbox takes.
    pub keep_id: String,
    pub ticket: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ResumeAnswer {
    pub node: String,
    pub error: Option<String>,
}

impl Cluster {
    async fn put_for(&self, key: String, value: Vec<u8>, ttl: Option<i64>) -> Result<()> {
        let options = match ttl {
            Some(ttl) => Some(PutOptions::new().with_lease(self.grant(ttl).await?)),
            None => None,
        };
        self.txn(Txn::new().and_then([TxnOp::put(key, value, options)])).await.map(|_| ())
    }

    async fn delete_key(&self, key: String) -> Result<()> {
        self.txn(Txn::new().and_then([TxnOp::delete(key, None)])).await.map(|_| ())
    }

    async fn read<T: serde::de::DeserializeOwned>(&self, key: String) -> Result<Option<T>> {
        let r = self.get_key(key).await?;
        r.kvs().first().map(|kv| parse(kv.key(), kv.value())).transpose()
    }

    /// Ask `node` to drain (a gateway); answers the request's ticket.
    pub async fn request_drain(&self, node: &str) -> Result<String> {
        let ticket = crate::random_hex(8);
        self.put_for(self.layout.drain(node), json(&DrainRequest { ticket: ticket.clone(), at_ms: now_ms() }), None).await?;
        Ok(ticket)
    }

    /// Let `node` take work again (its drain request goes).
    pub async fn cancel_drain(&self, node: &str) -> Result<()> {
        self.delete_key(self.layout.drain(node)).await
    }

    /// The report of the drain `ticket` asked of `node`, once written.
    pub async fn drain_report(&self, node: &str, ticket: &str) -> Result<Option<DrainReport>> {
        Ok(self.read::<DrainReport>(self.layout.drained(node)).await?.filter(|r| r.ticket == ticket))
    }

    /// The drain asked of `node`, if any (a node at start and after each change).
    pub async fn drain_requested(&self, node: &str) -> Result<Option<DrainRequest>> {
        self.read(self.layout.drain(node)).await
    }

    pub async fn report_drain(&self, report: &DrainReport) -> Result<()> {
        self.put_for(self.layout.drained(&report.node), json(report), Some(crate::membership::LOST_KEPT)).await
    }

    /// Hold the calls of sandbox `id` (it leaves `from`).
    pub async fn mark_moving(&self, id: &str, from: &str) -> Result<()> {
        self.put_for(self.layout.moving(id), json(&Moving { id: id.to_string(), from: from.to_string() }), Some(MOVE_KEPT)).await
    }

    pub async fn moved(&self, id: &str) -> Result<()> {
        self.delete_key(self.layout.moving(id)).await
    }

    /// Ask `peer` to resume `space` as sandbox `keep_id`, and wait for its
    /// answer (at most `wait`).
    pub async fn resume_on(&self, peer: &str, space: &str, keep_id: &str, wait: Duration) -> Result<ResumeAnswer> {
        let ticket = crate::random_hex(8);
        let request = ResumeRequest { space: space.to_string(), keep_id: keep_id.to_string(), ticket: ticket.clone() };
        self.put_for(self.layout.resume(peer, space), json(&request), Some(MOVE_KEPT)).await?;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(answer) = self.read::<ResumeAnswer>(self.layout.resumed(&ticket)).await? {
                let _ = self.delete_key(self.layout.resumed(&ticket)).await;
                return Ok(answer);
            }
            if tokio::time::Instant::now() >= deadline {
                let _ = self.delete_key(self.layout.resume(peer, space)).await;
                return Ok(ResumeAnswer { node: peer.to_string(), error: Some(format!("node {peer} did not answer within {} s", wait.as_secs())) });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The resumes asked of `node` now (it answers each with `answer_resume`).
    pub async fn resume_requests(&self, node: &str) -> Result<Vec<ResumeRequest>> {
        let r = self.get_prefix(self.layout.resumes_for(node)).await?;
        r.kvs().iter().map(|kv| parse(kv.key(), kv.value())).collect()
    }

    pub async fn answer_resume(&self, node: &str, request: &ResumeRequest, error: Option<String>) -> Result<()> {
        self.put_for(self.layout.resumed(&request.ticket), json(&ResumeAnswer { node: node.to_string(), error }), Some(MOVE_KEPT)).await?;
        self.delete_key(self.layout.resume(node, &request.space)).await
    }

    /// Wake at each change under `dir` (and at least every `every`): what
    /// a node follows its drain and resume requests with.
    pub async fn changes_under(&self, dir: &str, every: Duration) -> tokio::sync::mpsc::Receiver<()> {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let (me, dir) = (self.clone(), dir.to_string());
        tokio::spawn(async move {
            loop {
                let _ = tx.try_send(());
                let revision = match me.get_prefix(dir.clone()).await {
                    Ok(r) => r.header().map(|h| h.revision()).unwrap_or(0),
                    Err(_) => {
                        tokio::time::sleep(every).await;
                        continue;
                    }
                };
                let Ok(mut watch) = me.watch_after(&dir, revision, false).await else {
                    me.stream_failed();
                    tokio::time::sleep(every).await;
                    continue;
                };
                loop {
                    match tokio::time::timeout(every, watch.next()).await {
                        Ok(Ok(_)) | Err(_) => {
                            if tx.is_closed() {
                                return;
                            }
                            let _ = tx.try_send(());
                        }
                        Ok(Err(_)) => {
                            me.stream_failed();
                            break;
                        }
                    }
                }
            }
        });
        rx
    }
}
