//! A sandbox's files (docs/files.md): paths resolved safely by `jail::fs`,
//! blocking filesystem work on tokio's blocking pool, and uploads written
//! from a stream of chunks through a short queue, so a 2 GB upload costs the
//! server a few chunks of memory, not 2 GB. Front ends parse their requests
//! and shape their answers; what is done to the files is here.

use std::io::Write;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use jail::fs::{FsError, PendingWrite, SandboxFs, SandboxPath};
use protocol::Written;

use crate::error::Error;
use crate::sandbox::SandboxEntry;

/// Where relative paths start (the sandbox's home and the REPL's first cwd).
pub const HOME: &str = "/root";
/// Entries a listing returns unless told otherwise, and its cap.
pub const DEFAULT_LIST_LIMIT: usize = 10_000;
pub const MAX_LIST_LIMIT: usize = 100_000;
/// Upload chunks queued between the socket and the disk writer.
const UPLOAD_QUEUE: usize = 8;

/// A path inside the sandbox; relative ones start at [`HOME`].
pub fn sandbox_path(raw: &str) -> Result<SandboxPath, Error> {
    Ok(SandboxPath::parse(raw, HOME)?)
}

/// Run `op` on the sandbox's filesystem on the blocking pool.
pub async fn with_fs<T: Send + 'static>(entry: &Arc<SandboxEntry>, op: impl FnOnce(&SandboxFs) -> Result<T, FsError> + Send + 'static) -> Result<T, Error> {
    entry.touch();
    crate::sandbox::freezer::ensure_running(entry).await?;
    entry.revive().await?;
    let engine = Arc::clone(&entry.engine);
    tokio::task::spawn_blocking(move || {
        let fs = engine.fs().map_err(|e| Error::Conflict(format!("the sandbox's filesystem is not reachable right now ({e}); retry")))?;
        op(&fs).map_err(Error::from)
    })
    .await
    .map_err(|e| Error::internal("files task failed", e))?
}

/// How an upload writes its file.
#[derive(Debug, Clone, Copy)]
pub struct UploadOptions {
    /// Append instead of replacing (not atomic).
    pub append: bool,
    /// The file's mode (None: the replaced file's, or 644).
    pub mode: Option<u32>,
    /// Create missing parent directories.
    pub parents: bool,
    /// Most bytes the file may get.
    pub limit: u64,
}

/// An upload whose file is open: [`Upload::write`] feeds it. Dropped
/// before it commits, it removes the partial file.
pub struct Upload {
    entry: Arc<SandboxEntry>,
    pending: PendingWrite,
    shown: String,
    limit: u64,
}

impl Upload {
    /// Open `path` for writing (nothing is read from the client yet, so a
    /// refusal leaves its body unread for the front end to deal with).
    pub async fn begin(entry: &Arc<SandboxEntry>, path: SandboxPath, options: UploadOptions) -> Result<Upload, Error> {
        let shown = path.to_string();
        let UploadOptions { append, mode, parents, limit } = options;
        let pending = with_fs(entry, move |fs| fs.write(&path, append, mode, parents)).await?;
        Ok(Upload { entry: Arc::clone(entry), pending, shown, limit })
    }

    /// What an upload larger than `limit` is answered.
    pub fn too_large(limit: u64) -> Error {
        Error::TooLarge(format!("the file is larger than the server's limit of {limit} bytes"))
    }

    /// Write every chunk of `body`, then commit the file in place. A body
    /// cut short, or longer than the limit, leaves no file behind.
    pub async fn write<E: std::fmt::Display>(self, body: impl Stream<Item = Result<bytes::Bytes, E>> + Unpin) -> Result<Written, Error> {
        let Upload { entry, pending, shown, limit } = self;
        // The disk side: a blocking writer fed through a short queue, so the
        // socket is read only as fast as the disk takes it.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(UPLOAD_QUEUE);
        let writer = tokio::task::spawn_blocking(move || {
            let mut pending = pending;
            while let Some(chunk) = rx.blocking_recv() {
                if let Err(e) = pending.file().write_all(&chunk) {
                    let err = pending.error(&e);
                    return (pending, Some(err));
                }
            }
            (pending, None)
        });
        let mut bytes: u64 = 0;
        let mut failure: Option<Error> = None;
        let mut body = body;
        while let Some(chunk) = body.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    failure = Some(Error::Invalid(format!("the upload was cut short: {e}")));
                    break;
                }
            };
            bytes += chunk.len() as u64;
            if bytes > limit {
                failure = Some(Self::too_large(limit));
                break;
            }
            if tx.send(chunk).await.is_err() {
                break; // the writer failed; its error is below
            }
        }
        drop(tx);
        let (pending, write_error) = writer.await.map_err(|e| Error::internal("upload writer failed", e))?;
        if let Some(e) = write_error {
            return Err(e.into());
        }
        if let Some(e) = failure {
            return Err(e); // dropping `pending` removes the partial file
        }
        tokio::task::spawn_blocking(move || pending.commit()).await.map_err(|e| Error::internal("commit upload", e))??;
        entry.touch();
        Ok(Written { path: shown, bytes })
    }
}
