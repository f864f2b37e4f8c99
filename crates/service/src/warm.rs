//! The warm pool's state (the operations on it are pool.rs's): per
//! template and owner, a zygote and its spare members, and what the pool
//! loop is asked to warm.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Mutex;

use crate::sandbox::{SandboxEntry, Settings};

/// Whose zygote it is: one per template and API key (`owner` is the key's
/// name, `None` on a server without keys).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PoolKey {
    pub owner: Option<String>,
    pub template: String,
}

impl PoolKey {
    pub(crate) fn of(settings: &Settings) -> PoolKey {
        PoolKey { owner: settings.owner.clone(), template: settings.template.clone() }
    }
}

/// A sandbox the zygote already forked into a spare, waiting for a create:
/// a whole sandbox (its REPL ready, reseeded, in its own namespaces and
/// cgroup) but no entry yet, so no timer, list or quota sees it.
pub(crate) struct Born {
    pub(crate) member: crate::engine::MemberRef,
    pub(crate) session: repl_host::session::ReplSession,
}

/// Creates waiting for the zygote to fork them, oldest first; one task at
/// a time (`forking`) forks them, several per call (`Service::fork_queued`).
#[derive(Default)]
pub(crate) struct ForkQueue {
    pub(crate) waiting: Vec<(crate::engine::Forked, tokio::sync::oneshot::Sender<Batched>)>,
    pub(crate) forking: bool,
    /// The shim's hand-over slot of the next child: batches overlap (one
    /// forks while the last one's children take their descriptors), so
    /// each continues the numbering (docs/repl-protocol.md).
    next_slot: usize,
}

/// Hand-over slots a zygote numbers before it starts again from 0 (far
/// more than it forks: it retires after `pool::RETIRE_AFTER` creates).
const SLOTS: usize = 1 << 20;

impl ForkQueue {
    /// The first of `n` consecutive slots for the next batch.
    pub(crate) fn take_slots(&mut self, n: usize) -> usize {
        if self.next_slot + n > SLOTS {
            self.next_slot = 0;
        }
        let first = self.next_slot;
        self.next_slot += n;
        first
    }
}

/// What became of a create's spare in the zygote's fork.
pub(crate) enum Batched {
    /// Forked: the new sandbox's member and REPL.
    Made(crate::engine::MemberRef, repl_host::session::ReplSession),
    /// The zygote was retired meanwhile (the spare is gone).
    NoZygote,
    /// The fork failed (the spare is gone); what to answer.
    Failed(crate::error::Error),
}

/// One template's zygote and spares, for one owner.
pub struct Warm {
    pub(crate) key: PoolKey,
    pub(crate) zygote: Arc<SandboxEntry>,
    pub(crate) spares: Mutex<Vec<crate::engine::Forked>>,
    /// Sandboxes forked ahead of demand: a create takes one without
    /// waiting for the zygote's fork (docs/fork.md#the-warm-pool).
    pub(crate) born: std::sync::Mutex<Vec<Born>>,
    /// Creates that found nothing ready, waiting for the zygote's fork.
    pub(crate) fork_queue: std::sync::Mutex<ForkQueue>,
    /// Held (read) by each batch of forks from the zygote's answer until its
    /// children are adopted; the zygote's teardown takes it (write).
    pub(crate) settling: Arc<tokio::sync::RwLock<()>>,
    pub(crate) served: AtomicUsize,
    /// A successor is being made (or it is let go): set once, by whoever
    /// does the work.
    pub(crate) retiring: std::sync::atomic::AtomicBool,
    /// It is being torn down: nothing it makes is kept any more. Until
    /// then a retiring zygote serves creates and refills as before, while
    /// its successor warms up (seconds under load: bench/load.py's creates
    /// waited that long, building their members on the spot).
    pub(crate) draining: std::sync::atomic::AtomicBool,
    /// The zygote's fork plan, read once: it runs no user code, so its
    /// descriptors and mappings do not change.
    pub(crate) plan: serde_json::Value,
    /// When a create last took from it (idle pools are let go).
    pub(crate) last_used: std::sync::Mutex<std::time::Instant>,
    /// The trust layer its family stands on: when the host's CAs change,
    /// creates stop using it (crates/jail/src/trust).
    pub(crate) trust: Option<std::path::PathBuf>,
}

#[derive(Default)]
pub struct Pool {
    pub(crate) warm: std::sync::Mutex<HashMap<PoolKey, Arc<Warm>>>,
    /// Pools asked for since start (they get warmed).
    pub(crate) wanted: std::sync::Mutex<std::collections::HashSet<PoolKey>>,
    /// Zygotes being made or retired, destroyed at shutdown.
    pub(crate) retired: std::sync::Mutex<Vec<Arc<Warm>>>,
    /// Set at shutdown: whatever is made after it is destroyed at once.
    pub(crate) closing: std::sync::atomic::AtomicBool,
    /// Held (shared) by pool work in flight; shutdown takes it exclusively
    /// so nothing is cut off half-made.
    pub(crate) busy: tokio::sync::RwLock<()>,
    /// Zygotes being made (shown by `GET /v1/pool` until they serve).
    pub(crate) warming: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// What `GET /v1/pool` shows: the hidden sandboxes, by template.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct PoolInfo {
    /// The zygotes that serve the caller (with keys: its key's own).
    pub templates: HashMap<String, PoolTemplate>,
    /// Hollow members families keep for their next fork (docs/fork.md).
    pub fork_spares: Vec<String>,
}

#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct PoolTemplate {
    pub zygote: String,
    pub spares: Vec<String>,
    /// Sandboxes already forked from the zygote, each the next create's.
    pub ready: Vec<String>,
    pub served: usize,
    pub modules: Vec<String>,
}

impl Warm {
    /// A sandbox forked ahead of demand, the latest.
    pub(crate) fn take_born(&self) -> Option<Born> {
        self.born.lock().ok()?.pop()
    }
}

impl Pool {
    /// List `warm` as retired: shutdown destroys it too if it still stands.
    pub(crate) fn list_retired(&self, warm: &Arc<Warm>) {
        if let Ok(mut r) = self.retired.lock() {
            r.push(Arc::clone(warm));
        }
    }

    /// `warm` is gone: no longer listed as retired.
    pub(crate) fn unlist_retired(&self, warm: &Arc<Warm>) {
        if let Ok(mut r) = self.retired.lock() {
            r.retain(|w| !Arc::ptr_eq(w, warm));
        }
    }

    pub(crate) fn current(&self, key: &PoolKey) -> Option<Arc<Warm>> {
        self.warm.lock().ok()?.get(key).cloned()
    }

    /// Take the pools `which` picks out of the map (creates stop using them).
    pub(crate) fn take_warm(&self, which: impl Fn(&PoolKey, &Warm) -> bool) -> Vec<Arc<Warm>> {
        let Ok(mut m) = self.warm.lock() else { return Vec::new() };
        let keys: Vec<PoolKey> = m.iter().filter(|(k, w)| which(k, w)).map(|(k, _)| k.clone()).collect();
        keys.iter().filter_map(|k| m.remove(k)).collect()
    }

    /// Warm `key`'s pool soon (the pool loop looks every half second).
    pub(crate) fn want(&self, key: PoolKey) {
        if let Ok(mut w) = self.wanted.lock() {
            w.insert(key);
        }
    }

    /// The pools `caller` may see: its own key's (all without keys).
    pub async fn info(&self, caller: &crate::keys::Caller, known: &crate::templates::Templates, mut fork_spares: Vec<String>) -> PoolInfo {
        // A zygote still warming up is as hidden as a spare.
        fork_spares.extend(self.warming.lock().map(|w| w.iter().cloned().collect::<Vec<_>>()).unwrap_or_default());
        let all: Vec<Arc<Warm>> = self.warm.lock().map(|m| m.values().cloned().collect()).unwrap_or_default();
        let mut templates = HashMap::new();
        for w in all.into_iter().filter(|w| caller.may_use(w.key.owner.as_deref())) {
            let spares = w.spares.lock().await.iter().map(|c| c.member.id().to_string()).collect();
            let ready = w.born.lock().map(|b| b.iter().map(|b| b.member.id().to_string()).collect()).unwrap_or_default();
            templates.insert(
                w.key.template.clone(),
                PoolTemplate {
                    zygote: w.zygote.id.clone(),
                    spares,
                    ready,
                    served: w.served.load(Ordering::Relaxed),
                    modules: known.preimport(&w.key.template),
                },
            );
        }
        PoolInfo { templates, fork_spares }
    }
}
