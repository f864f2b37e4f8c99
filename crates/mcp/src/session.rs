//! MCP sessions and the sandboxes they own.
//!
//! Each session has a *default sandbox*, created on the first tool call that
//! needs one, and a list of the sandboxes it made (the default, creates, fork
//! children). When the session ends they are destroyed.
//!
//! Which session a call belongs to: over stdio, the process is the session
//! (key `""`). Over streamable HTTP, a client that opened a session with the
//! `initialize` handshake sends `Mcp-Session-Id`, which is the key; a
//! stateless client (protocol 2026-07-28, no sessions) shares key `""` with
//! every other stateless client of this process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::api::Api;

/// The sandboxes of one session.
#[derive(Default)]
pub struct Session {
    /// The default sandbox's id, once made. An async lock: two first calls
    /// at once must not make two defaults.
    default: tokio::sync::Mutex<Option<String>>,
    /// Sandboxes this session made and has not destroyed.
    owned: Mutex<Vec<String>>,
}

impl Session {
    /// The default sandbox, made with `make` if there is none yet.
    pub async fn default_or<F, Fut, E>(&self, make: F) -> Result<String, E>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<String, E>>,
    {
        let mut slot = self.default.lock().await;
        if let Some(id) = slot.as_ref() {
            return Ok(id.clone());
        }
        let id = make().await?;
        self.own(&id);
        *slot = Some(id.clone());
        Ok(id)
    }

    /// The default sandbox, if it was made.
    pub async fn default_id(&self) -> Option<String> {
        self.default.lock().await.clone()
    }

    /// Make `id` the default sandbox.
    pub async fn set_default(&self, id: &str) {
        *self.default.lock().await = Some(id.to_string());
    }

    /// Forget `id` (destroyed or merged away); if it was the default, the
    /// next call makes a new one. Returns whether it was the default.
    pub async fn forget(&self, id: &str) -> bool {
        self.owned.lock().unwrap_or_else(PoisonError::into_inner).retain(|x| x != id);
        let mut slot = self.default.lock().await;
        if slot.as_deref() == Some(id) {
            *slot = None;
            return true;
        }
        false
    }

    pub fn own(&self, id: &str) {
        let mut owned = self.owned.lock().unwrap_or_else(PoisonError::into_inner);
        if !owned.iter().any(|x| x == id) {
            owned.push(id.to_string());
        }
    }

    fn take_owned(&self) -> Vec<String> {
        std::mem::take(&mut *self.owned.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// Every live session of this process, by key.
#[derive(Default)]
pub struct Sessions {
    map: Mutex<HashMap<String, Arc<Session>>>,
}

impl Sessions {
    pub fn get(&self, key: &str) -> Arc<Session> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner).entry(key.to_string()).or_default().clone()
    }

    fn remove(&self, key: &str) -> Option<Arc<Session>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner).remove(key)
    }

    /// End one session: destroy what it made.
    pub async fn close(&self, api: &Api, key: &str) {
        if let Some(s) = self.remove(key) {
            destroy_all(api, s.take_owned()).await;
        }
    }

    /// End every session (the process is stopping).
    pub async fn close_all(&self, api: &Api) {
        let all: Vec<Arc<Session>> = self.map.lock().unwrap_or_else(PoisonError::into_inner).drain().map(|(_, s)| s).collect();
        destroy_all(api, all.iter().flat_map(|s| s.take_owned()).collect()).await;
    }
}

async fn destroy_all(api: &Api, ids: Vec<String>) {
    let deletes = ids.iter().map(|id| async move {
        match api.destroy(id).await {
            Ok(()) => tracing::info!(sandbox = %id, "destroyed at the end of its MCP session"),
            Err(e) if e.status() == Some(404) => {}
            Err(e) => tracing::warn!(sandbox = %id, error = %e, "could not destroy at the end of its MCP session"),
        }
    });
    futures::future::join_all(deletes).await;
}
