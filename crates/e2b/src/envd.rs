//! envd, the agent E2B runs in every sandbox on port 49983, served from
//! outside the sandbox: the Connect services (process.rs, filesystem.rs,
//! routed in lib.rs),
//! `GET /health`, and `/files`, the REST path for file bytes, streamed
//! through `service::files` both ways (a 1 GiB file costs the server a few
//! chunks of memory), gzip either way, multipart or raw uploads, and the
//! signed links E2B's SDKs make for third parties.

use std::io::{Read, Write};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use jail::fs::SandboxPath;
use service::files::{with_fs, Upload, UploadOptions};
use service::sandbox::processes::User;
use service::sandbox::SandboxEntry;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::error::ApiError;
use crate::{auth, E2b, Sandbox};

/// The user E2B runs everything as unless told otherwise.
pub const DEFAULT_USER: &str = "user";
/// Read size of downloads.
const CHUNK: usize = 256 * 1024;
/// Chunks queued between the disk and the socket.
const QUEUE: usize = 8;
/// Where a file's E2B metadata lives: user extended attributes
/// `user.e2b.<key>`, as envd keeps them.
pub const METADATA_XATTR_PREFIX: &str = "user.e2b.";
/// An upload's metadata headers: `X-Metadata-<key>: <value>`.
const METADATA_HEADER_PREFIX: &str = "x-metadata-";
/// Most metadata entries on one upload, and the longest key and value
/// (a key's xattr name stays under Linux's 255 bytes).
pub const MAX_METADATA_ENTRIES: usize = 32;
pub const MAX_METADATA_KEY: usize = 128;
pub const MAX_METADATA_VALUE: usize = 4096;

pub fn router() -> Router<E2b> {
    Router::new().route("/health", get(health)).route("/files", get(download).post(upload))
}

/// A sandbox reached without its token, by a signed link: `/files` checks
/// the signature before using it.
#[derive(Clone)]
pub struct Unverified(pub Arc<SandboxEntry>);

async fn health() -> StatusCode {
    StatusCode::NO_CONTENT
}

/// The user a call runs as: the one it names, or E2B's `user` (root in a
/// template that has no such user).
pub async fn user(entry: &Arc<SandboxEntry>, asked: Option<&str>) -> Result<User, service::Error> {
    match asked.filter(|u| !u.is_empty()) {
        Some(name) => service::sandbox::processes::user(entry, name).await,
        None => match service::sandbox::processes::user(entry, DEFAULT_USER).await {
            Ok(u) => Ok(u),
            Err(service::Error::Invalid(_)) => Ok(User::root()),
            Err(e) => Err(e),
        },
    }
}

/// A path as envd reads it: relative to the user's home.
pub fn path_for(raw: &str, user: &User) -> Result<SandboxPath, service::Error> {
    if raw.is_empty() {
        return Err(service::Error::Invalid("path is empty".into()));
    }
    Ok(SandboxPath::parse(raw, &user.home)?)
}

#[derive(Debug, Default, serde::Deserialize)]
pub struct FilesQuery {
    path: Option<String>,
    username: Option<String>,
    signature: Option<String>,
    signature_expiration: Option<i64>,
}

/// The sandbox a `/files` call may use: by its token, or by a valid,
/// unexpired signature for this path, operation and user.
fn files_sandbox(req: &Request, q: &FilesQuery, operation: &str, e2b: &E2b) -> Result<Arc<SandboxEntry>, ApiError> {
    if let Some(Sandbox(entry)) = req.extensions().get::<Sandbox>() {
        return Ok(Arc::clone(entry));
    }
    let Some(Unverified(entry)) = req.extensions().get::<Unverified>() else {
        return Err(ApiError::new(StatusCode::UNAUTHORIZED, "missing access token"));
    };
    if q.signature.is_none() || q.path.is_none() {
        return Err(ApiError::new(StatusCode::UNAUTHORIZED, "missing access token or signature"));
    }
    if q.signature_expiration.is_some_and(|exp| exp < chrono::Utc::now().timestamp()) {
        return Err(ApiError::new(StatusCode::UNAUTHORIZED, "the signed link has expired"));
    }
    if !q.signed_by(operation, &e2b.tokens.token(&entry.id)) {
        return Err(ApiError::new(StatusCode::UNAUTHORIZED, "invalid signature"));
    }
    Ok(Arc::clone(entry))
}

impl FilesQuery {
    /// The query of a signed `/files` link (`None` for any other request).
    pub fn signed_link(uri: &axum::http::Uri) -> Option<FilesQuery> {
        if uri.path() != "/files" {
            return None;
        }
        let axum::extract::Query(q) = axum::extract::Query::<FilesQuery>::try_from_uri(uri).ok()?;
        q.signature.is_some().then_some(q)
    }

    /// Whether this link's signature was made with `token` for `operation`
    /// (`read` or `write`); expiry is checked apart.
    pub fn signed_by(&self, operation: &str, token: &str) -> bool {
        let (Some(sig), Some(path)) = (&self.signature, &self.path) else { return false };
        let expected = auth::file_signature(path, operation, self.username.as_deref().unwrap_or(""), token, self.signature_expiration);
        // Both are public-length strings; compare without an early exit anyway.
        expected.len() == sig.len() && expected.bytes().zip(sig.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }

    /// The operation a `/files` method signs for.
    pub fn operation(method: &axum::http::Method) -> Option<&'static str> {
        match *method {
            axum::http::Method::GET => Some("read"),
            axum::http::Method::POST => Some("write"),
            _ => None,
        }
    }
}

/// The SDKs read `/files` errors by status (404 file not found, 507 a
/// full disk), with the service's message.
fn files_error(e: service::Error) -> ApiError {
    ApiError::from(e)
}

async fn download(State(e2b): State<E2b>, q: Result<Query<FilesQuery>, axum::extract::rejection::QueryRejection>, req: Request) -> Result<Response, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let entry = files_sandbox(&req, &q, "read", &e2b)?;
    let user = user(&entry, q.username.as_deref()).await.map_err(files_error)?;
    let path = path_for(q.path.as_deref().unwrap_or(""), &user).map_err(files_error)?;
    let (file, _info) = with_fs(&entry, move |fs| fs.open_read(&path)).await.map_err(files_error)?;
    let gzip = accepts_gzip(req.headers());
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(QUEUE);
    tokio::task::spawn_blocking(move || read_out(file, gzip, tx));
    let mut resp = Response::builder().status(StatusCode::OK).header(header::CONTENT_TYPE, "application/octet-stream");
    if gzip {
        resp = resp.header(header::CONTENT_ENCODING, "gzip");
    }
    Ok(resp.body(Body::from_stream(ReceiverStream::new(rx))).unwrap_or_default())
}

fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers.get(header::ACCEPT_ENCODING).and_then(|v| v.to_str().ok()).is_some_and(|v| v.split(',').any(|e| e.trim().split(';').next() == Some("gzip")))
}

/// A channel's sending side as a `Write` (for the gzip encoder).
struct ChannelWriter(mpsc::Sender<Result<Bytes, std::io::Error>>);

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.blocking_send(Ok(Bytes::copy_from_slice(buf))).map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "client gone"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Read `file` into the channel (gzipped when asked), one chunk at a time.
fn read_out(mut file: std::fs::File, gzip: bool, tx: mpsc::Sender<Result<Bytes, std::io::Error>>) {
    let sink = ChannelWriter(tx.clone());
    // Dropping the encoder finishes the gzip stream (and flushes its buffer).
    let mut out: Box<dyn Write> = if gzip {
        Box::new(flate2::write::GzEncoder::new(std::io::BufWriter::with_capacity(CHUNK, sink), flate2::Compression::fast()))
    } else {
        Box::new(sink)
    };
    let mut buf = vec![0u8; CHUNK];
    loop {
        match file.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if out.write_all(&buf[..n]).is_err() {
                    return; // the client went
                }
            }
            Err(e) => {
                let _ = tx.blocking_send(Err(e));
                return;
            }
        }
    }
}

/// One file an upload wrote, as the SDKs read it.
#[derive(serde::Serialize)]
struct WrittenInfo {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    path: String,
    #[serde(skip_serializing_if = "Metadata::is_empty")]
    metadata: Metadata,
}

/// A file's E2B metadata, key → value (keys lowercased).
pub type Metadata = std::collections::BTreeMap<String, String>;

/// An upload's `X-Metadata-*` headers, checked: keys are HTTP tokens
/// (lowercased, as envd keeps them), values printable ASCII, within limits.
fn upload_metadata(headers: &HeaderMap) -> Result<Metadata, ApiError> {
    let mut out = Metadata::new();
    for (name, value) in headers {
        let Some(key) = name.as_str().strip_prefix(METADATA_HEADER_PREFIX) else { continue };
        if key.is_empty() || key.len() > MAX_METADATA_KEY {
            return Err(ApiError::bad_request(format!("metadata keys are 1 to {MAX_METADATA_KEY} characters")));
        }
        let value = value.to_str().ok().filter(|v| v.bytes().all(|b| (0x20..0x7f).contains(&b)));
        let Some(value) = value else { return Err(ApiError::bad_request(format!("metadata value of {key} is not printable ASCII"))) };
        if value.len() > MAX_METADATA_VALUE {
            return Err(ApiError::bad_request(format!("metadata value of {key} is longer than {MAX_METADATA_VALUE} bytes")));
        }
        out.insert(key.to_string(), value.to_string());
    }
    if out.len() > MAX_METADATA_ENTRIES {
        return Err(ApiError::bad_request(format!("at most {MAX_METADATA_ENTRIES} metadata entries per upload")));
    }
    Ok(out)
}

async fn upload(State(e2b): State<E2b>, q: Result<Query<FilesQuery>, axum::extract::rejection::QueryRejection>, req: Request) -> Result<Response, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let entry = files_sandbox(&req, &q, "write", &e2b)?;
    let user = user(&entry, q.username.as_deref()).await.map_err(files_error)?;
    let limit = e2b.service.inner.config.limits.max_file_bytes;
    let ct = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("application/octet-stream").to_string();
    let gzip = req.headers().get(header::CONTENT_ENCODING).and_then(|v| v.to_str().ok()).map(|v| v.trim().eq_ignore_ascii_case("gzip"));
    if req.headers().get(header::CONTENT_ENCODING).is_some() && gzip != Some(true) {
        return Err(ApiError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "only gzip content encoding is accepted"));
    }
    let metadata = upload_metadata(req.headers())?;
    let body = req.into_body().into_data_stream();
    let mut written = Vec::new();
    if ct.starts_with("multipart/form-data") {
        let boundary = multer::parse_boundary(&ct).map_err(|e| ApiError::bad_request(format!("multipart: {e}")))?;
        let mut form = multer::Multipart::new(body, boundary);
        while let Some(field) = form.next_field().await.map_err(|e| ApiError::bad_request(format!("multipart: {e}")))? {
            // ?path= names the file (an upload link signs it); without it,
            // each part's file name is its path, as the SDKs' multi-file writes send.
            let raw = match (&q.path, field.file_name().filter(|f| !f.is_empty())) {
                (Some(p), _) => p.clone(),
                (None, Some(f)) => f.to_string(),
                (None, None) => return Err(ApiError::bad_request("a multipart part needs a file name (its path)")),
            };
            let path = path_for(&raw, &user).map_err(files_error)?;
            written.push(write_one(&entry, &user, path, &metadata, field.map(|c| c.map_err(|e| e.to_string())), limit).await?);
        }
    } else {
        let raw = q.path.clone().ok_or_else(|| ApiError::bad_request("path is required"))?;
        let path = path_for(&raw, &user).map_err(files_error)?;
        let body = body.map(|c| c.map_err(|e| e.to_string()));
        let info = if gzip == Some(true) {
            write_one(&entry, &user, path, &metadata, gunzip(body), limit).await?
        } else {
            write_one(&entry, &user, path, &metadata, body, limit).await?
        };
        written.push(info);
    }
    if written.is_empty() {
        return Err(ApiError::bad_request("the upload holds no file"));
    }
    Ok(axum::Json(written).into_response())
}

async fn write_one(
    entry: &Arc<SandboxEntry>,
    user: &User,
    path: SandboxPath,
    metadata: &Metadata,
    body: impl Stream<Item = Result<Bytes, String>> + Send + Unpin,
    limit: u64,
) -> Result<WrittenInfo, ApiError> {
    let shown = path.to_string();
    let name = path.name().unwrap_or("/").to_string();
    let upload = Upload::begin(entry, path.clone(), UploadOptions { append: false, mode: None, parents: true, limit }).await.map_err(files_error)?;
    upload.write(body).await.map_err(files_error)?;
    let (uid, gid, attrs) = (user.uid, user.gid, metadata.clone());
    if uid == 0 && attrs.is_empty() {
        // Nothing to set or chown: no trip into the sandbox's files.
        return Ok(WrittenInfo { name, kind: "file", path: shown, metadata: attrs });
    }
    with_fs(entry, move |fs| {
        for (key, value) in &attrs {
            fs.set_xattr(&path, &format!("{METADATA_XATTR_PREFIX}{key}"), value.as_bytes())?;
        }
        if uid != 0 {
            fs.chown(&path, uid, gid)?;
        }
        Ok(())
    })
    .await
    .map_err(files_error)?;
    Ok(WrittenInfo { name, kind: "file", path: shown, metadata: metadata.clone() })
}

/// Gunzip a body as it streams: decoded on the blocking pool, in chunks.
fn gunzip(body: impl Stream<Item = Result<Bytes, String>> + Send + Unpin + 'static) -> impl Stream<Item = Result<Bytes, String>> + Send + Unpin {
    let reader = tokio_util::io::StreamReader::new(body.map(|c| c.map_err(std::io::Error::other)));
    let (tx, rx) = mpsc::channel::<Result<Bytes, String>>(QUEUE);
    let handle = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let bridge = tokio_util::io::SyncIoBridge::new_with_handle(reader, handle);
        let mut dec = flate2::read::MultiGzDecoder::new(bridge);
        let mut buf = vec![0u8; CHUNK];
        loop {
            match dec.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    if tx.blocking_send(Ok(Bytes::copy_from_slice(&buf[..n]))).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.blocking_send(Err(format!("invalid gzip body: {e}")));
                    return;
                }
            }
        }
    });
    ReceiverStream::new(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzip_is_recognised_in_accept_encoding() {
        let mut h = HeaderMap::new();
        assert!(!accepts_gzip(&h));
        h.insert(header::ACCEPT_ENCODING, "br, gzip;q=0.5".parse().unwrap());
        assert!(accepts_gzip(&h));
        h.insert(header::ACCEPT_ENCODING, "gzipx".parse().unwrap());
        assert!(!accepts_gzip(&h));
    }

    #[test]
    fn paths_start_at_the_users_home() {
        let user = User { name: "user".into(), uid: 1000, gid: 1000, home: "/home/user".into() };
        assert_eq!(path_for("a/b.txt", &user).unwrap().to_string(), "/home/user/a/b.txt");
        assert_eq!(path_for("/etc/x", &user).unwrap().to_string(), "/etc/x");
        assert!(path_for("", &user).is_err());
    }
}
