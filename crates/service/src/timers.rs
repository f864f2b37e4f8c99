//! The loops that run for as long as the server does: lifetimes and idle
//! timeouts (and idle pauses), hibernating sandboxes' lifetimes, and the
//! sweep of deleted subvolumes' quota groups.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::keys::Caller;
use crate::sandbox::SandboxEntry;
use crate::state::Service;
use repl_host::events::now_ms;

impl Service {
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

    /// Discard the hibernating sandboxes whose lifetime ended (they would
    /// wake only to be destroyed), every 30 s, forever. In a cluster every
    /// node looks at the store's, and one discards each.
    pub async fn hibernated_expiry_loop(self) {
        let mut tick = tokio::time::interval(Duration::from_secs(30));
        loop {
            tick.tick().await;
            let now = now_ms();
            let mut ended = self.hibernating_all(&Caller::server()).await;
            ended.retain(|m| m.sandbox.expires_at <= now);
            for meta in ended {
                let space = meta.info.space_id;
                match self.delete_space(&Caller::server(), &space).await {
                    Ok(()) => tracing::info!(space = %space, "a hibernating sandbox's lifetime ended: discarded"),
                    // Another node of the cluster discarded it first.
                    Err(Error::NotFound(_)) => {}
                    Err(e) => tracing::warn!(space = %space, err = %e, "could not discard a hibernating sandbox whose lifetime ended"),
                }
            }
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
                    // A persistent sandbox hibernates at its idle timeout; its
                    // lifetime's end destroys it like any other.
                    if now >= e.expires_at() && e.settings.pause_at_timeout {
                        // Paused below, not destroyed.
                        None
                    } else if now >= e.expires_at() {
                        Some((Arc::clone(e), false))
                    } else {
                        idle_out.then(|| (Arc::clone(e), e.settings.persistent))
                    }
                })
                .collect();
            let to_pause: Vec<Arc<SandboxEntry>> =
                self.inner.sandboxes.read().await.values().filter(|e| e.settings.pause_at_timeout && now >= e.expires_at()).cloned().collect();
            for entry in to_pause {
                // A hibernation takes a while: the timers go on meanwhile
                // (its lifetime is endless from now, so it is not picked again).
                let state = self.clone();
                tokio::spawn(async move { state.pause_at_lifetime_end(&entry).await });
            }
            for (entry, persistent) in expired {
                if persistent {
                    // A big freeze takes a while: the timers go on meanwhile,
                    // and the sandbox counts as busy so it is not picked again.
                    let busy = entry.hold_busy();
                    let state = self.clone();
                    tokio::spawn(async move {
                        state.hibernate_idle(&entry.id).await;
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
                    let _ = crate::sandbox::freezer::pause_idle(&e).await;
                }
            }
        }
    }
}

impl Service {
    /// End sandbox `id`'s lifetime `from_now` from now (capped at the
    /// server's longest lifetime), as E2B's `set_timeout` does.
    pub async fn set_timeout(&self, caller: &Caller, id: &str, from_now: Duration) -> Result<(), Error> {
        let entry = self.get(caller, id).await?;
        entry.set_expiry(from_now.min(self.inner.config.limits.max_timeout));
        self.inner.records.save(&entry);
        Ok(())
    }
}
