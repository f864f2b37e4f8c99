//! `Service`: the engine, the templates and the registry of live sandboxes,
//! with the create/destroy logic handlers call and the timer that enforces
//! lifetimes and idle timeouts.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use protocol::CreateSandbox;
use rand::Rng;
use tokio::sync::RwLock;

use crate::config::ServerConfig;
use crate::error::Error;
use crate::keys::{Caller, Reservation};
use crate::sandbox::{new_entry, start_repl, SandboxEntry, Settings};
use crate::templates::Templates;
use repl_host::events::now_ms;

#[derive(Clone)]
pub struct Service {
    pub inner: Arc<Inner>,
}

pub struct Inner {
    pub config: ServerConfig,
    pub engine: Arc<dyn crate::engine::Engine>,
    pub templates: Templates,
    pub sandboxes: RwLock<HashMap<String, Arc<SandboxEntry>>>,
    /// Sandboxes registered and being made, against the server's caps.
    pub capacity: crate::capacity::Capacity,
    /// Ids that were merged away → the id that now holds their state (the
    /// most recent `MERGED_REMEMBERED`), so a late DELETE is harmless and a
    /// late exec gets a clear 404.
    pub merged: std::sync::Mutex<crate::fork::MergedIds>,
    /// Warm zygotes and spare members per template (src/pool.rs).
    pub pool: crate::pool::Pool,
    /// Sandboxes frozen to disk (src/spaces.rs).
    pub spaces: crate::spaces::SpaceStore,
    /// `GET /metrics` (src/metrics.rs).
    pub metrics: crate::metrics::Metrics,
    /// What a restarted server needs to adopt each live sandbox (src/records.rs).
    pub records: crate::records::Records,
    /// Ids that did not survive a server restart → why, and their owner
    /// (src/adopt.rs).
    pub lost: std::sync::Mutex<HashMap<String, (String, Option<String>)>>,
    /// The accepted API keys (src/keys.rs).
    pub keys: crate::keys::KeyRing,
    /// What each key uses, against its limits (src/keys.rs).
    pub quotas: crate::keys::Quotas,
    /// Graceful shutdown (src/drain.rs).
    pub drain: crate::drain::Drain,
    /// The host CAs sandboxes trust (crates/jail/src/trust).
    pub trust: jail::trust::TrustStore,
    /// What every sandbox gets from the server's configuration (src/setup.rs).
    pub setup: Arc<crate::setup::SandboxSetup>,
}

/// Sandbox ids: `sb-` and 20 lowercase base-32 characters (also the hostname).
pub fn new_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut rng = rand::rng();
    let s: String = (0..20).map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char).collect();
    format!("sb-{s}")
}

/// Whether `id` has the shape of a sandbox id (so bad input gets 400, not 404).
pub fn valid_id(id: &str) -> bool {
    id.len() <= 64 && !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl Service {
    pub fn new(config: ServerConfig, engine: impl crate::engine::Engine, templates: Templates) -> Service {
        Self::assemble(config, Arc::new(engine), templates)
    }

    /// The same engine and sandboxes under another configuration (tests use
    /// it to check auth without a second engine).
    pub fn with_config(other: &Service, config: ServerConfig) -> Service {
        Self::assemble(config, Arc::clone(&other.inner.engine), other.inner.templates.clone())
    }

    /// A state over `jail` and `templates` with everything else fresh.
    fn assemble(config: ServerConfig, engine: Arc<dyn crate::engine::Engine>, templates: Templates) -> Service {
        Service {
            inner: Arc::new(Inner {
                engine,
                templates,
                sandboxes: RwLock::new(HashMap::new()),
                capacity: Default::default(),
                merged: Default::default(),
                pool: Default::default(),
                spaces: crate::spaces::SpaceStore::new(&config.state_dir),
                metrics: Default::default(),
                records: crate::records::Records::new(&config.state_dir),
                lost: Default::default(),
                drain: Default::default(),
                keys: key_ring(&config),
                quotas: Default::default(),
                trust: trust_store(&config),
                setup: Arc::new(setup(&config)),
                config,
            }),
        }
    }

    /// The trust layer for a new sandbox on `root` (None: host CAs off).
    /// Made once per template and set of CAs; its first making reads the
    /// template's bundle and writes a few files.
    pub(crate) fn trust_layer(&self, root: &crate::templates::Root) -> Result<Option<std::path::PathBuf>, Error> {
        self.inner.trust.layer_for(&root.lowers()).map_err(|e| match e.errno() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => Error::NoSpace("no room on the server's disk for the sandbox's CA bundle".into()),
            _ => Error::internal("could not make the sandbox's CA bundle", e),
        })
    }

    /// Sandbox `id`, if `caller` may use it: another key's sandbox (or
    /// its merged, lost or frozen id) answers exactly as an unknown id.
    pub async fn get(&self, caller: &Caller, id: &str) -> Result<Arc<SandboxEntry>, Error> {
        if !valid_id(id) {
            return Err(Error::Invalid(format!("invalid sandbox id `{}`", id.chars().take(80).collect::<String>())));
        }
        if let Some(e) = self.inner.sandboxes.read().await.get(id).cloned() {
            if caller.may_use(e.settings.owner.as_deref()) {
                return Ok(e);
            }
            return Err(no_sandbox(id));
        }
        if let Some((into, owner)) = self.inner.merged.lock().ok().and_then(|m| m.get(id).cloned()) {
            if caller.may_use(owner.as_deref()) {
                return Err(Error::NotFound(format!("sandbox `{id}` was merged into `{into}`; use that id")));
            }
        }
        if let Some((why, owner)) = self.inner.lost.lock().ok().and_then(|m| m.get(id).cloned()) {
            if caller.may_use(owner.as_deref()) {
                return Err(Error::NotFound(format!("sandbox `{id}` was lost when the server restarted: {why}")));
            }
        }
        match self.frozen(caller, id).await {
            Some(Frozen::Space(space)) => Err(Error::Conflict(format!(
                "sandbox `{id}` is frozen in space `{}`: resume it with POST /v1/spaces/{}/resume",
                space.info.space_id, space.info.space_id
            ))),
            Some(Frozen::Resumed(r)) => {
                Err(Error::NotFound(format!("sandbox `{id}` was frozen into space `{}`, which was resumed as `{}`; use that id", r.space_id, r.resumed_as)))
            }
            None => Err(no_sandbox(id)),
        }
    }

    /// What `caller` may see of sandbox `id`: a frozen one as it was, with
    /// `state: "frozen"`.
    pub async fn info(&self, caller: &Caller, id: &str) -> Result<protocol::SandboxInfo, Error> {
        match self.get(caller, id).await {
            Ok(entry) => Ok(entry.info()),
            Err(Error::Conflict(e)) => match self.frozen(caller, id).await {
                Some(Frozen::Space(space)) => Ok(space.sandbox),
                _ => Err(Error::Conflict(e)),
            },
            Err(e) => Err(e),
        }
    }

    /// Ready to serve: the default template is built.
    pub fn health(&self) -> Result<(), Error> {
        if self.inner.templates.is_ready("default") {
            return Ok(());
        }
        Err(self.inner.templates.rootfs("default").err().unwrap_or(Error::Unavailable { message: "starting".into(), progress: None }))
    }

    /// The warm pool's hidden sandboxes by template, as `caller` may see them.
    pub async fn pool_info(&self, caller: &Caller) -> crate::pool::PoolInfo {
        self.inner.pool.info(caller, &self.inner.templates, self.inner.engine.spare_ids()).await
    }

    /// The sandboxes `caller` may use, oldest first.
    pub async fn list(&self, caller: &Caller) -> Vec<Arc<SandboxEntry>> {
        let mut all: Vec<Arc<SandboxEntry>> =
            self.inner.sandboxes.read().await.values().filter(|e| caller.may_use(e.settings.owner.as_deref())).cloned().collect();
        all.sort_by_key(|e| e.created_at);
        all
    }

    /// What became of sandbox `id` if it was frozen: its Space, or where
    /// that Space was resumed (only if `caller` may use them).
    pub async fn frozen(&self, caller: &Caller, id: &str) -> Option<Frozen> {
        let (state, id, caller) = (self.clone(), id.to_string(), caller.clone());
        tokio::task::spawn_blocking(move || {
            let spaces = &state.inner.spaces;
            spaces.frozen(&caller, &id).map(|m| Frozen::Space(Box::new(m))).or_else(|| spaces.resumed(&caller, &id).map(Frozen::Resumed))
        })
        .await
        .ok()
        .flatten()
    }

    /// Memory the live sandboxes use now (their cgroups' usage), in MiB.
    pub fn memory_in_use_mib(&self) -> u64 {
        let Ok(all) = self.inner.sandboxes.try_read() else { return 0 };
        all.values().map(|e| e.engine.memory_usage()).sum::<u64>() >> 20
    }

    /// Reserve `n` new sandboxes of `ram_mib` for `owner` against the
    /// quotas of `caller`'s key (a refusal is a 429 with `Retry-After`, and
    /// counted in the metrics).
    pub(crate) fn reserve_quota(&self, caller: &Caller, owner: Option<&str>, n: usize, ram_mib: u64, fork: bool) -> Result<Reservation<'_>, Error> {
        self.inner.quotas.reserve(owner, caller.limits(), n as u64, ram_mib, fork, std::time::Instant::now()).map_err(|r| {
            self.inner.metrics.quota_refused(r.limit.label());
            tracing::info!(key = owner.unwrap_or_default(), limit = r.limit.label(), "quota refused");
            Error::Quota(r)
        })
    }

    /// `entry` left the registry: it no longer counts against the server's
    /// cap or its key's quotas. Every removal from `sandboxes` calls this.
    pub(crate) fn unregistered(&self, entry: &SandboxEntry) {
        self.inner.capacity.unregistered();
        if let Some(owner) = &entry.settings.owner {
            self.inner.quotas.release(owner, entry.settings.ram_mib);
        }
    }

    /// Validate a create request against the defaults and caps; the new
    /// sandbox belongs to `caller`'s key.
    pub fn settings(&self, req: &CreateSandbox, caller: &Caller) -> Result<Settings, Error> {
        let l = &self.inner.config.limits;
        let template = req.template.clone().unwrap_or_else(|| "default".into());
        if template.is_empty() || template.len() > 64 {
            return Err(Error::Invalid("invalid template name".into()));
        }
        self.inner.templates.check_visible(caller, &template)?;
        // The template's defaults stand in for fields the request leaves out.
        let defaults = self.inner.templates.limits(&template);
        let req = &CreateSandbox {
            ram_mib: req.ram_mib.or(defaults.ram_mib),
            rootfs_gb: req.rootfs_gb.or(defaults.rootfs_gb),
            timeout_seconds: req.timeout_seconds.or(defaults.timeout_seconds),
            idle_timeout_seconds: req.idle_timeout_seconds.or(defaults.idle_timeout_seconds),
            ..req.clone()
        };
        let egress = req.egress.clone().unwrap_or(protocol::Egress::On(self.inner.config.default_egress));
        jail::egress::plan(&egress)?;
        let ram_mib = req.ram_mib.unwrap_or(l.default_ram_mib);
        if ram_mib < l.min_ram_mib || ram_mib > l.max_ram_mib {
            return Err(Error::Invalid(format!("ram_mib must be between {} and {}, got {ram_mib}", l.min_ram_mib, l.max_ram_mib)));
        }
        let rootfs_gb = req.rootfs_gb.unwrap_or(l.default_rootfs_gb);
        if rootfs_gb == 0 || rootfs_gb > l.max_rootfs_gb {
            return Err(Error::Invalid(format!("rootfs_gb must be between 1 and {}, got {rootfs_gb}", l.max_rootfs_gb)));
        }
        let secs = |v: Option<u64>, default: Duration, max: Duration, what: &str| -> Result<Duration, Error> {
            match v {
                None => Ok(default),
                Some(0) => Err(Error::Invalid(format!("{what} must be at least 1"))),
                // Caps apply silently, as the podflare contract documents.
                Some(s) => Ok(Duration::from_secs(s).min(max)),
            }
        };
        Ok(Settings {
            template,
            ram_mib,
            rootfs_gb,
            timeout: secs(req.timeout_seconds, l.default_timeout, l.max_timeout, "timeout_seconds")?,
            egress,
            idle_timeout: secs(req.idle_timeout_seconds, l.default_idle_timeout, l.max_idle_timeout, "idle_timeout_seconds")?,
            interrupt_grace: l.interrupt_grace,
            persistent: req.persistent.unwrap_or(false),
            owner: caller.owner(),
            setup: Arc::clone(&self.inner.setup),
        })
    }

    pub async fn create(&self, caller: &Caller, req: CreateSandbox) -> Result<Arc<SandboxEntry>, Error> {
        let settings = self.settings(&req, caller)?;
        self.create_with(caller, settings, None).await
    }

    /// Create a sandbox for `settings.owner`, within `caller`'s quotas;
    /// `space`: a Space's files to start with, on the template version
    /// they were made on, which rules out the warm pool.
    pub async fn create_with(&self, caller: &Caller, settings: Settings, space: Option<crate::spaces::SpaceStart>) -> Result<Arc<SandboxEntry>, Error> {
        // `settings` checked the template's name and who may use it.
        let rootfs = match &space {
            Some(start) => self.inner.templates.rootfs_pinned(&settings.template, start.rootfs.as_deref())?,
            None => self.inner.templates.rootfs(&settings.template)?,
        };
        let initial_upper = space.map(|start| start.upper);
        let quota = self.reserve_quota(caller, settings.owner.as_deref(), 1, settings.ram_mib, false)?;
        let _slot = CreateSlot::take(self)?;
        let started = std::time::Instant::now();
        let from_space = initial_upper.is_some();
        let pooled = match initial_upper {
            None => self.create_from_pool(&settings).await,
            Some(_) => Ok(None),
        };
        match pooled {
            Ok(Some(entry)) => {
                self.inner.sandboxes.write().await.insert(entry.id.clone(), Arc::clone(&entry));
                self.inner.capacity.registered(1);
                quota.commit();
                tracing::info!(sandbox = %entry.id, template = %entry.settings.template, pool = true,
                    total_ms = started.elapsed().as_millis() as u64, "created");
                self.inner.metrics.observe_create("pool", started);
                crate::egress::apply_soon(&entry, entry.settings.egress.clone()).await;
                self.inner.records.save(&entry);
                return Ok(entry);
            }
            Ok(None) => {}
            // The pool is an optimisation: make the sandbox the slow way.
            Err(e) => tracing::warn!(err = ?e, "warm pool create failed; creating from scratch"),
        }
        let id = new_id();
        // Without the pool, a custom template's sandbox starts where its
        // zygote would have: its modules imported, its saved REPL loaded.
        let custom = !from_space && !self.inner.templates.is_builtin(&settings.template);
        let repl_state = if custom { self.inner.templates.repl_state(&settings.template) } else { None };
        let trust = self.trust_layer(&rootfs)?;
        let spec = rootfs.spec(id.clone(), self.limits_for(&settings), initial_upper.or_else(|| repl_state.clone()), trust);
        let engine = self.inner.engine.create(spec).await.map_err(|e| Error::internal("could not create the sandbox", e))?;
        let jailed = started.elapsed();
        let mut session = match start_repl(engine.as_ref(), &settings.setup).await {
            Ok(s) => s,
            Err(e) => {
                let _ = self.inner.engine.destroy(engine.as_ref()).await;
                return Err(Error::internal("could not start the sandbox's Python REPL", e));
            }
        };
        if custom {
            let modules = self.inner.templates.preimport(&settings.template);
            if let Err(e) = crate::pool::warm_session(&mut session, &modules, repl_state.is_some()).await {
                let _ = self.inner.engine.destroy(engine.as_ref()).await;
                return Err(Error::internal("could not start the template's REPL state", e));
            }
        }
        let entry = new_entry(id.clone(), settings, engine, session, Vec::new());
        self.inner.sandboxes.write().await.insert(id, Arc::clone(&entry));
        self.inner.capacity.registered(1);
        quota.commit();
        tracing::info!(sandbox = %entry.id, template = %entry.settings.template, jail_ms = jailed.as_millis() as u64,
            total_ms = started.elapsed().as_millis() as u64, "created");
        self.inner.metrics.observe_create(if from_space { "space" } else { "cold" }, started);
        crate::egress::apply_soon(&entry, entry.settings.egress.clone()).await;
        self.inner.records.save(&entry);
        Ok(entry)
    }

    /// Remove a sandbox `caller` may use from the registry and free
    /// everything it used.
    pub async fn destroy(&self, caller: &Caller, id: &str) -> Result<(), Error> {
        if !valid_id(id) {
            // The same answer as any other call with a malformed id.
            self.get(caller, id).await?;
        }
        let removed = {
            let mut all = self.inner.sandboxes.write().await;
            match all.get(id) {
                Some(e) if caller.may_use(e.settings.owner.as_deref()) => all.remove(id),
                _ => None,
            }
        };
        let Some(entry) = removed else {
            // Deleting an id that was merged away is harmless: its state
            // lives on under the id it was merged into.
            let merged = self.inner.merged.lock().ok().and_then(|m| m.get(id).cloned());
            if merged.is_some_and(|(_, owner)| caller.may_use(owner.as_deref())) {
                return Ok(());
            }
            // So is deleting a frozen one: its Space stays (DELETE the
            // Space to discard it), as a persistent sandbox's client that
            // closes it after an idle freeze expects.
            if self.frozen(caller, id).await.is_some() {
                return Ok(());
            }
            return Err(no_sandbox(id));
        };
        self.unregistered(&entry);
        self.inner.records.remove(id);
        self.drop_checkpoints(&entry).await;
        self.teardown(&entry).await;
        Ok(())
    }

    pub(crate) async fn teardown(&self, entry: &SandboxEntry) {
        entry.mark_destroyed();
        self.inner.metrics.forget(entry);
        crate::egress::teardown(entry).await;
        if let Err(e) = self.inner.engine.destroy(entry.engine.as_ref()).await {
            tracing::error!(sandbox = %entry.id, err = %e, "destroy failed");
        }
        // Drop the REPL session (the process is gone already).
        if let Ok(mut slot) = entry.slot.try_lock() {
            slot.session = None;
        }
        tracing::info!(sandbox = %entry.id, "destroyed");
    }

    /// Destroy everything (server shutdown).
    pub async fn destroy_all(&self) {
        self.destroy_pool().await;
        // Persistent sandboxes outlive the server as Spaces.
        let persistent: Vec<String> = self.inner.sandboxes.read().await.values().filter(|e| e.settings.persistent).map(|e| e.id.clone()).collect();
        for id in persistent {
            if let Err(e) = self.freeze(&Caller::server(), &id).await {
                tracing::error!(sandbox = %id, err = %e, "could not freeze a persistent sandbox at shutdown");
            }
        }
        let all: Vec<Arc<SandboxEntry>> = self.inner.sandboxes.write().await.drain().map(|(_, e)| e).collect();
        for e in &all {
            self.unregistered(e);
        }
        let jobs = all.iter().map(|e| async move {
            self.inner.records.remove(&e.id);
            self.drop_checkpoints(e).await;
            self.teardown(e).await
        });
        futures::future::join_all(jobs).await;
        self.inner.templates.layers.unmount_all();
    }

    /// Remove the quota groups of deleted sandboxes' subvolumes once
    /// nothing is charged to them (btrfs frees a deleted subvolume's
    /// extents in the background, and a fork parent's only with its last
    /// child's), every 10 s, forever.
    pub async fn quota_sweep_loop(self) {
        let mut tick = tokio::time::interval(Duration::from_secs(10));
        loop {
            tick.tick().await;
            let engine = Arc::clone(&self.inner.engine);
            let _ = tokio::task::spawn_blocking(move || engine.sweep()).await;
        }
    }

    /// Enforce lifetimes and idle timeouts, twice a second, forever.
    pub async fn expire_loop(self) {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tick.tick().await;
            let now = now_ms();
            let expired: Vec<(Arc<SandboxEntry>, bool)> = self
                .inner
                .sandboxes
                .read()
                .await
                .values()
                .filter_map(|e| {
                    let idle = now.saturating_sub(e.last_active.load(Ordering::Relaxed));
                    let idle_out = e.lifecycle().can_idle_out() && idle >= e.settings.idle_timeout.as_millis() as u64;
                    // A persistent sandbox freezes at its idle timeout; its
                    // lifetime's end destroys it like any other.
                    if now >= e.expires_at() {
                        Some((Arc::clone(e), false))
                    } else {
                        idle_out.then(|| (Arc::clone(e), e.settings.persistent))
                    }
                })
                .collect();
            for (entry, persistent) in expired {
                if persistent {
                    // A big freeze takes a while: the timers go on meanwhile,
                    // and the sandbox counts as busy so it is not picked again.
                    let busy = entry.hold_busy();
                    let state = self.clone();
                    tokio::spawn(async move {
                        state.freeze_idle(&entry.id).await;
                        drop(busy);
                    });
                } else {
                    tracing::info!(sandbox = %entry.id, "timed out");
                    let _ = self.destroy(&Caller::server(), &entry.id).await;
                }
            }
            if let Some(after) = self.inner.config.idle_pause {
                let idle: Vec<Arc<SandboxEntry>> = self
                    .inner
                    .sandboxes
                    .read()
                    .await
                    .values()
                    .filter(|e| e.lifecycle().can_pause() && now.saturating_sub(e.last_active.load(Ordering::Relaxed)) >= after.as_millis() as u64)
                    .cloned()
                    .collect();
                for e in idle {
                    // Busy ones are skipped (and tried again next tick).
                    let _ = crate::pause::pause_idle(&e).await;
                }
            }
        }
    }
}

/// What an unknown id answers, and so also another key's.
pub(crate) fn no_sandbox(id: &str) -> Error {
    Error::NotFound(format!("no sandbox `{id}`"))
}

/// The keys `config` accepts, with `<state>/keys.json`.
fn trust_store(config: &ServerConfig) -> jail::trust::TrustStore {
    jail::trust::TrustStore::new(&config.state_dir, config.host_cas.as_deref().map(jail::trust::CaSource::at))
}

fn setup(config: &ServerConfig) -> crate::setup::SandboxSetup {
    let trust_env = if config.host_cas.is_some() { jail::trust::env() } else { Vec::new() };
    crate::setup::SandboxSetup::new(trust_env, config.egress_proxy.clone())
}

fn key_ring(config: &ServerConfig) -> crate::keys::KeyRing {
    crate::keys::KeyRing::new(&config.api_keys, config.key_limits, crate::keys::key_file_path(&config.state_dir))
}

/// A frozen sandbox's fate.
pub enum Frozen {
    Space(Box<crate::spaces::SpaceMeta>),
    Resumed(crate::spaces::Resumed),
}

/// A reservation of `n` sandboxes against the server's caps
/// (crate::capacity) and its disk, released when dropped.
pub(crate) struct CreateSlot;

impl CreateSlot {
    pub(crate) fn take(state: &Service) -> Result<crate::capacity::Reserved<'_>, Error> {
        Self::take_n(state, 1)
    }

    pub(crate) fn take_n(state: &Service, n: usize) -> Result<crate::capacity::Reserved<'_>, Error> {
        let limits = &state.inner.config.limits;
        let caps = crate::capacity::Caps {
            max_sandboxes: limits.max_sandboxes,
            max_memory_mib: limits.max_memory_mib.unwrap_or_else(crate::config::default_memory_cap_mib),
        };
        // A full disk is told before a cap (507 before 429), as it always was.
        crate::disk::ensure_room_for_sandboxes(&state.inner.config.state_dir, state.inner.engine.as_ref())?;
        state.inner.capacity.reserve(n, caps, || state.memory_in_use_mib())
    }
}
