//! Prometheus metrics (docs/operations.md#metrics), in the OpenMetrics
//! text format, which the HTTP crate serves at `GET /metrics` behind the
//! API's auth like every route.
//! Operator-level: any key sees the whole server's numbers (not which
//! key's sandboxes they are).
//!
//! Request counts and latencies are recorded by a route layer (labelled
//! with the route's template, never the raw path, so ids do not explode
//! the series). State that lives elsewhere (sandboxes by state, Spaces,
//! checkpoints, memory) is read at scrape time rather than mirrored.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub method: String,
    pub route: String,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteOnly {
    pub method: String,
    pub route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Kind {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Direction {
    pub direction: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabel {
    pub limit: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: String,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// 1 ms .. ~65 s, doubling.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

pub struct Metrics {
    pub(crate) registry: Registry,
    requests: Family<RouteLabels, Counter>,
    request_seconds: Histograms<RouteOnly>,
    /// Whole execs, first byte in to `exit` out, by language.
    pub exec_seconds: Histograms<Kind>,
    /// Creates by how they were made (`pool` or `cold`).
    pub create_seconds: Histograms<Kind>,
    pub fork_seconds: Histogram,
    pub(crate) sandboxes: Family<StateLabel, Gauge>,
    pub(crate) spaces: Gauge,
    pub(crate) checkpoints: Gauge,
    pub(crate) memory_bytes: Gauge,
    /// The sandbox volume: its size, its free space and the size it may
    /// grow to (docs/operations.md#disk).
    pub(crate) volume_bytes: Family<Kind, Gauge>,
    /// Sandboxes whose CPU weight is raised for being quiet (src/cpu_boost.rs).
    pub cpu_boosted: Gauge,
    pub(crate) repl_restarts: Counter,
    pub(crate) oom_kills: Counter,
    /// Bytes through the files API, by `direction` (`in`: uploads,
    /// `out`: downloads, counted as they are sent).
    pub file_bytes: Family<Direction, Counter>,
    /// Sandboxes found at start, by `outcome` (`adopted`, `lost`).
    pub restart_sandboxes: Family<Outcome, Counter>,
    /// Creates and forks a key's quota refused, by `limit` (src/keys.rs).
    quota_refusals: Family<LimitLabel, Counter>,
    /// REPL restarts and OOM kills of sandboxes already destroyed (the
    /// live ones' are added at scrape time).
    pub gone_repl_restarts: AtomicU64,
    pub gone_oom_kills: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("forkbox");
        let requests = Family::<RouteLabels, Counter>::default();
        let request_seconds: Histograms<RouteOnly> = Family::new_with_constructor(latency);
        let exec_seconds: Histograms<Kind> = Family::new_with_constructor(latency);
        let create_seconds: Histograms<Kind> = Family::new_with_constructor(latency);
        let fork_seconds = latency();
        let sandboxes = Family::<StateLabel, Gauge>::default();
        let volume_bytes = Family::<Kind, Gauge>::default();
        let (spaces, checkpoints, memory_bytes, cpu_boosted) = (Gauge::default(), Gauge::default(), Gauge::default(), Gauge::default());
        let (repl_restarts, oom_kills) = (Counter::default(), Counter::default());
        let file_bytes = Family::<Direction, Counter>::default();
        let restart_sandboxes = Family::<Outcome, Counter>::default();
        let quota_refusals = Family::<LimitLabel, Counter>::default();
        for limit in [crate::keys::Limit::Sandboxes, crate::keys::Limit::ForksPerMinute, crate::keys::Limit::Memory] {
            let _ = quota_refusals.get_or_create(&LimitLabel { limit: limit.label().to_string() });
        }
        registry.register("http_requests", "HTTP requests by route template and status", requests.clone());
        registry.register("http_request_seconds", "Time to the response's headers, by route template", request_seconds.clone());
        registry.register("exec_seconds", "Whole execs, by language", exec_seconds.clone());
        registry.register("create_seconds", "Sandbox creates, by how they were made (pool, cold, space)", create_seconds.clone());
        registry.register("fork_seconds", "Forks (all children)", fork_seconds.clone());
        registry.register("sandboxes", "Live sandboxes by state", sandboxes.clone());
        registry.register("spaces", "Spaces on disk", spaces.clone());
        registry.register("checkpoints", "Checkpoints held", checkpoints.clone());
        registry.register("memory_bytes", "Memory the live sandboxes' cgroups use", memory_bytes.clone());
        registry.register("volume_bytes", "The sandbox volume, by kind: size, free, max (what it may grow to)", volume_bytes.clone());
        registry.register("cpu_boosted_sandboxes", "Live sandboxes whose CPU weight is raised for using little CPU", cpu_boosted.clone());
        registry.register("repl_restarts", "REPLs replaced after dying (state lost)", repl_restarts.clone());
        registry.register("oom_kills", "Processes killed by a sandbox's memory limit", oom_kills.clone());
        registry.register("file_bytes", "Bytes through the files API, by direction (in: uploads, out: downloads)", file_bytes.clone());
        registry.register("restart_sandboxes", "Sandboxes a previous server left, taken back at start (adopted) or not (lost)", restart_sandboxes.clone());
        registry.register("quota_refusals", "Creates and forks refused by an API key's quota, by limit", quota_refusals.clone());
        Metrics {
            registry,
            requests,
            request_seconds,
            exec_seconds,
            create_seconds,
            fork_seconds,
            sandboxes,
            spaces,
            checkpoints,
            memory_bytes,
            volume_bytes,
            cpu_boosted,
            repl_restarts,
            oom_kills,
            file_bytes,
            restart_sandboxes,
            quota_refusals,
            gone_repl_restarts: AtomicU64::new(0),
            gone_oom_kills: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    pub fn observe_exec(&self, language: &str, started: Instant) {
        self.exec_seconds.get_or_create(&Kind { kind: language.to_string() }).observe(started.elapsed().as_secs_f64());
    }

    pub fn observe_create(&self, how: &str, started: Instant) {
        self.create_seconds.get_or_create(&Kind { kind: how.to_string() }).observe(started.elapsed().as_secs_f64());
    }

    /// Count `n` sandboxes found at start with `outcome` (`adopted`, `lost`).
    pub fn restart_sandboxes(&self, outcome: &str, n: usize) {
        self.restart_sandboxes.get_or_create(&Outcome { outcome: outcome.to_string() }).inc_by(n as u64);
    }

    /// A key's quota refused a request (`limit`: which one).
    pub fn quota_refused(&self, limit: &str) {
        self.quota_refusals.get_or_create(&LimitLabel { limit: limit.to_string() }).inc();
    }

    /// The counter of files-API bytes going `direction` (`in` or `out`).
    pub fn file_bytes(&self, direction: &str) -> Counter {
        self.file_bytes.get_or_create(&Direction { direction: direction.to_string() }).clone()
    }

    /// A sandbox is going away: keep its counts in the totals.
    pub fn forget(&self, entry: &crate::sandbox::SandboxEntry) {
        self.gone_repl_restarts.fetch_add(entry.repl_restarts.load(Ordering::Relaxed), Ordering::Relaxed);
        self.gone_oom_kills.fetch_add(entry.engine.oom_kills(), Ordering::Relaxed);
    }
}

impl Metrics {
    /// Count and time a request to `route` (its template, never the raw path).
    pub fn observe_request(&self, method: String, route: String, status: u16, started: Instant) {
        self.request_seconds.get_or_create(&RouteOnly { method: method.clone(), route: route.clone() }).observe(started.elapsed().as_secs_f64());
        self.requests.get_or_create(&RouteLabels { method, route, status }).inc();
    }
}

/// The OpenMetrics text format's media type.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
