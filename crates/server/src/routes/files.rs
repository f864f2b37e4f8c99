//! The files routes (docs/files.md): parse the query, call
//! `service::files`, and stream downloads with `Range` support.

use std::io::{Seek, SeekFrom};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use protocol::{ChmodRequest, FileInfo, FileList, MkdirRequest, RenameRequest, Written};
use serde::Deserialize;
use service::files::{sandbox_path, with_fs, Upload, UploadOptions, DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT};
use tokio::io::AsyncReadExt;

use crate::error::ApiError;
use crate::http::{flag, json, Json, Key};
use crate::AppState;

/// A refused upload's body up to this size is read before answering.
const DRAIN_ON_ERROR: u64 = 64 * 1024;
/// Read size of downloads.
const DOWNLOAD_CHUNK: usize = 256 * 1024;

/// Query of the `/files` routes.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct FileQuery {
    /// Path inside the sandbox (relative paths start at /root).
    pub path: String,
    /// GET: list a directory (`1`/`true`).
    pub list: Option<String>,
    /// GET: answer the path's metadata instead of its contents.
    pub stat: Option<String>,
    /// GET `list=1`: most entries to return (default 10000, at most 100000).
    pub limit: Option<usize>,
    /// PUT: append instead of replacing (not atomic).
    pub append: Option<String>,
    /// PUT: mode of the file, octal (default: the replaced file's, or 644).
    pub mode: Option<String>,
    /// PUT: create missing parent directories (default true).
    pub parents: Option<String>,
    /// DELETE: remove a directory and everything in it.
    pub recursive: Option<String>,
}

type FileQueryResult = Result<Query<FileQuery>, axum::extract::rejection::QueryRejection>;

fn query(q: FileQueryResult) -> Result<FileQuery, ApiError> {
    q.map(|Query(q)| q).map_err(|e| ApiError::BadRequest(e.body_text()))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", params(("id" = String, Path), FileQuery),
    responses((status = 200, description = "The file's bytes (or, with `list`/`stat`, JSON: FileList / FileInfo)", content_type = "application/octet-stream"),
        (status = 206, description = "The requested byte range"), (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody),
        (status = 409, body = protocol::ErrorBody), (status = 416, body = protocol::ErrorBody)))]
pub async fn get(
    State(state): State<AppState>,
    Key(caller): Key,
    Path(id): Path<String>,
    q: FileQueryResult,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let entry = state.get(&caller, &id).await?;
    let q = query(q)?;
    let path = sandbox_path(&q.path)?;
    if flag(&q.list, "list", false)? {
        let limit = q.limit.unwrap_or(DEFAULT_LIST_LIMIT);
        if limit == 0 || limit > MAX_LIST_LIMIT {
            return Err(ApiError::BadRequest(format!("limit must be between 1 and {MAX_LIST_LIMIT}")));
        }
        let shown = path.to_string();
        let (entries, truncated) = with_fs(&entry, move |fs| fs.list(&path, limit)).await?;
        return Ok(json(StatusCode::OK, &FileList { path: shown, entries, truncated }));
    }
    if flag(&q.stat, "stat", false)? {
        let info: FileInfo = with_fs(&entry, move |fs| fs.stat(&path, true)).await?;
        return Ok(json(StatusCode::OK, &info));
    }
    let (file, info) = with_fs(&entry, move |fs| fs.open_read(&path)).await?;
    let sent = state.inner.metrics.file_bytes("out");
    download(file, info.size, headers.get(header::RANGE).and_then(|v| v.to_str().ok()), sent).await
}

/// Which bytes a `Range` header asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum ByteRange {
    /// No (usable) range: the whole file, 200.
    Whole,
    /// `start..=end`, 206.
    Part(u64, u64),
    /// 416.
    Unsatisfiable,
}

/// Parse a single `bytes=` range (RFC 9110 §14.1.2). Malformed headers and
/// multi-range requests are ignored (answered with the whole file), as the
/// RFC allows.
pub fn parse_range(header: Option<&str>, size: u64) -> ByteRange {
    let Some(spec) = header.and_then(|h| h.trim().strip_prefix("bytes=")) else { return ByteRange::Whole };
    if spec.contains(',') {
        return ByteRange::Whole;
    }
    let Some((first, last)) = spec.split_once('-') else { return ByteRange::Whole };
    let (first, last) = (first.trim(), last.trim());
    if first.is_empty() {
        // Suffix: the last N bytes.
        return match last.parse::<u64>() {
            Ok(0) => ByteRange::Unsatisfiable,
            Ok(_) if size == 0 => ByteRange::Unsatisfiable,
            Ok(n) => ByteRange::Part(size.saturating_sub(n), size - 1),
            Err(_) => ByteRange::Whole,
        };
    }
    let Ok(start) = first.parse::<u64>() else { return ByteRange::Whole };
    let end = match last {
        "" => u64::MAX,
        l => match l.parse::<u64>() {
            Ok(e) if e >= start => e,
            _ => return ByteRange::Whole,
        },
    };
    if start >= size {
        return ByteRange::Unsatisfiable;
    }
    ByteRange::Part(start, end.min(size - 1))
}

/// `sent` counts the bytes as they go out (metrics).
async fn download(mut file: std::fs::File, size: u64, range: Option<&str>, sent: prometheus_client::metrics::counter::Counter) -> Result<Response, ApiError> {
    let (status, start, len) = match parse_range(range, size) {
        ByteRange::Whole => (StatusCode::OK, 0, size),
        ByteRange::Part(s, e) => (StatusCode::PARTIAL_CONTENT, s, e - s + 1),
        ByteRange::Unsatisfiable => {
            let mut r = ApiError::RangeNotSatisfiable(format!("the range is outside the file ({size} bytes)")).into_response();
            if let Ok(v) = format!("bytes */{size}").parse() {
                r.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            return Ok(r);
        }
    };
    if start > 0 {
        file.seek(SeekFrom::Start(start)).map_err(|e| ApiError::engine("seek", e))?;
    }
    let reader = tokio::fs::File::from_std(file).take(len);
    let chunks = tokio_util::io::ReaderStream::with_capacity(reader, DOWNLOAD_CHUNK).inspect(move |chunk| {
        if let Ok(c) = chunk {
            sent.inc_by(c.len() as u64);
        }
    });
    let body = Body::from_stream(chunks);
    let mut builder = Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, len)
        .header(header::ACCEPT_RANGES, "bytes");
    if status == StatusCode::PARTIAL_CONTENT {
        builder = builder.header(header::CONTENT_RANGE, format!("bytes {start}-{}/{size}", start + len - 1));
    }
    builder.body(body).map_err(|e| ApiError::engine("build response", e))
}

#[utoipa::path(put, path = "/v1/sandboxes/{id}/files", params(("id" = String, Path), FileQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The file's bytes, any size (streamed)"),
    responses((status = 200, body = Written), (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody),
        (status = 409, body = protocol::ErrorBody), (status = 413, body = protocol::ErrorBody), (status = 507, body = protocol::ErrorBody)))]
pub async fn put(
    State(state): State<AppState>,
    Key(caller): Key,
    Path(id): Path<String>,
    q: FileQueryResult,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let entry = state.get(&caller, &id).await?;
    let q = query(q)?;
    let path = sandbox_path(&q.path)?;
    let append = flag(&q.append, "append", false)?;
    let parents = flag(&q.parents, "parents", true)?;
    let mode = q.mode.as_deref().map(protocol::parse_octal_mode).transpose().map_err(ApiError::BadRequest)?;
    let limit = state.inner.config.limits.max_file_bytes;
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(Upload::too_large(limit).into());
    }
    let upload = match Upload::begin(&entry, path, UploadOptions { append, mode, parents, limit }).await {
        Ok(u) => u,
        Err(e) => {
            // Read a small unread body first, so the connection stays usable
            // for the client's next request (a big one is cut off instead).
            if declared.is_some_and(|n| n <= DRAIN_ON_ERROR) {
                let _ = tokio::time::timeout(Duration::from_secs(1), axum::body::to_bytes(body, DRAIN_ON_ERROR as usize)).await;
            }
            return Err(e.into());
        }
    };
    let written = upload.write(body.into_data_stream()).await?;
    state.inner.metrics.file_bytes("in").inc_by(written.bytes);
    Ok(json(StatusCode::OK, &written))
}

#[utoipa::path(delete, path = "/v1/sandboxes/{id}/files", params(("id" = String, Path), FileQuery),
    responses((status = 204), (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody), (status = 409, body = protocol::ErrorBody)))]
pub async fn delete(State(state): State<AppState>, Key(caller): Key, Path(id): Path<String>, q: FileQueryResult) -> Result<Response, ApiError> {
    let entry = state.get(&caller, &id).await?;
    let q = query(q)?;
    let path = sandbox_path(&q.path)?;
    let recursive = flag(&q.recursive, "recursive", false)?;
    with_fs(&entry, move |fs| fs.remove(&path, recursive)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/mkdir", params(("id" = String, Path)), request_body = MkdirRequest,
    responses((status = 200, body = FileInfo), (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody), (status = 409, body = protocol::ErrorBody)))]
pub async fn mkdir(State(state): State<AppState>, Key(caller): Key, Path(id): Path<String>, Json(req): Json<MkdirRequest>) -> Result<Response, ApiError> {
    let entry = state.get(&caller, &id).await?;
    let path = sandbox_path(&req.path)?;
    let mode = req.mode.map(|m| m.bits()).transpose().map_err(ApiError::BadRequest)?;
    let info = with_fs(&entry, move |fs| {
        fs.mkdir_all(&path, mode)?;
        fs.stat(&path, true)
    })
    .await?;
    Ok(json(StatusCode::OK, &info))
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/rename", params(("id" = String, Path)), request_body = RenameRequest,
    responses((status = 204), (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody), (status = 409, body = protocol::ErrorBody)))]
pub async fn rename(State(state): State<AppState>, Key(caller): Key, Path(id): Path<String>, Json(req): Json<RenameRequest>) -> Result<Response, ApiError> {
    let entry = state.get(&caller, &id).await?;
    let (from, to) = (sandbox_path(&req.from)?, sandbox_path(&req.to)?);
    with_fs(&entry, move |fs| fs.rename(&from, &to, req.overwrite)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/chmod", params(("id" = String, Path)), request_body = ChmodRequest,
    responses((status = 204), (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody)))]
pub async fn chmod(State(state): State<AppState>, Key(caller): Key, Path(id): Path<String>, Json(req): Json<ChmodRequest>) -> Result<Response, ApiError> {
    let entry = state.get(&caller, &id).await?;
    let path = sandbox_path(&req.path)?;
    let mode = req.mode.bits().map_err(ApiError::BadRequest)?;
    with_fs(&entry, move |fs| fs.chmod(&path, mode)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        use ByteRange::*;
        assert_eq!(parse_range(None, 10), Whole);
        assert_eq!(parse_range(Some("bytes=0-3"), 10), Part(0, 3));
        assert_eq!(parse_range(Some("bytes=5-"), 10), Part(5, 9));
        assert_eq!(parse_range(Some("bytes=5-100"), 10), Part(5, 9));
        assert_eq!(parse_range(Some("bytes=-3"), 10), Part(7, 9));
        assert_eq!(parse_range(Some("bytes=-30"), 10), Part(0, 9));
        assert_eq!(parse_range(Some("bytes=9-9"), 10), Part(9, 9));
        assert_eq!(parse_range(Some("bytes=10-"), 10), Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=-0"), 10), Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=0-"), 0), Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=3-1"), 10), Whole);
        assert_eq!(parse_range(Some("bytes=0-1,4-5"), 10), Whole);
        assert_eq!(parse_range(Some("items=0-1"), 10), Whole);
        assert_eq!(parse_range(Some("bytes=x-1"), 10), Whole);
    }

    #[test]
    fn flags() {
        assert!(flag(&Some("1".into()), "x", false).unwrap());
        assert!(!flag(&Some("false".into()), "x", true).unwrap());
        assert!(flag(&None, "x", true).unwrap());
        assert!(flag(&Some("maybe".into()), "x", true).is_err());
    }
}
