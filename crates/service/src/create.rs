//! Create: a new sandbox from the warm pool, or the slow way (a new
//! member and a fresh REPL), within its key's quotas and the server's caps.

use std::sync::Arc;

use protocol::CreateSandbox;

use crate::error::Error;
use crate::ids::new_id;
use crate::keys::{Caller, Reservation};
use crate::sandbox::{new_entry, start_repl, SandboxEntry, Settings};
use crate::state::Service;

impl Service {
    pub async fn create(&self, caller: &Caller, req: CreateSandbox) -> Result<Arc<SandboxEntry>, Error> {
        // A cluster's template made on another node is fetched first.
        self.ensure_template(req.template.as_deref().unwrap_or("default")).await?;
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
        let kept_id = space.as_ref().and_then(|start| start.id.clone());
        let initial_upper = space.map(|start| start.upper);
        let quota = self.reserve_quota(caller, settings.owner.as_deref(), 1, settings.ram_mib, false)?;
        let _slot = self.reserve_slots(1)?;
        let beyond = self.reserve_beyond(caller, settings.owner.as_deref(), 1, settings.ram_mib, false).await?;
        let started = std::time::Instant::now();
        let from_space = initial_upper.is_some();
        // A solo sandbox is made for itself: the pool's are forks.
        let pooled = match initial_upper {
            None if !settings.keep_processes => self.create_from_pool(&settings).await,
            _ => Ok(None),
        };
        match pooled {
            Ok(Some(entry)) => {
                tracing::info!(sandbox = %entry.id, template = %entry.settings.template, pool = true,
                    total_ms = started.elapsed().as_millis() as u64, "created");
                self.register_created(&entry, quota, beyond, "pool", started).await?;
                return Ok(entry);
            }
            Ok(None) => {}
            // The pool is an optimisation: make the sandbox the slow way.
            Err(e) => tracing::warn!(err = ?e, "warm pool create failed; creating from scratch"),
        }
        let id = kept_id.unwrap_or_else(new_id);
        // Without the pool, a custom template's sandbox starts where its
        // zygote would have: its modules imported, its saved REPL loaded.
        let custom = !from_space && !self.inner.templates.is_builtin(&settings.template);
        let repl_state = if custom { self.inner.templates.repl_state(&settings.template) } else { None };
        let trust = self.trust_layer(&rootfs)?;
        let spec = jail::SandboxSpec {
            solo: settings.keep_processes,
            ..rootfs.spec(id.clone(), self.limits_for(&settings), initial_upper.or_else(|| repl_state.clone()), trust)
        };
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
        let entry = new_entry(id, settings, engine, session, Vec::new());
        tracing::info!(sandbox = %entry.id, template = %entry.settings.template, jail_ms = jailed.as_millis() as u64,
            total_ms = started.elapsed().as_millis() as u64, "created");
        self.register_created(&entry, quota, beyond, if from_space { "space" } else { "cold" }, started).await?;
        Ok(entry)
    }

    /// A made sandbox joins the registry: it is recorded beyond this
    /// server (a cluster's registry; if that fails, it is destroyed and
    /// the create fails), it counts against the caps and its key's quota,
    /// its network comes up, and it is recorded so a restarted server
    /// adopts it. `how`: the create metric's kind.
    pub(crate) async fn register_created(
        &self,
        entry: &Arc<SandboxEntry>,
        quota: Reservation<'_>,
        beyond: crate::directory::Hold,
        how: &str,
        started: std::time::Instant,
    ) -> Result<(), Error> {
        if let Err(e) = beyond.register(&[registered(entry)]).await {
            self.teardown(entry).await;
            return Err(e);
        }
        self.inner.sandboxes.write().await.insert(entry.id.clone(), Arc::clone(entry));
        self.inner.capacity.registered(1);
        quota.commit();
        self.inner.metrics.observe_create(how, started);
        crate::sandbox::network::apply_soon(entry, entry.settings.egress.clone()).await;
        self.inner.records.save(entry);
        Ok(())
    }
}

/// What the directory records of a sandbox.
pub(crate) fn registered(entry: &SandboxEntry) -> crate::directory::Registered {
    crate::directory::Registered {
        id: entry.id.clone(),
        owner: entry.settings.owner.clone(),
        template: entry.settings.template.clone(),
        ram_mib: entry.settings.ram_mib,
        created_at: entry.created_at,
    }
}
