//! envd's `filesystem.Filesystem` service (e2b-dev/E2B `spec/envd/
//! filesystem/filesystem.proto`) over `jail::fs` (every path resolved
//! inside the sandbox's root) and `service::watch` (inotify). Paths are
//! relative to the calling user's home; what a user makes belongs to it.

use std::collections::HashMap;
use std::io::Read;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use jail::fs::{EntryType, Metadata, SandboxFs, SandboxPath};
use serde::Deserialize;
use serde_json::json;
use service::files::with_fs;
use service::sandbox::processes::User;
use service::sandbox::SandboxEntry;

use crate::connect;
use crate::error::{Code, RpcError};
use crate::{auth, envd, E2b, Sandbox};

/// Most entries one ListDir answers.
pub const MAX_LIST: usize = 100_000;
/// Events a polled watcher keeps between two GetWatcherEvents.
pub const MAX_BUFFERED_EVENTS: usize = 10_000;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PathRequest {
    path: String,
    depth: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct MoveRequest {
    source: String,
    destination: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct WatchRequest {
    path: String,
    recursive: bool,
    #[serde(alias = "include_entry")]
    include_entry: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct WatcherRequest {
    #[serde(alias = "watcher_id")]
    watcher_id: String,
}

/// A polled watcher (CreateWatcher): the events since the last poll.
pub struct PolledWatcher {
    sandbox: String,
    root: String,
    events: Arc<Mutex<Vec<serde_json::Value>>>,
    task: tokio::task::JoinHandle<()>,
}

/// The polled watchers of every sandbox, by id.
#[derive(Default)]
pub struct Watchers(Mutex<HashMap<String, PolledWatcher>>);

impl Drop for PolledWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn call(State(e2b): State<E2b>, Sandbox(entry): Sandbox, Path(method): Path<String>, headers: HeaderMap, body: Body) -> Response {
    let user = match envd::user(&entry, auth::rpc_user(&headers).as_deref()).await {
        Ok(u) => u,
        Err(e) => return if method == "WatchDir" { connect::failed_stream(e.into()).await } else { RpcError::from(e).into_response() },
    };
    if method == "WatchDir" {
        return match connect::first_message::<WatchRequest>(&headers, body).await {
            Ok(req) => watch_dir(entry, user, &headers, req).await,
            Err(e) => connect::failed_stream(e).await,
        };
    }
    let bytes = match connect::body_bytes(body).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    match unary(&e2b, &entry, &user, &method, &headers, &bytes).await {
        Ok(v) => connect::ok(v),
        Err(e) => e.into_response(),
    }
}

async fn unary(e2b: &E2b, entry: &Arc<SandboxEntry>, user: &User, method: &str, headers: &HeaderMap, body: &[u8]) -> Result<serde_json::Value, RpcError> {
    let path_of = |raw: &str| envd::path_for(raw, user).map_err(RpcError::from);
    match method {
        "Stat" => {
            let req: PathRequest = connect::unary(headers, body)?;
            let path = path_of(&req.path)?;
            let info = with_fs(entry, move |fs| entry_info(fs, &path, &Names::read(fs))).await?;
            Ok(json!({"entry": info}))
        }
        "MakeDir" => {
            let req: PathRequest = connect::unary(headers, body)?;
            let path = path_of(&req.path)?;
            let (uid, gid) = (user.uid, user.gid);
            let info = with_fs(entry, move |fs| {
                if !fs.mkdir_all(&path, None)? {
                    return Err(jail::fs::FsError { kind: jail::fs::FsErrorKind::Exists, message: format!("{path}: exists already") });
                }
                if uid != 0 {
                    fs.chown(&path, uid, gid)?;
                }
                entry_info(fs, &path, &Names::read(fs))
            })
            .await?;
            Ok(json!({"entry": info}))
        }
        "Move" => {
            let req: MoveRequest = connect::unary(headers, body)?;
            let (from, to) = (path_of(&req.source)?, path_of(&req.destination)?);
            let info = with_fs(entry, move |fs| {
                fs.rename(&from, &to, true)?;
                entry_info(fs, &to, &Names::read(fs))
            })
            .await?;
            Ok(json!({"entry": info}))
        }
        "ListDir" => {
            let req: PathRequest = connect::unary(headers, body)?;
            let path = path_of(&req.path)?;
            let depth = req.depth.unwrap_or(1).max(1);
            let entries = with_fs(entry, move |fs| list(fs, &path, depth)).await?;
            Ok(json!({"entries": entries}))
        }
        "Remove" => {
            let req: PathRequest = connect::unary(headers, body)?;
            let path = path_of(&req.path)?;
            with_fs(entry, move |fs| fs.remove(&path, true)).await?;
            Ok(json!({}))
        }
        "CreateWatcher" => {
            let req: WatchRequest = connect::unary(headers, body)?;
            let path = path_of(&req.path)?;
            let id = create_watcher(e2b, entry, path, req.recursive, req.include_entry).await?;
            Ok(json!({"watcherId": id}))
        }
        "GetWatcherEvents" => {
            let req: WatcherRequest = connect::unary(headers, body)?;
            let watchers = e2b.watchers.0.lock().unwrap_or_else(|e| e.into_inner());
            let w = watchers
                .get(&req.watcher_id)
                .filter(|w| w.sandbox == entry.id)
                .ok_or_else(|| RpcError::new(Code::NotFound, format!("watcher {} not found", req.watcher_id)))?;
            let events = std::mem::take(&mut *w.events.lock().unwrap_or_else(|e| e.into_inner()));
            if events.is_empty() && w.task.is_finished() {
                return Err(RpcError::new(Code::NotFound, format!("watcher {} ended: {} is gone", req.watcher_id, w.root)));
            }
            Ok(json!({"events": events}))
        }
        "RemoveWatcher" => {
            let req: WatcherRequest = connect::unary(headers, body)?;
            let mut watchers = e2b.watchers.0.lock().unwrap_or_else(|e| e.into_inner());
            match watchers.get(&req.watcher_id) {
                Some(w) if w.sandbox == entry.id => {
                    watchers.remove(&req.watcher_id);
                    Ok(json!({}))
                }
                _ => Err(RpcError::new(Code::NotFound, format!("watcher {} not found", req.watcher_id))),
            }
        }
        other => Err(RpcError::new(Code::Unimplemented, format!("filesystem.Filesystem/{other} is not a method"))),
    }
}

/// User and group names by id, from the sandbox's own files.
#[derive(Default)]
struct Names {
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

impl Names {
    fn read(fs: &SandboxFs) -> Names {
        let table = |file: &str| -> HashMap<u32, String> {
            let Ok(path) = SandboxPath::parse(file, "/") else { return HashMap::new() };
            let Ok((f, _)) = fs.open_read(&path) else { return HashMap::new() };
            let mut text = String::new();
            let _ = f.take(1 << 20).read_to_string(&mut text);
            text.lines()
                .filter_map(|l| {
                    let f: Vec<&str> = l.split(':').collect();
                    Some((f.get(2)?.parse().ok()?, f.first()?.to_string()))
                })
                .collect()
        };
        Names { users: table("/etc/passwd"), groups: table("/etc/group") }
    }

    fn user(&self, id: u32) -> String {
        self.users.get(&id).cloned().unwrap_or_else(|| id.to_string())
    }

    fn group(&self, id: u32) -> String {
        self.groups.get(&id).cloned().unwrap_or_else(|| id.to_string())
    }
}

fn type_name(kind: EntryType) -> &'static str {
    match kind {
        EntryType::File => "FILE_TYPE_FILE",
        EntryType::Dir => "FILE_TYPE_DIRECTORY",
        EntryType::Symlink => "FILE_TYPE_SYMLINK",
        EntryType::Other => "FILE_TYPE_UNSPECIFIED",
    }
}

/// `ls -l`'s mode column: `drwxr-xr-x`.
fn permissions(kind: EntryType, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        EntryType::Dir => 'd',
        EntryType::Symlink => 'l',
        _ => '-',
    });
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

use crate::wire::rfc3339;

/// An EntryInfo: a symlink reports its target's type, with `isSymlink`.
fn describe(fs: &SandboxFs, m: &Metadata, names: &Names) -> serde_json::Value {
    let is_link = m.kind == EntryType::Symlink;
    let kind =
        if is_link { SandboxPath::parse(&m.path, "/").ok().and_then(|p| fs.stat(&p, true).ok()).map(|t| t.kind).unwrap_or(EntryType::Other) } else { m.kind };
    let mut info = json!({
        "name": m.name, "type": type_name(kind), "path": m.path, "size": m.size.to_string(), "mode": m.mode,
        "permissions": permissions(m.kind, m.mode), "owner": names.user(m.uid), "group": names.group(m.gid),
        "modifiedTime": rfc3339(m.mtime_ms), "isSymlink": is_link,
    });
    if let Some(t) = &m.target {
        info["symlinkTarget"] = json!(t);
    }
    if matches!(kind, EntryType::File | EntryType::Dir) {
        let attrs = SandboxPath::parse(&m.path, "/").ok().and_then(|p| fs.xattrs(&p, envd::METADATA_XATTR_PREFIX).ok()).unwrap_or_default();
        if !attrs.is_empty() {
            info["metadata"] = json!(attrs.into_iter().collect::<envd::Metadata>());
        }
    }
    info
}

fn entry_info(fs: &SandboxFs, path: &SandboxPath, names: &Names) -> Result<serde_json::Value, jail::fs::FsError> {
    let m = fs.stat(path, false)?;
    Ok(describe(fs, &m, names))
}

/// Entries below `path` to `depth` levels (1: its children).
fn list(fs: &SandboxFs, path: &SandboxPath, depth: u32) -> Result<Vec<serde_json::Value>, jail::fs::FsError> {
    if fs.stat(path, true)?.kind != EntryType::Dir {
        return Err(jail::fs::FsError::invalid(format!("{path}: not a directory")));
    }
    let names = Names::read(fs);
    let mut out = Vec::new();
    let mut level = vec![path.clone()];
    for _ in 0..depth {
        let mut next = Vec::new();
        for dir in &level {
            let Ok((entries, _)) = fs.list(dir, MAX_LIST) else { continue };
            for m in entries {
                if out.len() >= MAX_LIST {
                    return Ok(out);
                }
                if m.kind == EntryType::Dir {
                    next.push(dir.join(&m.name));
                }
                out.push(describe(fs, &m, &names));
            }
        }
        level = next;
    }
    Ok(out)
}

/// A `service::watch` event as E2B's FilesystemEvent(s): `name` relative
/// to the watched directory. A file that appears (the files API renames
/// finished uploads into place) is reported created and written.
fn events_of(root: &str, ev: &protocol::FileEvent) -> Vec<serde_json::Value> {
    let Some(path) = &ev.path else { return Vec::new() };
    let name = path.strip_prefix(root).unwrap_or(path).trim_start_matches('/').to_string();
    let kinds: &[&str] = match ev.kind.as_str() {
        "created" if ev.dir => &["EVENT_TYPE_CREATE"],
        "created" => &["EVENT_TYPE_CREATE", "EVENT_TYPE_WRITE"],
        "modified" => &["EVENT_TYPE_WRITE"],
        "removed" => &["EVENT_TYPE_REMOVE"],
        _ => &[],
    };
    kinds.iter().map(|k| json!({"name": name, "type": k})).collect()
}

/// With `includeEntry`: each event's EntryInfo, read as the event is
/// sent (none for a removal, or for an entry gone again by then).
async fn add_entries(entry: &Arc<SandboxEntry>, names: &Arc<Names>, root: &str, events: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    let (names, root, fallback) = (Arc::clone(names), root.to_string(), events.clone());
    with_fs(entry, move |fs| {
        let mut events = events;
        for ev in &mut events {
            if ev["type"] == "EVENT_TYPE_REMOVE" {
                continue;
            }
            let full = format!("{}/{}", root.trim_end_matches('/'), ev["name"].as_str().unwrap_or(""));
            if let Some(info) = SandboxPath::parse(&full, "/").ok().and_then(|p| entry_info(fs, &p, &names).ok()) {
                ev["entry"] = info;
            }
        }
        Ok(events)
    })
    .await
    .unwrap_or(fallback)
}

/// The owner names an `includeEntry` watch reports with, read once.
async fn watch_names(entry: &Arc<SandboxEntry>, include_entry: bool) -> Option<Arc<Names>> {
    if !include_entry {
        return None;
    }
    Some(Arc::new(with_fs(entry, |fs| Ok(Names::read(fs))).await.unwrap_or_default()))
}

async fn watch_dir(entry: Arc<SandboxEntry>, user: User, headers: &HeaderMap, req: WatchRequest) -> Response {
    let path = match envd::path_for(&req.path, &user) {
        Ok(p) => p,
        Err(e) => return connect::failed_stream(e.into()).await,
    };
    let root = path.to_string();
    let mut events = match service::watch::watch(&entry, path, req.recursive).await {
        Ok(rx) => rx,
        Err(e) => return connect::failed_stream(e.into()).await,
    };
    let names = watch_names(&entry, req.include_entry).await;
    let keepalive = connect::keepalive(headers);
    let (resp, writer) = connect::stream();
    tokio::spawn(async move {
        let mut ping = tokio::time::interval(keepalive.unwrap_or(std::time::Duration::from_secs(3600)));
        ping.tick().await;
        loop {
            tokio::select! {
                ev = events.recv() => match ev {
                    Some(ev) if ev.kind == "ready" => {
                        if !writer.send(&json!({"start": {}})).await { return }
                    }
                    Some(ev) => {
                        let mut out = events_of(&root, &ev);
                        if let Some(names) = &names {
                            out = add_entries(&entry, names, &root, out).await;
                        }
                        for e in out {
                            if !writer.send(&json!({"filesystem": e})).await { return }
                        }
                    }
                    None => {
                        writer.end(None).await;
                        return;
                    }
                },
                _ = ping.tick(), if keepalive.is_some() => {
                    if !writer.send(&json!({"keepalive": {}})).await { return }
                }
                () = writer.closed() => return,
            }
        }
    });
    resp
}

async fn create_watcher(e2b: &E2b, entry: &Arc<SandboxEntry>, path: SandboxPath, recursive: bool, include_entry: bool) -> Result<String, RpcError> {
    let root = path.to_string();
    let mut rx = service::watch::watch(entry, path, recursive).await?;
    let names = watch_names(entry, include_entry).await;
    let sandbox = Arc::clone(entry);
    // Its first event says the watch is in place: events after this call count.
    let _ = rx.recv().await;
    let events: Arc<Mutex<Vec<serde_json::Value>>> = Default::default();
    let buffer = Arc::clone(&events);
    let task_root = root.clone();
    let task = tokio::spawn(async move {
        while let Some(ev) = rx.recv().await {
            let mut out = events_of(&task_root, &ev);
            if let Some(names) = &names {
                out = add_entries(&sandbox, names, &task_root, out).await;
            }
            let mut b = buffer.lock().unwrap_or_else(|e| e.into_inner());
            for e in out {
                if b.len() >= MAX_BUFFERED_EVENTS {
                    b.remove(0);
                }
                b.push(e);
            }
        }
    });
    let id = service::ids::new_id().replacen("sb-", "w-", 1);
    e2b.watchers.0.lock().unwrap_or_else(|e| e.into_inner()).insert(id.clone(), PolledWatcher { sandbox: entry.id.clone(), root, events, task });
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permissions_read_as_ls_shows_them() {
        assert_eq!(permissions(EntryType::File, 0o644), "-rw-r--r--");
        assert_eq!(permissions(EntryType::Dir, 0o755), "drwxr-xr-x");
        assert_eq!(permissions(EntryType::Symlink, 0o777), "lrwxrwxrwx");
    }

    #[test]
    fn watch_events_name_paths_below_the_root() {
        let ev = |kind: &str, path: &str, dir: bool| protocol::FileEvent { kind: kind.into(), path: Some(path.into()), dir, ts: 0 };
        assert_eq!(events_of("/home/user", &ev("created", "/home/user/a.txt", false)).len(), 2);
        assert_eq!(events_of("/home/user", &ev("created", "/home/user/d", true)), vec![json!({"name": "d", "type": "EVENT_TYPE_CREATE"})]);
        assert_eq!(events_of("/home/user", &ev("removed", "/home/user/x/y", false)), vec![json!({"name": "x/y", "type": "EVENT_TYPE_REMOVE"})]);
        assert!(events_of("/", &ev("overflow", "/", false)).len() <= 1);
    }
}
