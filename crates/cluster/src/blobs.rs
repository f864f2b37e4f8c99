//! The cluster's bytes (Spaces' archives) in object storage, through
//! `object_store`: any S3-compatible service (`s3://bucket/prefix`,
//! endpoint and credentials from the `AWS_*` environment variables, as the
//! AWS tools read them), or a local directory (`file:///path`), the
//! default of a single-machine cluster.
//!
//! Objects are written by streaming a file in parts and read back into a
//! file: a Space may be larger than memory.

use std::path::Path as FsPath;
use std::sync::Arc;

use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, WriteMultipart};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{ClusterError, Result};

/// Size of each part of an upload.
const PART: usize = 8 << 20;

#[derive(Clone)]
pub struct Blobs {
    store: Arc<dyn ObjectStore>,
    base: Path,
    /// Where they are, for logs and errors (no credentials).
    pub describe: String,
}

impl Blobs {
    pub fn open(url: &str) -> Result<Blobs> {
        let parsed = url::Url::parse(url).map_err(|e| ClusterError::Config(format!("object store `{url}`: {e}")))?;
        match parsed.scheme() {
            "file" => {
                let dir = parsed.to_file_path().map_err(|_| ClusterError::Config(format!("object store `{url}`: not a local path")))?;
                std::fs::create_dir_all(&dir).map_err(|e| ClusterError::io(format!("create {}", dir.display()), e))?;
                // The server's alone, as its state directory is.
                use std::os::unix::fs::PermissionsExt;
                let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
                let store = object_store::local::LocalFileSystem::new_with_prefix(&dir).map_err(ClusterError::store)?;
                Ok(Blobs { store: Arc::new(store), base: Path::default(), describe: url.to_string() })
            }
            "s3" => {
                let options: Vec<(String, String)> =
                    std::env::vars().filter(|(k, _)| k.starts_with("AWS_")).map(|(k, v)| (k.to_ascii_lowercase(), v)).collect();
                let (store, base) = object_store::parse_url_opts(&parsed, options).map_err(ClusterError::store)?;
                Ok(Blobs { store: Arc::from(store), base, describe: url.to_string() })
            }
            other => Err(ClusterError::Config(format!("object store `{url}`: scheme `{other}` is not s3:// or file://"))),
        }
    }

    fn path(&self, key: &str) -> Path {
        key.split('/').fold(self.base.clone(), |p, part| p.child(part))
    }

    /// Store the file at `file` as `key`; returns its size.
    pub async fn put_file(&self, key: &str, file: &FsPath) -> Result<u64> {
        let mut f = tokio::fs::File::open(file).await.map_err(|e| ClusterError::io(format!("open {}", file.display()), e))?;
        let upload = self.store.put_multipart(&self.path(key)).await.map_err(ClusterError::store)?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART);
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        loop {
            let n = f.read(&mut buf).await.map_err(|e| ClusterError::io(format!("read {}", file.display()), e))?;
            if n == 0 {
                break;
            }
            writer.wait_for_capacity(4).await.map_err(ClusterError::store)?;
            writer.write(&buf[..n]);
            total += n as u64;
        }
        writer.finish().await.map_err(ClusterError::store)?;
        Ok(total)
    }

    /// Write object `key` to the file `file` (created); returns its size.
    pub async fn get_to_file(&self, key: &str, file: &FsPath) -> Result<u64> {
        let got = self.store.get(&self.path(key)).await.map_err(ClusterError::store)?;
        let mut out = tokio::fs::File::create(file).await.map_err(|e| ClusterError::io(format!("create {}", file.display()), e))?;
        let mut stream = got.into_stream();
        let mut total = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(ClusterError::store)?;
            out.write_all(&chunk).await.map_err(|e| ClusterError::io(format!("write {}", file.display()), e))?;
            total += chunk.len() as u64;
        }
        out.sync_all().await.map_err(|e| ClusterError::io(format!("sync {}", file.display()), e))?;
        Ok(total)
    }

    /// Whether object `key` is stored.
    pub async fn exists(&self, key: &str) -> Result<bool> {
        match self.store.head(&self.path(key)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(ClusterError::store(e)),
        }
    }

    /// Remove object `key` (gone already is fine).
    pub async fn delete(&self, key: &str) -> Result<()> {
        match self.store.delete(&self.path(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(ClusterError::store(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_file_goes_in_and_comes_back_in_parts() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = Blobs::open(&format!("file://{}/store", dir.path().display())).unwrap();
        let src = dir.path().join("src");
        // Three parts and a bit.
        let data: Vec<u8> = (0..(3 * PART + 12345)).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&src, &data).unwrap();
        assert_eq!(blobs.put_file("spaces/sp-x.tar", &src).await.unwrap(), data.len() as u64);
        let back = dir.path().join("back");
        assert_eq!(blobs.get_to_file("spaces/sp-x.tar", &back).await.unwrap(), data.len() as u64);
        assert!(std::fs::read(&back).unwrap() == data);
        blobs.delete("spaces/sp-x.tar").await.unwrap();
        blobs.delete("spaces/sp-x.tar").await.unwrap();
        assert!(blobs.get_to_file("spaces/sp-x.tar", &back).await.is_err());
    }
}
