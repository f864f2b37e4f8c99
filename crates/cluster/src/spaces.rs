//! Spaces any node can resume: the node that froze one archives its
//! directory into the object store, then records it in etcd; a resume on
//! any node claims the record (one transaction: a second claim finds none),
//! fetches and unpacks the archive, and deletes both once the new sandbox
//! is ready, or puts the record back if it could not be made.

use std::path::{Path, PathBuf};

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use crate::error::{json, parse};
use crate::records::{Claim, FrozenRecord, SpaceRecord};
use crate::{now_ms, Cluster, ClusterError, Result};

/// A claim older than this is a resume that died with its node: the Space
/// is available again.
const CLAIM_HOLDS_MS: u64 = 10 * 60 * 1000;

fn claim_holds(s: &SpaceRecord) -> bool {
    s.claimed.as_ref().is_some_and(|c| now_ms().saturating_sub(c.at_ms) < CLAIM_HOLDS_MS)
}

fn blob_key(space_id: &str) -> String {
    format!("spaces/{space_id}.tar")
}

/// A scratch file beside `dir`, removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn scratch_beside(dir: &Path, what: &str) -> Scratch {
    let name = format!(".{what}-{}-{}.tar", dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(), std::process::id());
    Scratch(dir.with_file_name(name))
}

impl Cluster {
    /// Make the Space in `dir` resumable from any node: archive it to the
    /// store, then record it (`meta`: its `meta.json`), and what its
    /// sandbox's id now points at (`from`: that id, and whether it
    /// hibernates), in the same transaction.
    pub async fn publish_space(
        &self,
        node: &str,
        space_id: &str,
        owner: Option<String>,
        meta: serde_json::Value,
        dir: &Path,
        (sandbox_id, hibernated): (&str, bool),
    ) -> Result<SpaceRecord> {
        let scratch = scratch_beside(dir, "publish");
        let (src, out) = (dir.to_path_buf(), scratch.0.clone());
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            let f = std::io::BufWriter::new(std::fs::File::create(&out)?);
            crate::archive::pack(&src, f)
        })
        .await
        .map_err(|e| ClusterError::io("archive a space", std::io::Error::other(e)))?
        .map_err(|e| ClusterError::io(format!("archive {}", dir.display()), e))?;
        let blob = blob_key(space_id);
        let bytes = self.blobs()?.put_file(&blob, &scratch.0).await?;
        let frozen =
            FrozenRecord { sandbox_id: sandbox_id.to_string(), space_id: space_id.to_string(), node: node.to_string(), owner: owner.clone(), hibernated };
        let record = SpaceRecord {
            space_id: space_id.to_string(),
            owner,
            node: node.to_string(),
            blob: blob.clone(),
            archive_bytes: bytes,
            meta,
            claimed: None,
            frozen: Some(frozen.clone()),
        };
        let key = self.layout.space(space_id);
        let puts = vec![TxnOp::put(key.clone(), json(&record), None), TxnOp::put(self.layout.frozen(sandbox_id), json(&frozen), None)];
        let put = self.txn(Txn::new().when([Compare::create_revision(key, CompareOp::Equal, 0)]).and_then(puts)).await;
        match put {
            Ok(r) if r.succeeded() => Ok(record),
            // A retry of a put whose answer was lost finds its own record.
            Ok(_) if self.record(space_id).await.ok().flatten().is_some_and(|(found, _)| found == record) => Ok(record),
            Ok(_) => Err(ClusterError::Conflict(format!("space `{space_id}` exists already"))),
            Err(e) => {
                // The freeze is undone: no record of it may appear later.
                self.forget_later(vec![self.layout.space(space_id), self.layout.frozen(sandbox_id)]);
                let _ = self.blobs()?.delete(&blob).await;
                Err(e)
            }
        }
    }

    /// Space `space_id`'s record and its revision, claimed or not.
    async fn record(&self, space_id: &str) -> Result<Option<(SpaceRecord, i64)>> {
        let r = self.get_key(self.layout.space(space_id)).await?;
        r.kvs().first().map(|kv| Ok((parse(kv.key(), kv.value())?, kv.mod_revision()))).transpose()
    }

    /// Space `space_id`, unless it is being resumed.
    pub async fn space(&self, space_id: &str) -> Result<Option<SpaceRecord>> {
        Ok(self.record(space_id).await?.map(|(s, _)| s).filter(|s| !claim_holds(s)))
    }

    /// Every Space not being resumed, oldest first.
    pub async fn spaces(&self) -> Result<Vec<SpaceRecord>> {
        let r = self.get_prefix(self.layout.spaces()).await?;
        let mut all: Vec<(i64, SpaceRecord)> = r.kvs().iter().map(|kv| Ok((kv.create_revision(), parse(kv.key(), kv.value())?))).collect::<Result<_>>()?;
        all.retain(|(_, s)| !claim_holds(s));
        all.sort_by_key(|(rev, _)| *rev);
        Ok(all.into_iter().map(|(_, s)| s).collect())
    }

    /// Take Space `space_id` for a resume: it is marked claimed, so no
    /// other resume gets it. `None`: there is none (or another has it).
    pub async fn claim_space(&self, space_id: &str) -> Result<Option<SpaceRecord>> {
        let key = self.layout.space(space_id);
        let claim = Claim { by: crate::random_hex(8), at_ms: now_ms() };
        for _ in 0..3 {
            let Some((record, revision)) = self.record(space_id).await? else { return Ok(None) };
            match &record.claimed {
                // Ours: a claim whose answer was lost on the way.
                Some(c) if c.by == claim.by => return Ok(Some(SpaceRecord { claimed: None, ..record })),
                _ if claim_holds(&record) => return Ok(None),
                _ => {}
            }
            let claimed = SpaceRecord { claimed: Some(claim.clone()), ..record.clone() };
            let cas =
                Txn::new().when([Compare::mod_revision(key.clone(), CompareOp::Equal, revision)]).and_then([TxnOp::put(key.clone(), json(&claimed), None)]);
            if self.txn(cas).await?.succeeded() {
                return Ok(Some(SpaceRecord { claimed: None, ..record }));
            }
        }
        Ok(None)
    }

    /// A claimed Space could not be resumed: it is available again.
    pub async fn unclaim_space(&self, record: &SpaceRecord) -> Result<()> {
        let put = TxnOp::put(self.layout.space(&record.space_id), json(&SpaceRecord { claimed: None, ..record.clone() }), None);
        self.txn(Txn::new().and_then([put])).await.map(|_| ())
    }

    /// Bring a claimed Space's directory to `into` (which must not exist).
    pub async fn fetch_space(&self, record: &SpaceRecord, into: &Path) -> Result<()> {
        let scratch = scratch_beside(into, "fetch");
        self.blobs()?.get_to_file(&record.blob, &scratch.0).await?;
        let (src, dst) = (scratch.0.clone(), into.to_path_buf());
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            let f = std::io::BufReader::new(std::fs::File::open(&src)?);
            crate::archive::unpack(f, &dst)
        })
        .await
        .map_err(|e| ClusterError::io("unpack a space", std::io::Error::other(e)))?
        .map_err(|e| {
            let _ = std::fs::remove_dir_all(into);
            ClusterError::io(format!("unpack space {}", record.space_id), e)
        })
    }

    /// A claimed Space was resumed (or deleted): its record and bytes go,
    /// and its sandbox's id stops pointing at it (unless the id was frozen
    /// again meanwhile, into another Space).
    pub async fn forget_space(&self, record: &SpaceRecord) -> Result<()> {
        let space = TxnOp::delete(self.layout.space(&record.space_id), None);
        let txn = match &record.frozen {
            Some(f) => {
                let id = self.layout.frozen(&f.sandbox_id);
                Txn::new().when([Compare::value(id.clone(), CompareOp::Equal, json(f))]).and_then([space.clone(), TxnOp::delete(id, None)]).or_else([space])
            }
            None => Txn::new().and_then([space]),
        };
        self.txn(txn).await?;
        self.blobs()?.delete(&record.blob).await
    }

    /// The Space frozen sandbox `sandbox_id` is in (hibernating or not),
    /// unless it is being resumed.
    pub async fn frozen_space(&self, sandbox_id: &str) -> Result<Option<SpaceRecord>> {
        let r = self.get_key(self.layout.frozen(sandbox_id)).await?;
        let Some(kv) = r.kvs().first() else { return Ok(None) };
        let frozen: FrozenRecord = parse(kv.key(), kv.value())?;
        self.space(&frozen.space_id).await
    }

    /// Delete Space `space_id`; false if there was none.
    pub async fn delete_space(&self, space_id: &str) -> Result<bool> {
        match self.claim_space(space_id).await? {
            Some(record) => {
                self.forget_space(&record).await?;
                Ok(true)
            }
            None => Ok(false),
        }
    }
}
