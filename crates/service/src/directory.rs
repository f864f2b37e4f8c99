//! What this server's sandboxes and Spaces are beyond it. A single server
//! is `Alone`: nothing beyond it, nothing to ask. A cluster node's
//! directory (crates/forkbox/src/node.rs, over crates/cluster) records
//! where each sandbox lives, reserves keys' quotas across the cluster, and
//! makes Spaces resumable on any node (docs/cluster.md).
//!
//! The service calls it at the few places a sandbox appears or goes
//! (create, fork, destroy, merge, freeze, restart) and a Space is made,
//! listed, resumed or deleted. Failures it answers are `Unavailable`
//! (503: the cluster's etcd or store is down) and the call did not happen:
//! a create or fork that cannot be recorded destroys what it made.

use std::path::Path;

use async_trait::async_trait;

use crate::error::Error;
use crate::keys::KeyLimits;
use crate::space_store::SpaceMeta;
use crate::templates::user::UserTemplate;

/// A custom template as known beyond this server.
pub enum TemplateBeyond {
    /// Nothing is kept beyond this server (a single server).
    NotKept,
    /// Not there: deleted, or never made.
    Unknown,
    /// Its record and its layers' keys, the bottom one first.
    Known(Box<UserTemplate>, Vec<String>),
}

/// A reservation of a key's quota beyond this server, to end with
/// `register` or `release`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket(pub String, pub String);

/// A sandbox now live on this server.
#[derive(Debug, Clone)]
pub struct Registered {
    pub id: String,
    pub owner: Option<String>,
    pub template: String,
    pub ram_mib: u64,
    pub created_at: u64,
}

#[async_trait]
pub trait Directory: Send + Sync + 'static {
    /// Whether keys' quotas are counted here rather than by this server
    /// (then this server only counts, and `reserve` enforces).
    fn counts_quotas(&self) -> bool {
        false
    }
    /// Reserve `n` sandboxes of `ram_mib` for `owner` within `limits` (a
    /// fork's when `fork`).
    async fn reserve(&self, _owner: &str, _limits: KeyLimits, _n: u64, _ram_mib: u64, _fork: bool) -> Result<Option<Ticket>, Error> {
        Ok(None)
    }
    /// A reservation that did not become sandboxes.
    async fn release(&self, _ticket: Ticket) {}
    /// `sandboxes` are live here now (ending `ticket`).
    async fn register(&self, _ticket: Option<Ticket>, _sandboxes: &[Registered]) -> Result<(), Error> {
        Ok(())
    }
    /// A restarted server took `sandboxes` back: record them again, and
    /// say which the directory gave up while the server was away (a
    /// cluster took the node for lost): those are ended, not adopted.
    async fn readopt(&self, _sandboxes: &[Registered]) -> Vec<String> {
        Vec::new()
    }
    /// Sandbox `id` is gone from here. Never fails: a directory that cannot
    /// be told now keeps trying.
    async fn unregister(&self, _id: &str, _owner: Option<&str>) {}

    /// A Space was written in `dir`: make it resumable elsewhere. An error
    /// undoes the freeze.
    async fn publish_space(&self, _meta: &SpaceMeta, _dir: &Path) -> Result<(), Error> {
        Ok(())
    }
    /// Every Space beyond this server, or None when there is nothing
    /// beyond it (this server's own list is the whole list).
    async fn spaces(&self) -> Result<Option<Vec<SpaceMeta>>, Error> {
        Ok(None)
    }
    /// The Space beyond this server that frozen (or hibernating) sandbox
    /// `sandbox_id` is in; None when there is none, or nothing beyond.
    async fn frozen(&self, _sandbox_id: &str) -> Result<Option<SpaceMeta>, Error> {
        Ok(None)
    }
    /// Take Space `id` for a resume (no one else gets it), and have its
    /// directory at `dir` (fetched, unless this server has it). False: it
    /// is not known beyond this server.
    async fn claim_space(&self, _id: &str, _dir: &Path) -> Result<bool, Error> {
        Ok(false)
    }
    /// A claimed Space became a sandbox: its copies beyond go.
    async fn space_resumed(&self, _id: &str) {}
    /// A claimed Space could not be resumed: it is available again.
    async fn space_unclaimed(&self, _id: &str) {}
    /// Delete Space `id` beyond this server; false if it was not there.
    async fn delete_space(&self, _id: &str) -> Result<bool, Error> {
        Ok(false)
    }

    /// A custom template was made or replaced here (`layers`: its layers'
    /// keys and directories, the bottom one first): make it servable from
    /// anywhere.
    async fn publish_template(&self, _t: &UserTemplate, _layers: &[(String, std::path::PathBuf)]) -> Result<(), Error> {
        Ok(())
    }
    /// Custom template `name` beyond this server.
    async fn template(&self, _name: &str) -> Result<TemplateBeyond, Error> {
        Ok(TemplateBeyond::NotKept)
    }
    /// Every custom template beyond this server (None: nothing beyond).
    async fn templates(&self) -> Result<Option<Vec<UserTemplate>>, Error> {
        Ok(None)
    }
    /// Bring layer `key` of a template made elsewhere to `into`.
    async fn fetch_layer(&self, _key: &str, _into: &Path) -> Result<(), Error> {
        Err(Error::Unsupported("no templates beyond this server".into()))
    }
    /// Custom template `name` was deleted here.
    async fn forget_template(&self, _name: &str) -> Result<(), Error> {
        Ok(())
    }
}

/// A single server: nothing beyond it.
pub struct Alone;

impl Directory for Alone {}

/// A reservation beyond this server, given back when dropped unless it
/// was registered.
pub(crate) struct Hold {
    directory: std::sync::Arc<dyn Directory>,
    ticket: Option<Ticket>,
}

impl Hold {
    pub(crate) fn new(directory: std::sync::Arc<dyn Directory>, ticket: Option<Ticket>) -> Hold {
        Hold { directory, ticket }
    }

    /// Register `sandboxes` under this reservation.
    pub(crate) async fn register(mut self, sandboxes: &[Registered]) -> Result<(), Error> {
        let ticket = self.ticket.take();
        let result = self.directory.register(ticket.clone(), sandboxes).await;
        if result.is_err() {
            self.ticket = ticket;
        }
        result
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some(t) = self.ticket.take() {
            let d = std::sync::Arc::clone(&self.directory);
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move { d.release(t).await });
            }
        }
    }
}
