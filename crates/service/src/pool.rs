//! The warm template pool (docs/fork.md): a create is a fork.
//!
//! Per template the pool keeps a *zygote*: a hidden sandbox whose REPL has
//! imported the template's usual modules and never runs user code, plus a
//! few *spare* members of its family (namespaces, init, cgroup and fresh
//! files, built ahead of time). A create takes a spare and has the zygote's
//! REPL fork itself into it, so the new sandbox starts with numpy and
//! pandas already imported, in a few milliseconds. Spares are refilled in
//! the background; a zygote retires when its family holds
//! `RETIRE_AT_LIVE` live sandboxes or after `RETIRE_AFTER` creates (its
//! family lives on while its members do), so no family grows without bound
//! and a fresh family takes over.
//!
//! Everything the pool makes is hidden from the sandbox list, limits and
//! timers until it is handed out.
//!
//! On a server with API keys each key gets zygotes of its own
//! (`PoolKey`): members of one family share what the kernel counts per
//! user (inotify instances, message-queue bytes; docs/security.md), so a
//! family never serves two tenants. A key's pool is made on its first
//! create and let go after `--pool-idle-seconds` without one.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

use crate::ids::new_id;
use crate::sandbox::{new_entry, start_repl, SandboxEntry, Settings};
use crate::state::Service;
use crate::warm::{Batched, Born, Warm};
pub use crate::warm::{Pool, PoolInfo, PoolKey, PoolTemplate};
use repl_host::session::ReplItem;

/// Spare members kept ready per template.
const SPARES: usize = 2;
/// Sandboxes kept forked ahead of demand per template (`Born`): a create
/// that finds one skips the zygote's fork, about 7 ms of its 9.
const BORN: usize = 2;
/// Live sandboxes of one zygote's family (its creates and their forks)
/// at which a fresh family takes over: they are one host uid, and the
/// kernel counts some limits per uid (docs/security.md), so this bounds
/// how many sandboxes share them. Counted live, not served: under churn a
/// zygote serves on while its sandboxes come and go, instead of a new one
/// importing its modules every few seconds (bench/churn.py).
pub(crate) const RETIRE_AT_LIVE: usize = 64;
/// Creates one zygote serves before it is replaced whatever its family
/// holds, so no process serves forever.
const RETIRE_AFTER: usize = 4096;
/// How long a refill waits after a create that left spares.
const REFILL_DELAY: Duration = Duration::from_millis(100);
/// The zygote's CPU weight: the most a cgroup can have (cgroup v2's
/// `cpu.weight` range; v1 shares are scaled from it). A create that finds
/// nothing ready waits for the zygote's fork, and at a sandbox's weight
/// the zygote was one of the 50-odd busy cgroups of bench/load.py, each
/// as heavy. It runs no user code, and forks only what creates ask for.
const ZYGOTE_CPU_WEIGHT: u64 = 10_000;
/// Most creates one call of the zygote forks at once.
const FORK_BATCH: usize = 8;
/// Templates warmed at start (others warm on first use).
const WARM_AT_START: &[&str] = &["default"];

impl Service {
    /// A new sandbox forked from the template's zygote, if one is warm.
    /// `Ok(None)`: no warm zygote (the caller makes one the slow way).
    pub(crate) async fn create_from_pool(&self, settings: &Settings) -> Result<Option<Arc<SandboxEntry>>, crate::error::Error> {
        if !self.inner.config.warm_pool {
            return Ok(None);
        }
        self.inner.pool.want(PoolKey::of(settings));
        self.create_from_zygote(settings, 0).await
    }

    async fn create_from_zygote(&self, settings: &Settings, attempt: u32) -> Result<Option<Arc<SandboxEntry>>, crate::error::Error> {
        let Some(warm) = self.inner.pool.current(&PoolKey::of(settings)) else { return Ok(None) };
        if !warm.zygote.engine.init_alive() {
            // Its family's supervisor died (it can be killed from the host;
            // tests/e2e/test_process_model.py): nothing it made lives on.
            self.retire_later(&warm);
            return Ok(None);
        }
        if !self.trust_is_current(&warm)? {
            let key = warm.key.clone();
            let stale = self.inner.pool.take_warm(|_, w| std::ptr::eq(w, &*warm));
            self.let_go_all(stale, "the host's CAs changed").await;
            self.inner.pool.want(key);
            return Ok(None);
        }
        if let Ok(mut t) = warm.last_used.lock() {
            *t = std::time::Instant::now();
        }
        let limits = self.limits_for(settings);
        if let Some(born) = warm.take_born() {
            let usable = born.member.init_alive() && (born.member.limits() == limits || born.member.set_limits(&limits).is_ok());
            if usable {
                return Ok(Some(self.hand_out(&warm, born.member, born.session, settings).await));
            }
            // Not usable: it goes, and this create forks as below.
            self.discard_born(vec![born]).await;
        }
        // The member is taken, or built, before the zygote's lock: creates
        // queue there for the fork alone, not behind each other's builds
        // (bench/churn.py: a quarter of the creates waited 2 s in that queue).
        let spare = warm.spares.lock().await.pop();
        let spare = match spare {
            Some(s) => s,
            None => {
                let id = new_id();
                let mut made = self
                    .inner
                    .engine
                    .spare_members(warm.zygote.engine.as_ref(), &[id], &limits)
                    .await
                    .map_err(|e| crate::error::Error::internal("could not make a sandbox", e))?;
                made.remove(0)
            }
        };
        if spare.member.limits() != limits {
            if let Err(e) = spare.member.set_limits(&limits) {
                self.discard_born_parts(vec![(spare.member, None)]).await;
                return Err(crate::error::Error::internal("could not set the sandbox's limits", e));
            }
        }
        match self.fork_queued(&warm, spare).await {
            Batched::Made(member, session) => Ok(Some(self.hand_out(&warm, member, session, settings).await)),
            // Creates queue on the zygote; one retired meanwhile is torn
            // down under its lock, after the forks queued before it. Those
            // queued after it move on to its successor (found by
            // bench/load.py: they fell back to a cold start, 26 s under load).
            Batched::NoZygote if warm.retiring.load(Ordering::SeqCst) && attempt < 3 => Box::pin(self.create_from_zygote(settings, attempt + 1)).await,
            Batched::NoZygote => Ok(None),
            Batched::Failed(e) => {
                // A zygote that cannot fork (it died, its supervisor died)
                // is replaced; this create is made the slow way.
                self.retire_later(&warm);
                Err(e)
            }
        }
    }

    /// Have the zygote fork `spare` into a sandbox, with whatever other
    /// creates wait for it: one task forks the waiting creates, oldest
    /// first, up to `FORK_BATCH` in one call of the zygote's REPL (one
    /// round of its protocol and of the family supervisor's for all), so
    /// creates that queue behind each other wait for one batch, not for
    /// each fork before theirs. The task is the queue's, not the create's:
    /// a create whose client goes away cancels no one else's fork.
    async fn fork_queued(&self, warm: &Arc<Warm>, spare: crate::engine::Forked) -> Batched {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let start = {
            let mut q = warm.fork_queue.lock().unwrap_or_else(|e| e.into_inner());
            q.waiting.push((spare, tx));
            !std::mem::replace(&mut q.forking, true)
        };
        if start {
            let (state, warm) = (self.clone(), Arc::clone(warm));
            tokio::spawn(async move { state.fork_waiting(&warm).await });
        }
        rx.await.unwrap_or_else(|_| Batched::Failed(crate::error::Error::Internal("the zygote's fork was cut off".into())))
    }

    /// The queue's task: fork batches until no create waits. A batch holds
    /// the zygote only until its REPL has answered; its children start and
    /// are adopted on a task of their own (`settle_batch`) while the next
    /// batch forks. Under bench/load.py the zygote was busy forking 95% of
    /// the time, half of it waiting for children that no longer needed it.
    async fn fork_waiting(&self, warm: &Arc<Warm>) {
        loop {
            let mut zygote_slot = warm.zygote.slot.lock().await;
            let (batch, first_slot) = {
                let mut q = warm.fork_queue.lock().unwrap_or_else(|e| e.into_inner());
                if q.waiting.is_empty() {
                    q.forking = false;
                    return;
                }
                let n = q.waiting.len().min(FORK_BATCH);
                (q.waiting.drain(..n).collect::<Vec<_>>(), q.take_slots(n))
            };
            let (spares, answers): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
            let Some(session) = zygote_slot.session.as_mut() else {
                drop(zygote_slot);
                self.discard_born_parts(spares.into_iter().map(|s| (s.member, None)).collect()).await;
                for answer in answers {
                    let _ = answer.send(Batched::NoZygote);
                }
                continue;
            };
            // Taken under the zygote's lock: its teardown (`destroy_warm`)
            // waits for every batch it answered to settle.
            let settling = Arc::clone(&warm.settling).read_owned().await;
            let answered = self.fork_answered(session, warm.zygote.engine.as_ref(), spares, Some(&warm.plan), first_slot, &mut jail::Rooting::done()).await;
            drop(zygote_slot);
            match answered {
                Ok(answered) => {
                    let (state, warm) = (self.clone(), Arc::clone(warm));
                    tokio::spawn(async move {
                        state.settle_batch(&warm, answered, answers).await;
                        drop(settling);
                    });
                }
                Err(e) => {
                    for answer in answers {
                        let _ = answer.send(Batched::Failed(e.clone()));
                    }
                }
            }
        }
    }

    /// Wait for a batch's children and hand each to its create as soon as
    /// that child is ready and adopted.
    async fn settle_batch(&self, warm: &Warm, answered: crate::fork_steps::Answered, answers: Vec<tokio::sync::oneshot::Sender<Batched>>) {
        let each = self.settle_each(warm.zygote.engine.as_ref(), answered).into_iter().zip(answers).map(|(settled, answer)| async move {
            match settled.await {
                Ok((member, session)) => {
                    if let Err(Batched::Made(member, session)) = answer.send(Batched::Made(member, session)) {
                        // Its create is gone (the client left): so is it.
                        self.discard_born(vec![Born { member, session }]).await;
                    }
                }
                Err(e) => {
                    let _ = answer.send(Batched::Failed(e));
                }
            }
        });
        futures::future::join_all(each).await;
    }

    /// A sandbox forked from `warm`'s zygote becomes `settings`' new
    /// sandbox; the pool refills behind it.
    async fn hand_out(
        &self,
        warm: &Arc<Warm>,
        member: crate::engine::MemberRef,
        session: repl_host::session::ReplSession,
        settings: &Settings,
    ) -> Arc<SandboxEntry> {
        // No way out yet: it starts on the sandbox's first network socket
        // (docs/network.md#the-way-out-starts-on-first-use).
        let entry = new_entry(member.id().to_string(), settings.clone(), member, session, Vec::new());
        let served = warm.served.fetch_add(1, Ordering::SeqCst) + 1;
        let live = self.family_sandboxes(warm).await + 1;
        let state = self.clone();
        let warm = Arc::clone(warm);
        tokio::spawn(async move {
            // Once its successor is on the way, a zygote refills on: it
            // serves the creates until the successor takes over.
            if (live >= RETIRE_AT_LIVE || served >= RETIRE_AFTER) && !warm.retiring.load(Ordering::SeqCst) {
                state.retire(&warm).await;
            } else {
                // Let the new sandbox's first calls run first: refilling
                // competes with them for the CPU. Nothing left to serve the
                // next create: refill at once.
                let left = warm.born.lock().map(|b| b.len()).unwrap_or(0) + warm.spares.lock().await.len();
                if left > 0 {
                    tokio::time::sleep(REFILL_DELAY).await;
                }
                state.refill(&warm).await;
            }
        });
        entry
    }

    /// Listed sandboxes of `warm`'s zygote's family (creates it served and
    /// their forks; the pool's own are not listed).
    async fn family_sandboxes(&self, warm: &Warm) -> usize {
        self.inner.sandboxes.read().await.values().filter(|e| e.engine.same_family(warm.zygote.engine.as_ref())).count()
    }

    /// Fork the zygote into spares until `BORN` sandboxes wait. Through
    /// the creates' queue: a fork of its own here took the zygote's lock
    /// once per sandbox, and with a refill behind every create, queued
    /// creates waited behind them all (bench/churn.py: 640 ms on average).
    async fn bear(&self, warm: &Arc<Warm>) {
        loop {
            if self.inner.pool.closing.load(Ordering::SeqCst) || warm.draining.load(Ordering::SeqCst) {
                return;
            }
            if warm.born.lock().map(|b| b.len()).unwrap_or(BORN) >= BORN {
                return;
            }
            let spare = warm.spares.lock().await.pop();
            let Some(spare) = spare else { return };
            let (member, session) = match self.fork_queued(warm, spare).await {
                Batched::Made(member, session) => (member, session),
                Batched::NoZygote => return,
                Batched::Failed(e) => {
                    // The create path finds out too, and retires the zygote.
                    tracing::debug!(template = %warm.key.template, err = ?e, "could not fork a sandbox ahead of demand");
                    return;
                }
            };
            if !self.keep_born(warm, Born { member, session }).await {
                return;
            }
        }
    }

    /// Put a sandbox forked ahead of demand where creates find it, unless
    /// the zygote is being torn down or the server closing: then it is destroyed
    /// (false). Checked and kept under the one lock `destroy_warm` drains
    /// with, after the flags it sets first: nothing is left behind.
    async fn keep_born(&self, warm: &Warm, born: Born) -> bool {
        let refused = {
            let mut ready = warm.born.lock().unwrap_or_else(|e| e.into_inner());
            if self.inner.pool.closing.load(Ordering::SeqCst) || warm.draining.load(Ordering::SeqCst) {
                Some(born)
            } else {
                ready.push(born);
                None
            }
        };
        match refused {
            Some(b) => {
                self.discard_born(vec![b]).await;
                false
            }
            None => true,
        }
    }

    /// Destroy sandboxes that were forked ahead of demand and will not be
    /// handed out.
    async fn discard_born(&self, born: Vec<Born>) {
        self.discard_born_parts(born.into_iter().map(|b| (b.member, Some(b.session))).collect()).await
    }

    async fn discard_born_parts(&self, parts: Vec<(crate::engine::MemberRef, Option<repl_host::session::ReplSession>)>) {
        for (member, session) in parts {
            drop(session);
            let _ = self.inner.engine.destroy(member.as_ref()).await;
        }
    }

    pub(crate) fn limits_for(&self, settings: &Settings) -> jail::Limits {
        jail::Limits { memory_bytes: settings.ram_mib << 20, pids: self.inner.config.limits.pids, cpu_weight: 100, disk_bytes: settings.rootfs_gb << 30 }
    }

    /// Keep `SPARES` spare members ready.
    async fn refill(&self, warm: &Arc<Warm>) {
        let _busy = self.inner.pool.busy.read().await;
        self.refill_held(warm).await;
    }

    /// `refill` for a caller that holds `busy` already (a second shared
    /// hold could wait behind a waiting shutdown forever): `SPARES` spare
    /// members, `BORN` sandboxes forked into some of them, and the spares
    /// those took made again.
    async fn refill_held(&self, warm: &Arc<Warm>) {
        self.make_spares(warm).await;
        if warm.born.lock().map(|b| b.len() < BORN).unwrap_or(false) {
            self.bear(warm).await;
            self.make_spares(warm).await;
        }
    }

    async fn make_spares(&self, warm: &Arc<Warm>) {
        if self.inner.pool.closing.load(Ordering::SeqCst) || warm.draining.load(Ordering::SeqCst) {
            return;
        }
        let have = warm.spares.lock().await.len();
        if have >= SPARES {
            return;
        }
        let ids: Vec<String> = (have..SPARES).map(|_| new_id()).collect();
        let limits = self.limits_for(&warm.zygote.settings);
        let made = match self.inner.engine.spare_members(warm.zygote.engine.as_ref(), &ids, &limits).await {
            Ok(made) => made,
            Err(e) => {
                tracing::warn!(template = %warm.key.template, owner = ?warm.key.owner, err = %e, "could not refill the warm pool");
                return;
            }
        };
        self.keep_spares(warm, made).await;
    }

    /// Hand `made` spares over under the spares lock, unless the zygote is being torn down or the server
    /// is closing meanwhile (`destroy_warm` drains under the same lock
    /// after setting those flags): then they go.
    async fn keep_spares(&self, warm: &Warm, made: Vec<crate::engine::Forked>) {
        let mut spares = warm.spares.lock().await;
        if self.inner.pool.closing.load(Ordering::SeqCst) || warm.draining.load(Ordering::SeqCst) {
            drop(spares);
            for s in made {
                let _ = self.inner.engine.destroy(s.member.as_ref()).await;
            }
            return;
        }
        spares.extend(made);
    }

    /// [`Self::retire`] on a task of its own.
    fn retire_later(&self, warm: &Arc<Warm>) {
        let (state, warm) = (self.clone(), Arc::clone(warm));
        tokio::spawn(async move { state.retire(&warm).await });
    }

    /// Replace a zygote that served its share (or broke) with a fresh family.
    async fn retire(&self, old: &Arc<Warm>) {
        // Only the first of several concurrent retirements does the work.
        if old.retiring.swap(true, Ordering::SeqCst) {
            return;
        }
        self.inner.pool.list_retired(old);
        // Held to the end, so that shutdown (`destroy_pool`) waits for the
        // old zygote's teardown: it used to return while this was still
        // destroying the old spares, and left them behind.
        let _busy = self.inner.pool.busy.read().await;
        if let Err(e) = self.warm_up_held(&old.key).await {
            tracing::warn!(template = %old.key.template, owner = ?old.key.owner, err = %e, "could not replace a retired zygote");
        }
        self.destroy_warm(old).await;
        // Replaced, or else out of the map, so the pool loop warms anew.
        self.inner.pool.take_warm(|_, w| std::ptr::eq(w, &**old));
        self.inner.pool.unlist_retired(old);
    }

    /// Whether `warm`'s family trusts the host's CAs as they are now.
    fn trust_is_current(&self, warm: &Warm) -> Result<bool, crate::error::Error> {
        if !self.inner.trust.enabled() {
            return Ok(true);
        }
        let root = self.inner.templates.rootfs(&warm.key.template)?;
        Ok(self.trust_layer(&root)? == warm.trust)
    }

    /// A custom template was replaced or deleted: creates stop using its
    /// zygotes (which hold the old files and REPL state) at once, and they
    /// are torn down. (On a replace the caller then `want`s the new
    /// version's, which the pool loop warms within half a second, one
    /// warm-up at a time, so a big saved state is loaded once.)
    pub(crate) async fn drop_zygotes(&self, template: &str) {
        let pool = &self.inner.pool;
        if let Ok(mut w) = pool.wanted.lock() {
            w.retain(|k| k.template != template);
        }
        let old = pool.take_warm(|k, _| k.template == template);
        self.let_go_all(old, "its template changed").await;
    }

    /// Before warming one more pool, let the least recently used go while
    /// `--max-warm-pools` are warm: what they hold is hidden from the
    /// memory cap, and with keys their number follows the keys in use.
    async fn make_room(&self) {
        let max = self.inner.config.max_pools.max(1);
        loop {
            let lru = {
                let Ok(m) = self.inner.pool.warm.lock() else { return };
                if m.len() < max {
                    return;
                }
                m.iter().min_by_key(|(_, w)| w.last_used.lock().map(|t| *t).ok()).map(|(k, _)| k.clone())
            };
            let Some(lru) = lru else { return };
            let taken = self.inner.pool.take_warm(|k, _| *k == lru);
            self.let_go_all(taken, "least recently used, past --max-warm-pools").await;
        }
    }

    /// Let go of pools taken out of the map: no longer wanted, and torn
    /// down unless a retirement already does that.
    async fn let_go_all(&self, pools: Vec<Arc<Warm>>, why: &str) {
        if let Ok(mut wanted) = self.inner.pool.wanted.lock() {
            for w in &pools {
                wanted.remove(&w.key);
            }
        }
        for w in pools {
            tracing::info!(template = %w.key.template, owner = ?w.key.owner, why, "warm pool let go");
            if !w.retiring.swap(true, Ordering::SeqCst) {
                self.destroy_warm(&w).await;
            }
        }
    }

    /// Let go of the pools no create used for `--pool-idle-seconds` (but
    /// the ones warmed at start on a server without keys), and of those
    /// whose key was removed.
    async fn drop_idle(&self) {
        let idle = self.inner.config.pool_idle;
        let pool = &self.inner.pool;
        let stale = pool.take_warm(|k, w| {
            if k.owner.as_deref().is_some_and(|name| !self.inner.keys.has_name(name)) {
                return true;
            }
            let kept = k.owner.is_none() && WARM_AT_START.contains(&k.template.as_str());
            !kept && w.last_used.lock().map(|t| t.elapsed() >= idle).unwrap_or(false)
        });
        self.let_go_all(stale, "idle, or its key was removed").await;
    }

    async fn destroy_warm(&self, warm: &Warm) {
        warm.draining.store(true, Ordering::SeqCst);
        let spares: Vec<crate::engine::Forked> = warm.spares.lock().await.drain(..).collect();
        for s in spares {
            let _ = self.inner.engine.destroy(s.member.as_ref()).await;
        }
        // Forks of it already queued finish first; later ones see no
        // session and go to the successor (`create_from_pool`).
        let mut slot = warm.zygote.slot.lock().await;
        // Batches it answered finish first (their children are the zygote
        // REPL's until the shim adopts them).
        let _settled = warm.settling.write().await;
        self.teardown(&warm.zygote).await;
        slot.session = None;
        drop(slot);
        // After the zygote's lock: a fork ahead of demand in flight has
        // put its sandbox here (or seen the flags and destroyed it).
        let born: Vec<Born> = warm.born.lock().map(|mut b| b.drain(..).collect()).unwrap_or_default();
        self.discard_born(born).await;
    }

    /// Make (or remake) the zygote of `key` and its spares.
    pub async fn warm_up(&self, key: &PoolKey) -> Result<(), WarmError> {
        let _busy = self.inner.pool.busy.read().await;
        self.warm_up_held(key).await
    }

    /// `warm_up` for a caller that holds `busy` already.
    async fn warm_up_held(&self, key: &PoolKey) -> Result<(), WarmError> {
        if self.inner.pool.closing.load(Ordering::SeqCst) {
            return Err(WarmError::Closing);
        }
        let root = self.inner.templates.rootfs(&key.template)?;
        let id = new_id();
        if let Ok(mut w) = self.inner.pool.warming.lock() {
            w.insert(id.clone());
        }
        let made = self.warm_up_as(key, id.clone(), root).await;
        if let Ok(mut w) = self.inner.pool.warming.lock() {
            w.remove(&id);
        }
        made
    }

    async fn warm_up_as(&self, key: &PoolKey, id: String, root: crate::templates::Root) -> Result<(), WarmError> {
        let template = key.template.as_str();
        let settings = Settings {
            template: template.to_string(),
            ram_mib: self.inner.config.limits.default_ram_mib,
            rootfs_gb: self.inner.config.limits.default_rootfs_gb,
            timeout: Duration::MAX,
            idle_timeout: Duration::MAX,
            interrupt_grace: self.inner.config.limits.interrupt_grace,
            // A zygote never reaches the network; its forks get their own.
            egress: protocol::Egress::On(false),
            persistent: false,
            keep_processes: false,
            owner: None,
            setup: Arc::clone(&self.inner.setup),
            env: Vec::new(),
            metadata: Default::default(),
            pause_at_timeout: false,
            public_ports: false,
        };
        // A template saved from a sandbox starts from its REPL state: the
        // zygote loads it once and every sandbox forks from it.
        let repl_state = self.inner.templates.repl_state(template);
        let settings = Settings { ram_mib: settings.ram_mib.max(self.inner.templates.limits(template).ram_mib.unwrap_or(0)), ..settings };
        let trust = self.trust_layer(&root)?;
        let limits = jail::Limits { cpu_weight: ZYGOTE_CPU_WEIGHT, ..self.limits_for(&settings) };
        let spec = root.spec(id.clone(), limits, repl_state.clone(), trust.clone());
        let engine = self.inner.engine.create(spec).await?;
        let mut session = match start_repl(engine.as_ref(), &settings.setup).await {
            Ok(s) => s,
            Err(e) => {
                let _ = self.inner.engine.destroy(engine.as_ref()).await;
                return Err(e.into());
            }
        };
        if let Err(e) = warm_session(&mut session, &self.inner.templates.preimport(template), repl_state.is_some()).await {
            let _ = self.inner.engine.destroy(engine.as_ref()).await;
            return Err(e);
        }
        let plan = serde_json::to_value(jail::fork_plan(session.host_pid)).unwrap_or_default();
        let zygote = new_entry(id, settings, engine, session, Vec::new());
        let warm = Arc::new(Warm {
            key: key.clone(),
            zygote,
            spares: Mutex::new(Vec::new()),
            born: Default::default(),
            served: AtomicUsize::new(0),
            retiring: Default::default(),
            draining: Default::default(),
            fork_queue: Default::default(),
            settling: Default::default(),
            plan,
            last_used: std::sync::Mutex::new(std::time::Instant::now()),
            trust,
        });
        self.refill_held(&warm).await;
        if self.inner.pool.closing.load(Ordering::SeqCst) {
            self.destroy_warm(&warm).await;
            return Err(WarmError::Closing);
        }
        if !self.inner.templates.is_ready(template) {
            self.destroy_warm(&warm).await;
            return Err(WarmError::Deleted(template.to_string()));
        }
        let old = self.inner.pool.warm.lock().ok().and_then(|mut m| m.insert(key.clone(), Arc::clone(&warm)));
        if let Some(old) = old {
            if !Arc::ptr_eq(&old, &warm) {
                // A zygote already retiring is torn down by whoever set the
                // flag (`retire`, a let-go); one that two warm-ups raced to
                // replace is torn down here.
                if !old.retiring.swap(true, Ordering::SeqCst) {
                    // Listed as retired until it is gone, so that a shutdown
                    // meanwhile destroys it too rather than leave its family.
                    self.inner.pool.list_retired(&old);
                    let me = self.clone();
                    tokio::spawn(async move {
                        me.destroy_warm(&old).await;
                        me.inner.pool.unlist_retired(&old);
                    });
                }
            }
        }
        tracing::info!(template, owner = ?key.owner, zygote = %warm.zygote.id, "warm pool ready");
        Ok(())
    }

    /// Warm the templates in use, forever (started by `serve`).
    pub async fn pool_loop(self) {
        if !self.inner.config.warm_pool {
            return;
        }
        // With keys, each key's pools are made on its first create: an
        // owner-less one would serve nobody.
        if !self.inner.keys.required() {
            for t in WARM_AT_START {
                self.inner.pool.want(PoolKey { owner: None, template: t.to_string() });
            }
        }
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tick.tick().await;
            if self.inner.pool.closing.load(Ordering::SeqCst) {
                return;
            }
            self.nudge_zygotes().await;
            self.drop_idle().await;
            let wanted: Vec<PoolKey> = self.inner.pool.wanted.lock().map(|w| w.iter().cloned().collect()).unwrap_or_default();
            for key in wanted {
                // Still wanted: making room for one earlier in this round may
                // have let this one go.
                let still = self.inner.pool.wanted.lock().map(|w| w.contains(&key)).unwrap_or(false);
                if !still || self.inner.pool.current(&key).is_some() || !self.inner.templates.is_ready(&key.template) {
                    continue;
                }
                self.make_room().await;
                if let Err(e) = self.warm_up(&key).await {
                    tracing::warn!(template = %key.template, owner = ?key.owner, err = %e, "could not warm the template pool");
                    // Do not retry a broken template in a tight loop.
                    if let Ok(mut w) = self.inner.pool.wanted.lock() {
                        w.remove(&key);
                    }
                }
            }
        }
    }

    /// Let each idle zygote reap the sandboxes' REPLs that died (they are
    /// its children; it keeps them a moment so their exit status can be read),
    /// and replace one whose family's supervisor died before a create finds it.
    async fn nudge_zygotes(&self) {
        let all: Vec<Arc<Warm>> = self.inner.pool.warm.lock().map(|m| m.values().cloned().collect()).unwrap_or_default();
        for w in all {
            if !w.zygote.engine.init_alive() {
                self.retire_later(&w);
                continue;
            }
            if let Ok(mut slot) = w.zygote.slot.try_lock() {
                if let Some(session) = slot.session.as_mut() {
                    let _ = session.nudge().await;
                }
            }
        }
    }

    /// The root filesystems the zygotes (current and retiring) stand on.
    pub(crate) fn zygote_roots(&self) -> Vec<std::path::PathBuf> {
        let mut all: Vec<Arc<Warm>> = self.inner.pool.warm.lock().map(|m| m.values().cloned().collect()).unwrap_or_default();
        all.extend(self.inner.pool.retired.lock().map(|r| r.clone()).unwrap_or_default());
        all.iter().map(|w| w.zygote.engine.layers().1).collect()
    }

    /// Destroy every zygote and spare (server shutdown).
    pub(crate) async fn destroy_pool(&self) {
        self.inner.pool.closing.store(true, Ordering::SeqCst);
        // Let pool work in flight finish (it sees `closing` and undoes itself).
        drop(self.inner.pool.busy.write().await);
        self.inner.engine.stop_refills().await;
        let mut all: Vec<Arc<Warm>> = self.inner.pool.warm.lock().map(|mut m| m.drain().map(|(_, w)| w).collect()).unwrap_or_default();
        all.extend(self.inner.pool.retired.lock().map(|mut r| r.drain(..).collect::<Vec<_>>()).unwrap_or_default());
        for w in all {
            self.destroy_warm(&w).await;
        }
    }
}

/// Bring a fresh REPL to its template's starting state: import `modules`,
/// and load the saved REPL state when the template has one.
pub(crate) async fn warm_session(session: &mut repl_host::session::ReplSession, modules: &[String], thaw: bool) -> Result<(), WarmError> {
    preload(session, modules).await.map_err(WarmError::Preload)?;
    if thaw {
        run_quietly(session, &crate::spaces::space_code("thaw"), crate::spaces::REPL_SAVE_TIMEOUT).await.map_err(WarmError::Thaw)?;
    }
    Ok(())
}

/// Import `modules` in a fresh REPL, without writing bytecode into the
/// sandbox's files (the zygote's files must stay the template's).
async fn preload(session: &mut repl_host::session::ReplSession, modules: &[String]) -> Result<(), QuietError> {
    if modules.is_empty() {
        return Ok(());
    }
    let list = modules.iter().map(|m| format!("{m:?}")).collect::<Vec<_>>().join(", ");
    // In a function, so the user's globals stay empty: only sys.modules
    // remembers the imports.
    let code = format!(
        "def _forkbox_preload():\n    import sys, importlib\n    sys.dont_write_bytecode = True\n    try:\n        for m in [{list}]:\n            try:\n                importlib.import_module(m)\n            except Exception:\n                pass\n    finally:\n        sys.dont_write_bytecode = False\n_forkbox_preload()\ndel _forkbox_preload\n"
    );
    run_quietly(session, &code, Duration::from_secs(120)).await
}

/// Run `code` in a REPL no one watches; an exception is an error.
async fn run_quietly(session: &mut repl_host::session::ReplSession, code: &str, timeout: Duration) -> Result<(), QuietError> {
    let id = session.send_exec(code).await.map_err(QuietError::Send)?;
    let wait = async {
        loop {
            match session.next().await {
                Some(ReplItem::Done(d)) if d.id == id => return d.error.map_or(Ok(()), |e| Err(QuietError::Raised { ename: e.ename, evalue: e.evalue })),
                Some(ReplItem::Died(_)) | None => return Err(QuietError::Died),
                Some(_) => {}
            }
        }
    };
    tokio::time::timeout(timeout, wait).await.map_err(|_| QuietError::TimedOut)?
}

/// Why a zygote could not be made (logged; the pool is an optimisation,
/// and a create without it is made the slow way).
#[derive(Debug, thiserror::Error)]
pub enum WarmError {
    #[error("the server is shutting down")]
    Closing,
    #[error("template `{0}` was deleted meanwhile")]
    Deleted(String),
    #[error("{0}")]
    Service(#[from] crate::error::Error),
    #[error("{0}")]
    Engine(#[from] jail::Error),
    #[error("{0}")]
    Repl(#[from] crate::sandbox::ReplError),
    #[error("preload: {0}")]
    Preload(QuietError),
    #[error("load the template's REPL state: {0}")]
    Thaw(QuietError),
}

/// Why code run where no one watches failed.
#[derive(Debug, thiserror::Error)]
pub enum QuietError {
    #[error("{0}")]
    Send(std::io::Error),
    #[error("{ename}: {evalue}")]
    Raised { ename: String, evalue: String },
    #[error("the REPL died")]
    Died,
    #[error("timed out")]
    TimedOut,
}
