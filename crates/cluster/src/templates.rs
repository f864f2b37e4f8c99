//! Custom templates any node can serve: the node that builds or saves one
//! archives each of its layers into the object store (a layer's key names
//! its contents, so one stored is never stored again) and records the
//! template in etcd; a node asked for a template it lacks fetches the
//! layers it does not have and registers it (docs/cluster.md#templates).

use std::path::{Path, PathBuf};

use etcd_client::{Txn, TxnOp};
use serde::{Deserialize, Serialize};

use crate::error::{json, parse};
use crate::{now_ms, Cluster, ClusterError, Result};

/// A custom template: the service's record of it, and its layers' keys,
/// the bottom one first.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TemplateRecord {
    pub name: String,
    #[serde(default)]
    pub owner: Option<String>,
    /// The node that made it.
    pub node: String,
    pub layers: Vec<String>,
    /// The service's template record, as that node wrote it.
    pub record: serde_json::Value,
    pub updated_ms: u64,
}

fn layer_blob(key: &str) -> String {
    format!("layers/{key}.tar")
}

impl Cluster {
    /// Make template `name` (its layers: key and directory, the bottom one
    /// first) servable by every node: the layers the store lacks go in,
    /// then the record.
    pub async fn publish_template(&self, node: &str, name: &str, owner: Option<String>, record: serde_json::Value, layers: &[(String, PathBuf)]) -> Result<()> {
        for (key, dir) in layers {
            let blob = layer_blob(key);
            if self.blobs()?.exists(&blob).await? {
                continue;
            }
            let scratch = dir.with_file_name(format!(".publish-{key}-{}.tar", std::process::id()));
            let (src, out) = (dir.clone(), scratch.clone());
            let packed = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
                let f = std::io::BufWriter::new(std::fs::File::create(&out)?);
                // Its files, record and saved REPL state; `rootfs` is the
                // stack's read-only mount, not the layer's.
                crate::archive::pack_except(&src, f, &["rootfs"])
            })
            .await
            .map_err(|e| ClusterError::io("archive a layer", std::io::Error::other(e)))?;
            let put = match packed {
                Ok(()) => self.blobs()?.put_file(&blob, &scratch).await.map(|_| ()),
                Err(e) => Err(ClusterError::io(format!("archive layer {key}"), e)),
            };
            let _ = std::fs::remove_file(&scratch);
            put?;
        }
        let t = TemplateRecord {
            name: name.to_string(),
            owner,
            node: node.to_string(),
            layers: layers.iter().map(|(k, _)| k.clone()).collect(),
            record,
            updated_ms: now_ms(),
        };
        self.txn(Txn::new().and_then([TxnOp::put(self.layout.template(name), json(&t), None)])).await.map(|_| ())
    }

    pub async fn template(&self, name: &str) -> Result<Option<TemplateRecord>> {
        let r = self.get_key(self.layout.template(name)).await?;
        r.kvs().first().map(|kv| parse(kv.key(), kv.value())).transpose()
    }

    pub async fn templates(&self) -> Result<Vec<TemplateRecord>> {
        let r = self.get_prefix(self.layout.templates()).await?;
        r.kvs().iter().map(|kv| parse(kv.key(), kv.value())).collect()
    }

    /// Bring layer `key` to `into` (which must not exist).
    pub async fn fetch_layer(&self, key: &str, into: &Path) -> Result<()> {
        let scratch = into.with_file_name(format!(".fetch-{key}-{}.tar", std::process::id()));
        self.blobs()?.get_to_file(&layer_blob(key), &scratch).await?;
        let (src, dst) = (scratch.clone(), into.to_path_buf());
        let unpacked = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            let f = std::io::BufReader::new(std::fs::File::open(&src)?);
            crate::archive::unpack(f, &dst)
        })
        .await
        .map_err(|e| ClusterError::io("unpack a layer", std::io::Error::other(e)))?;
        let _ = std::fs::remove_file(&scratch);
        unpacked.map_err(|e| {
            let _ = std::fs::remove_dir_all(into);
            ClusterError::io(format!("unpack layer {key}"), e)
        })
    }

    /// Template `name` is deleted (its layers stay in the store: other
    /// templates may stand on them).
    pub async fn delete_template(&self, name: &str) -> Result<()> {
        self.txn(Txn::new().and_then([TxnOp::delete(self.layout.template(name), None)])).await.map(|_| ())
    }
}
