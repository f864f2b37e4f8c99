//! Interactive CPU boost: a sandbox that has been using little CPU gets a
//! higher CPU weight than one that is burning it (docs/reliability.md#noisy-neighbours).
//!
//! Why: every sandbox's cgroup has the same weight, so a quiet sandbox
//! that wakes for an exec queues beside ten hogs as their equal. The
//! scheduler already favours a sleeper over CPU-bound tasks *within* one
//! group, but between groups only their weights decide. With the boost,
//! a quiet sandbox's group outweighs every hog's, so its exec runs almost
//! as soon as it wakes (measured by bench/noisy.py).
//!
//! The boost is self-limiting: a sandbox keeps it only while it uses less
//! than `busy_cores` of a core in every tick, so it can never take more
//! than that share away from the others; one tick above it and the
//! sandbox is back at the ordinary weight until it has been calm for
//! `calm_for` again. Usage comes from the cgroup's CPU counter (v2
//! `cpu.stat`, v1 `cpuacct.usage`), which counts short-lived processes too.
//!
//! On a crowded host a hog that its neighbours hold under a quarter of a
//! core counts as quiet too (bench/noisy.py's memory and disk hogs, at
//! 0.16 cores each beside sixteen spinning processes). Counting run-queue
//! wait as use as well kept every hog at the ordinary weight, but doubled
//! the quiet sandbox's median exec there (6 ms against 2-3 ms), so CPU
//! time alone decides.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::sandbox::SandboxEntry;
use crate::state::AppState;

/// How often usage is sampled and weights revised.
pub const TICK: Duration = Duration::from_millis(200);

/// When a sandbox counts as quiet, and what that earns it.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// Weight multiplier of a quiet sandbox; 1 turns the boost off.
    pub factor: u64,
    /// A tick at or above this many cores (on average) is a busy one.
    pub busy_cores: f64,
    /// A busy sandbox is boosted again after this long without a busy tick.
    pub calm_for: Duration,
}

impl Policy {
    pub fn new(factor: u64) -> Policy {
        Policy { factor: factor.max(1), busy_cores: 0.25, calm_for: Duration::from_secs(1) }
    }
}

/// What the booster remembers of one sandbox between ticks.
#[derive(Debug, Clone, Copy)]
struct Track {
    usage_ns: u64,
    at: Instant,
    last_busy: Option<Instant>,
}

impl Track {
    /// Take a new usage sample; whether the sandbox is quiet now.
    fn sample(&mut self, policy: &Policy, usage_ns: u64, now: Instant) -> bool {
        let secs = now.duration_since(self.at).as_secs_f64();
        // A counter that went back (a v1 cgroup summing live processes
        // whose busiest one exited) says nothing about this tick.
        let used = usage_ns.saturating_sub(self.usage_ns) as f64 / 1e9;
        if secs > 0.0 && used / secs >= policy.busy_cores {
            self.last_busy = Some(now);
        }
        self.usage_ns = usage_ns;
        self.at = now;
        self.last_busy.is_none_or(|t| now.duration_since(t) >= policy.calm_for)
    }
}

/// The weight a sandbox with `base` weight should have now.
fn weight(policy: &Policy, base: u64, quiet: bool) -> u64 {
    if quiet {
        base.saturating_mul(policy.factor).min(10_000)
    } else {
        base
    }
}

/// Samples every live sandbox and sets its weight.
pub struct Booster {
    policy: Policy,
    tracks: HashMap<String, Track>,
}

impl Booster {
    pub fn new(policy: Policy) -> Booster {
        Booster { policy, tracks: HashMap::new() }
    }

    /// One tick over `live` (each sandbox and its base weight); how many are boosted.
    /// Blocking (cgroup files).
    fn tick(&mut self, live: &[(Arc<SandboxEntry>, u64)], now: Instant) -> usize {
        let mut boosted = 0;
        let mut seen = std::collections::HashSet::with_capacity(live.len());
        for (entry, base) in live {
            seen.insert(entry.id.as_str());
            let cgroup = entry.engine.cgroup();
            let usage = cgroup.cpu_usage_ns();
            let quiet = match self.tracks.get_mut(&entry.id) {
                Some(track) => track.sample(&self.policy, usage, now),
                None => {
                    // First sight: no rate yet. A new sandbox starts quiet
                    // (an agent's first call is what it waits on); a hog
                    // among them loses the boost at the next tick.
                    self.tracks.insert(entry.id.clone(), Track { usage_ns: usage, at: now, last_busy: None });
                    true
                }
            };
            let want = weight(&self.policy, *base, quiet);
            if want > *base {
                boosted += 1;
            }
            // Read back rather than remember: a create or a handed-out
            // spare writes the base weight without telling us.
            if cgroup.cpu_weight() != Some(want) && !entry.destroyed.load(Ordering::Relaxed) {
                if let Err(e) = cgroup.set_cpu_weight(want) {
                    tracing::debug!(sandbox = %entry.id, error = %e, "set cpu weight");
                }
            }
        }
        self.tracks.retain(|id, _| seen.contains(id.as_str()));
        boosted
    }
}

impl AppState {
    /// Revise the sandboxes' CPU weights every `TICK`, forever (a factor
    /// of 1 returns at once and leaves every weight as created).
    pub async fn cpu_boost_loop(self) {
        let policy = Policy::new(self.inner.config.cpu_boost);
        if policy.factor <= 1 {
            return;
        }
        let booster = Arc::new(std::sync::Mutex::new(Booster::new(policy)));
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let live: Vec<(Arc<SandboxEntry>, u64)> = {
                let all = self.inner.sandboxes.read().await;
                all.values().map(|e| (Arc::clone(e), self.limits_for(&e.settings).cpu_weight)).collect()
            };
            let booster = Arc::clone(&booster);
            let boosted = tokio::task::spawn_blocking(move || booster.lock().map(|mut b| b.tick(&live, Instant::now())).unwrap_or(0))
                .await
                .unwrap_or(0);
            self.inner.metrics.cpu_boosted.set(boosted as i64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(track: &mut Track, policy: &Policy, start: Instant, ms: u64, usage_ms: u64) -> bool {
        track.sample(policy, usage_ms * 1_000_000, start + Duration::from_millis(ms))
    }

    #[test]
    fn a_quiet_sandbox_is_boosted_and_a_busy_one_is_not_until_it_has_been_calm() {
        let policy = Policy::new(20);
        let start = Instant::now();
        let mut t = Track { usage_ns: 0, at: start, last_busy: None };
        // 10 ms of CPU in 200 ms: 0.05 cores, quiet.
        assert!(at(&mut t, &policy, start, 200, 10));
        // 60 ms in the next 200 ms: 0.3 cores, busy.
        assert!(!at(&mut t, &policy, start, 400, 70));
        // Calm again, but for less than `calm_for`: still not boosted.
        assert!(!at(&mut t, &policy, start, 600, 70));
        assert!(!at(&mut t, &policy, start, 1200, 71));
        // A full second after the busy tick: boosted.
        assert!(at(&mut t, &policy, start, 1400, 72));
    }

    #[test]
    fn the_edge_of_busy_is_busy() {
        let policy = Policy::new(20);
        let start = Instant::now();
        let mut t = Track { usage_ns: 0, at: start, last_busy: None };
        assert!(at(&mut t, &policy, start, 200, 49), "0.245 cores is quiet");
        assert!(!at(&mut t, &policy, start, 400, 99), "0.25 cores is busy");
    }

    #[test]
    fn a_counter_that_goes_back_counts_as_no_use() {
        let policy = Policy::new(20);
        let start = Instant::now();
        let mut t = Track { usage_ns: 500_000_000, at: start, last_busy: None };
        assert!(at(&mut t, &policy, start, 200, 100));
    }

    #[test]
    fn weights_are_multiplied_within_the_cgroup_range() {
        let policy = Policy::new(20);
        assert_eq!(weight(&policy, 100, true), 2000);
        assert_eq!(weight(&policy, 100, false), 100);
        assert_eq!(weight(&policy, 1000, true), 10_000);
        assert_eq!(weight(&Policy::new(0), 100, true), 100, "a factor below 1 is no boost");
    }
}
