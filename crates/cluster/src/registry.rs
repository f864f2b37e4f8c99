//! Which node holds each sandbox. A node registers a sandbox once it is
//! live there (in the same transaction as the key's quota entry and the
//! end of its reservation) and unregisters it when it is destroyed; a
//! gateway looks ids up here to route a call.

use etcd_client::{GetOptions, PutOptions, Txn, TxnOp};

use crate::error::{json, parse};
use crate::quota::Ticket;
use crate::records::{FrozenRecord, LostRecord, SandboxRecord};
use crate::{Cluster, Result};

/// Most sandboxes registered in one transaction (etcd takes 128
/// operations per transaction by default; each sandbox needs two).
const PER_TXN: usize = 60;

/// What a lookup of an id found.
#[derive(Debug, Clone, PartialEq)]
pub enum Found {
    Live(SandboxRecord),
    Lost(LostRecord),
    /// On its way from a draining node to another: wait.
    Moving(crate::moves::Moving),
    /// Frozen into a Space, or hibernating (a call wakes it).
    Frozen(FrozenRecord),
    Unknown,
}

impl Cluster {
    /// `records` are live on this node (under `lease`): record where they
    /// are and charge them to their owners, ending `ticket`.
    pub async fn register(&self, lease: i64, ticket: Option<&Ticket>, records: &[SandboxRecord]) -> Result<()> {
        let l = &self.layout;
        let chunks: Vec<&[SandboxRecord]> = if records.is_empty() { vec![&[]] } else { records.chunks(PER_TXN).collect() };
        let last = chunks.len() - 1;
        for (i, chunk) in chunks.into_iter().enumerate() {
            let mut ops = Vec::with_capacity(chunk.len() * 2 + 1);
            for r in chunk {
                ops.push(TxnOp::put(l.sandbox(&r.id), json(r), None));
                if let Some(owner) = &r.owner {
                    ops.push(TxnOp::put(l.owned(owner, &r.id), r.ram_mib.to_string(), Some(PutOptions::new().with_lease(lease))));
                }
            }
            // The reservation ends with the last part: until then it
            // still holds what the rest will take.
            if let (Some(t), true) = (ticket, i == last) {
                ops.push(TxnOp::delete(l.ticket(&t.owner, &t.id), None));
            }
            if let Err(e) = self.txn(Txn::new().and_then(ops)).await {
                // The caller destroys them: no record of them may appear
                // later, from this or an earlier part.
                let mut keys = Vec::new();
                for r in records {
                    keys.push(l.sandbox(&r.id));
                    keys.extend(r.owner.as_ref().map(|o| l.owned(o, &r.id)));
                }
                self.forget_later(keys);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Sandbox `id` is gone (destroyed, merged away, frozen): forget it.
    pub async fn unregister(&self, id: &str, owner: Option<&str>) -> Result<()> {
        let l = &self.layout;
        let mut ops = vec![TxnOp::delete(l.sandbox(id), None)];
        if let Some(owner) = owner {
            ops.push(TxnOp::delete(l.owned(owner, id), None));
        }
        self.txn(Txn::new().and_then(ops)).await.map(|_| ())
    }

    /// Where sandbox `id` is, or why it is not.
    pub async fn find(&self, id: &str) -> Result<Found> {
        let l = &self.layout;
        let keys = [l.moving(id), l.sandbox(id), l.lost(id), l.frozen(id)];
        let ops = self.txn(Txn::new().and_then(keys.clone().map(|k| TxnOp::get(k, None)))).await?.op_responses();
        let found: Vec<&etcd_client::KeyValue> =
            ops.iter().filter_map(|o| if let etcd_client::TxnOpResponse::Get(g) = o { g.kvs().first() } else { None }).collect();
        // In that order: a moving sandbox is still recorded where it was
        // (and frozen, while it moves), a woken one is live before its
        // Space is forgotten.
        let Some(kv) = found.first() else { return Ok(Found::Unknown) };
        match keys.iter().position(|k| k.as_bytes() == kv.key()) {
            Some(0) => Ok(Found::Moving(parse(kv.key(), kv.value())?)),
            Some(1) => Ok(Found::Live(parse(kv.key(), kv.value())?)),
            Some(2) => Ok(Found::Lost(parse(kv.key(), kv.value())?)),
            _ => Ok(Found::Frozen(parse(kv.key(), kv.value())?)),
        }
    }

    /// The sandboxes recorded on `node` (a restarted node's own).
    pub async fn sandboxes_on(&self, node: &str) -> Result<Vec<SandboxRecord>> {
        Ok(self.all_sandboxes().await?.into_iter().filter(|s| s.node == node).collect())
    }

    /// Every sandbox recorded, of every node.
    pub async fn sandboxes(&self) -> Result<Vec<SandboxRecord>> {
        self.all_sandboxes().await
    }

    /// How many sandboxes are recorded (tests: nothing left behind).
    pub async fn count_sandboxes(&self) -> Result<usize> {
        let prefix = self.layout.sandboxes();
        let r = self
            .retry(|mut kv| {
                let prefix = prefix.clone();
                async move { kv.get(prefix, Some(GetOptions::new().with_prefix().with_count_only())).await }
            })
            .await?;
        Ok(r.count() as usize)
    }
}

// A fork of 32 registers in one transaction, within etcd's default 128
// operations.
const _: () = assert!(32 <= PER_TXN && PER_TXN * 2 < 128);
