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
//! A busy sandbox also runs in the idle scheduling class (`cpu.idle`,
//! Linux ≥ 5.15). Weights alone leave a waking quiet sandbox queued until
//! the running hog's slice ends, up to a scheduler tick; a waking task of a
//! non-idle group preempts an idle one at once. Busy sandboxes share the
//! CPU among themselves as before; beside a quiet one they get what it
//! leaves, which is all but a quarter of a core at most (bench/noisy.py).
//!
//! The boost is self-limiting: a sandbox keeps it only while it uses less
//! than `busy_cores` of a core in every tick (and little kernel time), so
//! it can never take more than that share away from the others; one tick
//! above it and the sandbox is busy until it has spent `calm_for` under
//! the lower `calm_cores` (a hog that its neighbours hold under a quarter
//! of a core has not calmed down). Usage comes from the cgroup's CPU
//! counters (v2 `cpu.stat`, v1 `cpuacct`), which count short-lived
//! processes too. Counting run-queue wait as use as well (tried) doubled
//! the quiet sandbox's median exec beside hogs, so CPU time alone decides.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::sandbox::SandboxEntry;
use crate::state::Service;

/// How often usage is sampled and weights revised.
pub const TICK: Duration = Duration::from_millis(200);

/// When a sandbox counts as quiet, and what that earns it.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// Weight multiplier of a quiet sandbox; 1 turns the boost off.
    pub factor: u64,
    /// A tick at or above this many cores (on average) makes a quiet sandbox busy.
    pub busy_cores: f64,
    /// ... as does kernel time at this many cores, averaged over about a
    /// second (`KERNEL_SMOOTHING`; the kernel counts it in whole scheduler
    /// ticks, 4 ms at HZ=250, so one tick says little). What a process
    /// does in the kernel (writes, fsync, page faults) runs to the end of
    /// a stretch before anything else gets the CPU on kernels without full
    /// preemption, whatever the weights.
    pub busy_kernel_cores: f64,
    /// A busy sandbox is boosted again after `calm_for` of ticks each
    /// under this many cores (and under `busy_kernel_cores`). Lower than
    /// `busy_cores`: a hog that the idle class holds at a fifth of a core
    /// beside its neighbours has not calmed down.
    pub calm_cores: f64,
    pub calm_for: Duration,
}

impl Policy {
    pub fn new(factor: u64) -> Policy {
        Policy { factor: factor.max(1), busy_cores: 0.25, busy_kernel_cores: 0.05, calm_cores: 0.1, calm_for: Duration::from_secs(1) }
    }
}

/// Weight of the newest tick in the moving average of kernel time: about
/// a second's worth of ticks carries it.
const KERNEL_SMOOTHING: f64 = 0.2;

/// What the booster remembers of one sandbox between ticks.
#[derive(Debug, Clone, Copy)]
struct Track {
    times: jail::cgroup::CpuTimes,
    at: Instant,
    last_busy: Option<Instant>,
    /// Moving average of the cores spent in the kernel.
    kernel_cores: f64,
}

impl Track {
    fn new(times: jail::cgroup::CpuTimes, at: Instant) -> Track {
        Track { times, at, last_busy: None, kernel_cores: 0.0 }
    }

    /// Take a new sample of the cgroup's CPU times; whether the sandbox is quiet now.
    fn sample(&mut self, policy: &Policy, times: jail::cgroup::CpuTimes, now: Instant) -> bool {
        let secs = now.duration_since(self.at).as_secs_f64();
        let busy = self.last_busy.is_some_and(|t| now.duration_since(t) < policy.calm_for);
        // A counter that went back (a v1 cgroup summing live processes
        // whose busiest one exited) says nothing about this tick.
        if secs > 0.0 {
            let cores = times.total_ns.saturating_sub(self.times.total_ns) as f64 / 1e9 / secs;
            let kernel = times.system_ns.saturating_sub(self.times.system_ns) as f64 / 1e9 / secs;
            self.kernel_cores += (kernel - self.kernel_cores) * KERNEL_SMOOTHING;
            let limit = if busy { policy.calm_cores } else { policy.busy_cores };
            // At a limit is over it (the tolerance is for the float division).
            let over = |x: f64, limit: f64| x >= limit - 1e-9;
            if over(cores, limit) || over(self.kernel_cores, policy.busy_kernel_cores) {
                self.last_busy = Some(now);
            }
        }
        self.times = times;
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

/// Give a sandbox's cgroup what its state earns. A busy sandbox runs in the
/// idle scheduling class where the kernel has one: whatever wakes in a quiet
/// sandbox then preempts it at once, instead of waiting out its slice (up to
/// a tick, 4 ms at HZ=250); busy sandboxes still share the CPU fairly among
/// themselves. Elsewhere it just has the ordinary weight. Weights are read
/// back rather than remembered: a create or a handed-out spare writes the
/// base weight without telling the booster.
fn apply(cgroup: &jail::cgroup::Cgroup, quiet: bool, weight: u64) -> jail::Result<()> {
    let idle = cgroup.cpu_idle();
    if idle == Some(quiet) {
        cgroup.set_cpu_idle(!quiet)?;
    }
    if (idle.is_none() || quiet) && cgroup.cpu_weight() != Some(weight) {
        cgroup.set_cpu_weight(weight)?;
    }
    Ok(())
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
            // An engine without cgroups has nothing to boost.
            let Some(cgroup) = entry.engine.cgroup() else { continue };
            let times = cgroup.cpu_times();
            let quiet = match self.tracks.get_mut(&entry.id) {
                Some(track) => track.sample(&self.policy, times, now),
                None => {
                    // First sight: no rate yet. A new sandbox starts quiet
                    // (an agent's first call is what it waits on); a hog
                    // among them loses the boost at the next tick.
                    self.tracks.insert(entry.id.clone(), Track::new(times, now));
                    true
                }
            };
            let want = weight(&self.policy, *base, quiet);
            if want > *base {
                boosted += 1;
            }
            if entry.is_destroyed() {
                continue;
            }
            if let Err(e) = apply(cgroup, quiet, want) {
                tracing::debug!(sandbox = %entry.id, error = %e, "set cpu weight or idle class");
            }
        }
        self.tracks.retain(|id, _| seen.contains(id.as_str()));
        boosted
    }
}

impl Service {
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
            let boosted = tokio::task::spawn_blocking(move || booster.lock().map(|mut b| b.tick(&live, Instant::now())).unwrap_or(0)).await.unwrap_or(0);
            self.inner.metrics.cpu_boosted.set(boosted as i64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(total: u64, kernel: u64) -> jail::cgroup::CpuTimes {
        jail::cgroup::CpuTimes { total_ns: total * 1_000_000, system_ns: kernel * 1_000_000 }
    }

    /// Sample at `after_ms` after `start`, the cgroup having used `usage_ms` of CPU in all, none in the kernel.
    fn at(track: &mut Track, policy: &Policy, start: Instant, after_ms: u64, usage_ms: u64) -> bool {
        track.sample(policy, ms(usage_ms, 0), start + Duration::from_millis(after_ms))
    }

    #[test]
    fn a_quiet_sandbox_is_boosted_and_a_busy_one_is_not_until_it_has_been_calm() {
        let policy = Policy::new(20);
        let start = Instant::now();
        let mut t = Track::new(ms(0, 0), start);
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
        let mut t = Track::new(ms(0, 0), start);
        assert!(at(&mut t, &policy, start, 200, 49), "0.245 cores is quiet");
        assert!(!at(&mut t, &policy, start, 400, 99), "0.25 cores is busy");
    }

    #[test]
    fn a_busy_sandbox_held_under_a_quarter_of_a_core_stays_busy_until_under_a_tenth() {
        let policy = Policy::new(20);
        let start = Instant::now();
        let mut t = Track::new(ms(0, 0), start);
        assert!(!at(&mut t, &policy, start, 200, 60), "0.3 cores: busy");
        // 0.2 cores a tick for two seconds: would be quiet, is still busy.
        let mut used = 60;
        for tick in 2..=11 {
            used += 40;
            assert!(!at(&mut t, &policy, start, tick * 200, used), "tick {tick}: 0.2 cores after a busy spell");
        }
        // Then 0.095 cores a tick: boosted once a second of that has passed.
        for tick in 12..=16 {
            used += 19;
            assert_eq!(at(&mut t, &policy, start, tick * 200, used), tick == 16, "tick {tick}");
        }
        // 0.1 cores on the next tick is not calm enough once busy, but
        // makes no quiet sandbox busy.
        assert!(at(&mut t, &policy, start, 17 * 200, used + 20));
    }

    #[test]
    fn kernel_time_averaging_a_twentieth_of_a_core_makes_a_sandbox_busy_and_one_tick_of_it_does_not() {
        let policy = Policy::new(20);
        let start = Instant::now();
        let tick = |n: u64| start + Duration::from_millis(200 * n);
        // One tick of 40 ms in the kernel (0.2 cores), then none: quiet.
        let mut t = Track::new(ms(0, 0), start);
        assert!(t.sample(&policy, ms(40, 40), tick(1)));
        for n in 2..=10 {
            assert!(t.sample(&policy, ms(40, 40), tick(n)), "tick {n}");
        }
        // 0.06 cores in the kernel, tick after tick (under a quarter in all): busy within two seconds.
        let mut t = Track::new(ms(0, 0), start);
        let busy_at = (1..=10).find(|&n| !t.sample(&policy, ms(12 * n, 12 * n), tick(n)));
        assert!(busy_at.is_some_and(|n| n >= 5), "{busy_at:?}");
        // 0.045 cores in the kernel for ever: quiet.
        let mut t = Track::new(ms(0, 0), start);
        for n in 1..=50 {
            assert!(t.sample(&policy, ms(9 * n, 9 * n), tick(n)), "tick {n}");
        }
    }

    #[test]
    fn a_counter_that_goes_back_counts_as_no_use() {
        let policy = Policy::new(20);
        let start = Instant::now();
        let mut t = Track::new(ms(500, 100), start);
        assert!(t.sample(&policy, ms(100, 10), start + Duration::from_millis(200)));
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
