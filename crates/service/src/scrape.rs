//! What `GET /metrics` answers: the counters kept as things happen
//! (metrics.rs), and the state read at scrape time rather than mirrored
//! (sandboxes by state, Spaces, checkpoints, memory, the volume).

use std::sync::atomic::Ordering;

use prometheus_client::metrics::counter::Counter;

use crate::error::Error;
use crate::metrics::{Kind, StateLabel};
use crate::state::Service;

impl Service {
    /// Every metric now, in the OpenMetrics text format.
    pub async fn metrics_text(&self) -> Result<String, Error> {
        let state = self;
        let m = &state.inner.metrics;
        let (mut by_state, mut checkpoints, mut restarts, mut ooms) = (std::collections::HashMap::<&str, i64>::new(), 0i64, 0u64, 0u64);
        for s in ["ready", "running", "paused"] {
            by_state.insert(s, 0);
        }
        {
            let all = state.inner.sandboxes.read().await;
            for e in all.values() {
                let lifecycle = e.lifecycle();
                // One on its way out is not counted (it leaves the registry next).
                if lifecycle != crate::lifecycle::Lifecycle::Destroyed {
                    *by_state.entry(lifecycle.as_str()).or_default() += 1;
                }
                checkpoints += e.checkpoints.lock().map(|c| c.len() as i64).unwrap_or(0);
                restarts += e.repl_restarts.load(Ordering::Relaxed);
                ooms += e.engine.oom_kills();
            }
        }
        for (s, n) in by_state {
            m.sandboxes.get_or_create(&StateLabel { state: s.to_string() }).set(n);
        }
        m.checkpoints.set(checkpoints);
        m.memory_bytes.set((state.memory_in_use_mib() << 20) as i64);
        let st = state.clone();
        let (spaces, volume) =
            tokio::task::spawn_blocking(move || (st.inner.spaces.list_all().len(), st.inner.engine.volume_usage().ok())).await.unwrap_or((0, None));
        m.spaces.set(spaces as i64);
        if let Some(v) = volume {
            for (kind, bytes) in [("size", v.size_bytes), ("free", v.free_bytes), ("max", v.max_bytes)] {
                m.volume_bytes.get_or_create(&Kind { kind: kind.to_string() }).set(bytes as i64);
            }
        }
        // Counters only go up: raise them to the current totals.
        let raise = |c: &Counter, total: u64| {
            let now = c.get();
            if total > now {
                c.inc_by(total - now);
            }
        };
        raise(&m.repl_restarts, restarts + m.gone_repl_restarts.load(Ordering::Relaxed));
        raise(&m.oom_kills, ooms + m.gone_oom_kills.load(Ordering::Relaxed));
        let mut body = String::new();
        prometheus_client::encoding::text::encode(&mut body, &m.registry).map_err(|e| Error::internal("encode the metrics", e))?;
        Ok(body)
    }
}
