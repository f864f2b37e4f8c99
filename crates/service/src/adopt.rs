//! Sandboxes that outlive the server (docs/state.md#restarts). At start,
//! before serving, the server reads the records its predecessor kept
//! (src/records.rs), has the engine take back every member whose family
//! still runs (`Engine::take_over`), finds its place in each REPL's
//! stream again (`ReplSession::resume`), and starts each network afresh.
//! A sandbox that could not be taken back is *lost*: its id answers 404
//! saying so, and what it used is freed.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::records::SandboxRecord;
use crate::sandbox::{entry_with, ReplSlot, SandboxEntry};
use crate::state::Service;
use repl_host::session::ReplSession;

/// Most lost ids remembered (for their 404's message).
const LOST_REMEMBERED: usize = 10_000;

impl Service {
    /// Remove the trust layers no live sandbox stands on (made for CAs or
    /// templates since changed); the adopted keep theirs.
    pub async fn sweep_trust_layers(&self) {
        let keep: Vec<std::path::PathBuf> = self.inner.sandboxes.read().await.values().filter_map(|e| e.engine.record().family.trust_layer).collect();
        let state = self.clone();
        let _ = tokio::task::spawn_blocking(move || state.inner.trust.sweep(&keep)).await;
    }

    /// Take back what a previous server on this state directory left
    /// running, then clean up everything else it left. Returns how many
    /// sandboxes were adopted and how many were lost.
    pub async fn adopt_survivors(&self) -> jail::Result<(usize, usize)> {
        let mut records = self.inner.records.load();
        // A freeze that finished before the crash left its Space: the
        // sandbox lives on as that, not twice.
        let mut frozen = Vec::new();
        for r in &records {
            if matches!(self.frozen(&crate::keys::Caller::server(), &r.id).await, Some(crate::state::Frozen::Space(_))) {
                frozen.push(r.id.clone());
            }
        }
        records.retain(|r| !frozen.contains(&r.id));
        for id in &frozen {
            self.inner.records.remove(id);
        }
        let members: Vec<jail::MemberRecord> = records
            .iter()
            .map(|r| {
                let mut engine = r.engine.clone();
                // A record from a server before disk quotas has none.
                if engine.limits.disk_bytes == 0 {
                    engine.limits.disk_bytes = r.rootfs_gb << 30;
                }
                engine
            })
            .collect();
        let results = self.inner.engine.take_over(&members).await?;
        let mut taken = Vec::new();
        let mut lost = 0;
        for (record, result) in records.into_iter().zip(results) {
            match result {
                Ok(adopted) => taken.push((record, adopted)),
                Err(e) => {
                    lost += 1;
                    self.lose(&record.id, &e.to_string(), record.owner.clone());
                }
            }
        }
        let entries = futures::future::join_all(taken.into_iter().map(|(record, adopted)| self.readopt(record, adopted))).await;
        // Recorded again beyond this server (a cluster node's registry);
        // those it gave up meanwhile are lost here too.
        let records: Vec<crate::directory::Registered> = entries.iter().map(|e| crate::create::registered(e)).collect();
        let given_up = self.inner.directory.readopt(&records).await;
        let (entries, gone): (Vec<_>, Vec<_>) = entries.into_iter().partition(|e| !given_up.contains(&e.id));
        for entry in gone {
            lost += 1;
            self.lose(&entry.id, "its node was taken for lost while the server was away", entry.settings.owner.clone());
            self.teardown(&entry).await;
        }
        let count = entries.len();
        for entry in entries {
            self.inner.sandboxes.write().await.insert(entry.id.clone(), Arc::clone(&entry));
            self.inner.capacity.registered(1);
            // It counts against its key's quotas again, even over them.
            if let Some(owner) = &entry.settings.owner {
                self.inner.quotas.charge(owner, entry.settings.ram_mib);
            }
            let egress = entry.egress.lock().unwrap_or_else(|e| e.into_inner()).clone();
            crate::sandbox::network::apply_soon(&entry, egress).await;
        }
        self.inner.metrics.restart_sandboxes("adopted", count);
        self.inner.metrics.restart_sandboxes("lost", lost);
        Ok((count, lost))
    }

    /// Exit without ending the sandboxes (an upgrade): the warm pool goes
    /// (it is not recorded), everything else waits for the next server.
    pub async fn leave_running(&self) {
        self.destroy_pool().await;
        self.inner.engine.leave_running();
    }

    /// Remember that `id` (of `owner`) is gone for good, and why.
    fn lose(&self, id: &str, why: &str, owner: Option<String>) {
        tracing::warn!(sandbox = %id, reason = %why, "a sandbox did not survive the server restart");
        self.inner.records.remove(id);
        let (directory, gone, whose) = (Arc::clone(&self.inner.directory), id.to_string(), owner.clone());
        tokio::spawn(async move { directory.unregister(&gone, whose.as_deref()).await });
        if let Ok(mut lost) = self.inner.lost.lock() {
            if lost.len() >= LOST_REMEMBERED {
                lost.clear();
            }
            lost.insert(id.to_string(), (why.to_string(), owner));
        }
    }

    /// The entry of an adopted member: its settings, lifetime and lineage
    /// from the record, its REPL resumed where it was.
    async fn readopt(&self, record: SandboxRecord, adopted: crate::engine::Adoption) -> Arc<SandboxEntry> {
        let mut slot = ReplSlot { oom_seen: adopted.member.oom_kills(), ..ReplSlot::empty(true) };
        // A paused sandbox's REPL cannot answer: it runs just long enough.
        let paused = adopted.member.is_paused();
        if paused {
            let _ = adopted.member.resume();
        }
        let resumed = match adopted.repl {
            Some(process) => Some(ReplSession::resume(process).await),
            None => None,
        };
        // Paused by a freeze the crash cut short, it runs again; paused by
        // its client, it stays paused.
        if paused && record.freezing {
            tracing::info!(sandbox = %record.id, "a freeze had paused it when the server stopped: it runs again");
        } else if paused {
            if let Err(e) = adopted.member.pause() {
                tracing::warn!(sandbox = %record.id, error = %e, "could not pause an adopted sandbox again");
            }
        }
        match resumed {
            Some(resumed) => match resumed {
                Ok(resumed) => {
                    slot.session = Some(resumed.session);
                    if resumed.interrupted {
                        slot.notice = Some("[forkbox] the server restarted while code was running in this sandbox; that run was interrupted (its output is lost), the REPL's state is kept".into());
                    }
                }
                Err(e) => slot.lost_state = Some(format!("did not survive the server restart ({e})")),
            },
            None => slot.lost_state = Some("ended while the server was restarting".into()),
        }
        let entry = entry_with(record.id.clone(), record.settings(&self.inner.setup), adopted.member, record.lineage.clone(), record.created_at, slot);
        entry.execs.store(record.execs, Ordering::Relaxed);
        entry.repl_restarts.store(record.repl_restarts, Ordering::Relaxed);
        if let Some(at) = record.expires_at {
            entry.set_expires_at(at);
        }
        *entry.egress.lock().unwrap_or_else(|e| e.into_inner()) = record.egress.clone();
        tracing::info!(sandbox = %record.id, "adopted after a server restart");
        if record.freezing {
            self.inner.records.save(&entry);
        }
        Arc::new(entry)
    }
}
