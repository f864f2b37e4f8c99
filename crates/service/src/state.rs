//! `Service`: the engine, the templates, the registry of live sandboxes
//! and the stores beside it, with what every operation needs from them
//! (lookup by id, a create's settings, caps and quotas). The operations
//! themselves are in their own modules (create.rs, destroy.rs, fork.rs, …).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use protocol::CreateSandbox;
use tokio::sync::RwLock;

use crate::config::ServerConfig;
use crate::error::Error;
use crate::ids::valid_id;
use crate::keys::{Caller, Reservation};
use crate::sandbox::{SandboxEntry, Settings};
use crate::templates::Templates;

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
    pub merged: std::sync::Mutex<crate::merged::MergedIds>,
    /// Warm zygotes and spare members per template (warm.rs, pool.rs).
    pub pool: crate::warm::Pool,
    /// Sandboxes frozen to disk (space_store.rs).
    pub spaces: crate::space_store::SpaceStore,
    /// `GET /metrics` (metrics.rs, scrape.rs).
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
    /// What the sandboxes are beyond this server (src/directory.rs).
    pub directory: Arc<dyn crate::directory::Directory>,
    /// Held while a hibernating sandbox wakes, so two calls wake it once
    /// (src/hibernate.rs).
    pub waking: tokio::sync::Mutex<()>,
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
                waking: Default::default(),
                pool: Default::default(),
                spaces: crate::space_store::SpaceStore::new(&config.state_dir),
                metrics: Default::default(),
                records: crate::records::Records::new(&config.state_dir),
                lost: Default::default(),
                drain: Default::default(),
                keys: key_ring(&config),
                quotas: Default::default(),
                trust: trust_store(&config),
                setup: Arc::new(setup(&config)),
                directory: Arc::clone(&config.directory.0),
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
        self.get_knowing(caller, id, None).await
    }

    /// [`get`](Self::get), given what [`frozen`](Self::frozen) found for
    /// `id` when the caller looked already (`Some`): in a cluster that
    /// lookup is a round trip to etcd, made once.
    async fn get_knowing(&self, caller: &Caller, id: &str, frozen: Option<Option<Frozen>>) -> Result<Arc<SandboxEntry>, Error> {
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
        let frozen = match frozen {
            Some(found) => found,
            None => self.frozen(caller, id).await,
        };
        match frozen {
            // (Boxed: waking creates a sandbox, which may look one up.)
            Some(Frozen::Space(space)) if space.hibernated => Box::pin(self.wake(caller, id, &space)).await,
            Some(Frozen::Space(space)) => Err(Error::Conflict(format!(
                "sandbox `{id}` is frozen in space `{}`: resume it with POST /v1/spaces/{}/resume",
                space.info.space_id, space.info.space_id
            ))),
            Some(Frozen::Resumed(r)) => {
                Err(Error::NotFound(format!("sandbox `{id}` was frozen into space `{}`, which was resumed as `{}`; use that id", r.space_id, r.resumed_as)))
            }
            // A hibernating sandbox being woken by another call is in
            // neither place for that moment: wait for the wake.
            None => {
                let _waking = self.inner.waking.lock().await;
                match self.inner.sandboxes.read().await.get(id) {
                    Some(e) if caller.may_use(e.settings.owner.as_deref()) => Ok(Arc::clone(e)),
                    _ => Err(no_sandbox(id)),
                }
            }
        }
    }

    /// What `caller` may see of sandbox `id`: a frozen one as it was, with
    /// `state: "frozen"`.
    pub async fn info(&self, caller: &Caller, id: &str) -> Result<protocol::SandboxInfo, Error> {
        // A hibernating sandbox is looked at, not woken.
        let mut looked = None;
        if valid_id(id) && !self.inner.sandboxes.read().await.contains_key(id) {
            match self.frozen(caller, id).await {
                Some(Frozen::Space(space)) => return Ok(space.sandbox),
                other => looked = Some(other),
            }
        }
        match self.get_knowing(caller, id, looked).await {
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
    pub async fn pool_info(&self, caller: &Caller) -> crate::warm::PoolInfo {
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
        let (state, sandbox_id, who) = (self.clone(), id.to_string(), caller.clone());
        let here = tokio::task::spawn_blocking(move || {
            let spaces = &state.inner.spaces;
            spaces.frozen(&who, &sandbox_id).map(|m| Frozen::Space(Box::new(m))).or_else(|| spaces.resumed(&who, &sandbox_id).map(Frozen::Resumed))
        })
        .await
        .ok()
        .flatten();
        if here.is_some() {
            return here;
        }
        // A cluster's Spaces are in its store, whichever node froze them.
        match self.inner.directory.frozen(id).await {
            Ok(Some(meta)) if meta.info.sandbox_id == id && caller.may_use(meta.owner.as_deref()) => Some(Frozen::Space(Box::new(meta))),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(sandbox = %id, err = %e, "could not look for a frozen sandbox beyond this server");
                None
            }
        }
    }

    /// Memory the live sandboxes use now (their cgroups' usage), in MiB.
    pub fn memory_in_use_mib(&self) -> u64 {
        let Ok(all) = self.inner.sandboxes.try_read() else { return 0 };
        all.values().map(|e| e.engine.memory_usage()).sum::<u64>() >> 20
    }

    /// Reserve room for `n` new sandboxes against the server's caps
    /// (crate::capacity) and its disk; released when the reservation drops,
    /// which the caller holds until they are registered.
    pub(crate) fn reserve_slots(&self, n: usize) -> Result<crate::capacity::Reserved<'_>, Error> {
        let limits = &self.inner.config.limits;
        let caps = crate::capacity::Caps {
            max_sandboxes: limits.max_sandboxes,
            max_memory_mib: limits.max_memory_mib.unwrap_or_else(crate::config::default_memory_cap_mib),
        };
        // A full disk is told before a cap (507 before 429), as it always was.
        crate::disk::ensure_room_for_sandboxes(&self.inner.config.state_dir, self.inner.engine.as_ref())?;
        self.inner.capacity.reserve(n, caps, || self.memory_in_use_mib())
    }

    /// Reserve `n` new sandboxes of `ram_mib` for `owner` against the
    /// quotas of `caller`'s key (a refusal is a 429 with `Retry-After`, and
    /// counted in the metrics).
    pub(crate) fn reserve_quota(&self, caller: &Caller, owner: Option<&str>, n: usize, ram_mib: u64, fork: bool) -> Result<Reservation<'_>, Error> {
        // Where the directory counts keys' quotas (a cluster), this server
        // only counts what its own sandboxes use.
        let limits = if self.inner.directory.counts_quotas() { None } else { caller.limits() };
        self.inner.quotas.reserve(owner, limits, n as u64, ram_mib, fork, std::time::Instant::now()).map_err(|r| {
            self.inner.metrics.quota_refused(r.limit.label());
            tracing::info!(key = owner.unwrap_or_default(), limit = r.limit.label(), "quota refused");
            Error::Quota(r)
        })
    }

    /// Reserve `n` sandboxes of `owner` beyond this server (a cluster's
    /// quotas; nothing alone), held until they are registered.
    pub(crate) async fn reserve_beyond(
        &self,
        caller: &Caller,
        owner: Option<&str>,
        n: usize,
        ram_mib: u64,
        fork: bool,
    ) -> Result<crate::directory::Hold, Error> {
        let directory = Arc::clone(&self.inner.directory);
        let ticket = match (owner, directory.counts_quotas()) {
            (Some(owner), true) => {
                let limits = caller.limits().unwrap_or_default();
                directory.reserve(owner, limits, n as u64, ram_mib, fork).await.inspect_err(|e| {
                    if let Error::Quota(r) = e {
                        self.inner.metrics.quota_refused(r.limit.label());
                        tracing::info!(key = owner, limit = r.limit.label(), "cluster quota refused");
                    }
                })?
            }
            _ => None,
        };
        Ok(crate::directory::Hold::new(directory, ticket))
    }

    /// `entry` left the registry: it no longer counts against the server's
    /// cap or its key's quotas. Every removal from `sandboxes` calls this.
    pub(crate) fn unregistered(&self, entry: &SandboxEntry) {
        self.inner.capacity.unregistered();
        if let Some(owner) = &entry.settings.owner {
            self.inner.quotas.release(owner, entry.settings.ram_mib);
        }
        let (directory, id, owner) = (Arc::clone(&self.inner.directory), entry.id.clone(), entry.settings.owner.clone());
        tokio::spawn(async move { directory.unregister(&id, owner.as_deref()).await });
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
        let persistent = req.persistent.unwrap_or(false);
        let keep_processes = match (req.keep_processes, &self.inner.config.criu) {
            (Some(true), criu::Readiness::Unavailable(why)) => {
                return Err(Error::Invalid(format!("keep_processes needs criu, and this server has none: {why}")));
            }
            (asked, criu::Readiness::Ready(_)) => asked.unwrap_or(persistent),
            (_, criu::Readiness::Unavailable(_)) => false,
        };
        Ok(Settings {
            template,
            ram_mib,
            rootfs_gb,
            timeout: secs(req.timeout_seconds, l.default_timeout, l.max_timeout, "timeout_seconds")?,
            egress,
            idle_timeout: secs(req.idle_timeout_seconds, l.default_idle_timeout, l.max_idle_timeout, "idle_timeout_seconds")?,
            interrupt_grace: l.interrupt_grace,
            persistent,
            keep_processes,
            owner: caller.owner(),
            setup: Arc::clone(&self.inner.setup),
            env: Vec::new(),
            metadata: Default::default(),
            pause_at_timeout: false,
            public_ports: false,
        })
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
    Space(Box<crate::space_store::SpaceMeta>),
    Resumed(crate::space_store::Resumed),
}
