//! Server settings: where it listens, where it keeps state, API keys, and the
//! defaults and caps applied to each sandbox.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub state_dir: PathBuf,
    /// Where built templates live (normally `<state_dir>/templates`).
    pub templates_dir: PathBuf,
    /// The Debian release the built-in templates are made from.
    pub debian: template::Debian,
    /// SHA-256 of the keys given with `--api-key` (the keys themselves are
    /// not kept); with none here and none in `<state>/keys.json`, no auth
    /// (only allowed on loopback). See src/keys.rs.
    pub api_keys: Vec<crate::keys::KeyHash>,
    /// Limits of the `--api-key` keys (the keys file has its own per key).
    pub key_limits: crate::keys::KeyLimits,
    pub limits: SandboxLimits,
    /// How the sandbox volume starts and grows (crates/jail/src/volume).
    pub volume: jail::volume::VolumeSize,
    /// The host CAs sandboxes trust: a directory of `*.crt` files or a PEM
    /// bundle (None: only each template's own; crates/jail/src/trust).
    pub host_cas: Option<PathBuf>,
    /// The operator's HTTP proxy: sandboxes with egress leave only through
    /// it (docs/network.md#upstream-proxies).
    pub egress_proxy: Option<std::sync::Arc<jail::egress::Upstream>>,
    /// Build the built-in templates at start.
    pub build_templates: bool,
    /// The executable that runs `__shim` (the server's own binary).
    pub shim_exe: PathBuf,
    /// Create sandboxes by forking a warm zygote per template (src/pool.rs).
    pub warm_pool: bool,
    /// A pool no create used for this long is let go (src/pool.rs; with
    /// keys every key has its own), but the default template's on a
    /// server without keys.
    pub pool_idle: Duration,
    /// Most warm pools at once (zygote and spares each, hidden from the
    /// memory cap); warming one more lets the least recently used go.
    pub max_pools: usize,
    /// Egress of sandboxes whose create does not say (docs/network.md).
    pub default_egress: bool,
    /// Pause sandboxes idle this long (docs/state.md); None: never.
    pub idle_pause: Option<std::time::Duration>,
    /// How long sandboxes outlive a server that died, for the next one to
    /// adopt them (docs/state.md#restarts); zero: they end with it.
    pub orphan_grace: Duration,
    /// On SIGTERM, how long running execs may go on before they are
    /// interrupted (src/drain.rs).
    pub drain: Duration,
    /// CPU weight multiplier of sandboxes that have been using little CPU;
    /// the others run in the idle scheduling class (src/cpu_boost.rs).
    /// 1: every sandbox weighs the same, none is idle-class.
    pub cpu_boost: u64,
    /// The criu freezes could keep every process with, or why there is none
    /// (docs/state.md#where-criu-comes-from).
    pub criu: criu::Readiness,
    /// Whether a `processes` Space resumes lazily (docs/state.md#lazy-resume).
    pub lazy_resume: bool,
    /// What this server's sandboxes are beyond it: a cluster node's
    /// registry, quotas and Spaces (src/directory.rs); alone by default.
    pub directory: DirectoryHandle,
    /// On a cluster node: the SHA-256 of the cluster secret, which every
    /// request must show (only gateways reach a node; docs/cluster.md).
    pub cluster_secret_sha256: Option<[u8; 32]>,
}

/// The directory in the configuration (it has no `Debug` of its own).
#[derive(Clone)]
pub struct DirectoryHandle(pub std::sync::Arc<dyn crate::directory::Directory>);

impl Default for DirectoryHandle {
    fn default() -> Self {
        DirectoryHandle(std::sync::Arc::new(crate::directory::Alone))
    }
}

impl std::fmt::Debug for DirectoryHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.counts_quotas() { "DirectoryHandle(cluster)" } else { "DirectoryHandle(alone)" })
    }
}

/// Defaults and caps for sandboxes.
#[derive(Debug, Clone)]
pub struct SandboxLimits {
    pub default_timeout: Duration,
    pub max_timeout: Duration,
    pub default_idle_timeout: Duration,
    pub max_idle_timeout: Duration,
    pub default_ram_mib: u64,
    pub min_ram_mib: u64,
    pub max_ram_mib: u64,
    pub default_rootfs_gb: u64,
    pub max_rootfs_gb: u64,
    pub pids: u64,
    pub default_exec_timeout: Duration,
    pub max_exec_timeout: Duration,
    /// How long an interrupted exec may take to stop before the REPL is killed.
    pub interrupt_grace: Duration,
    pub max_sandboxes: usize,
    /// Refuse creates and forks while the sandboxes' cgroups use this much
    /// memory (None: 90% of the host's memory).
    pub max_memory_mib: Option<u64>,
    /// Largest file one files-API upload may write.
    pub max_file_bytes: u64,
    /// Port proxy (src/ports.rs): connect timeout, time a service has to
    /// send its response headers, and open proxied connections per sandbox.
    pub port_connect_timeout: Duration,
    pub port_response_timeout: Duration,
    pub max_port_connections: usize,
    /// Checkpoints kept per sandbox (then 429).
    pub max_checkpoints: usize,
}

/// 90% of the host's memory, in MiB (the default memory cap).
pub fn default_memory_cap_mib() -> u64 {
    let total_kib: u64 = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("MemTotal:").and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())))
        .unwrap_or(8 << 20);
    total_kib / 1024 * 9 / 10
}

impl Default for SandboxLimits {
    fn default() -> Self {
        SandboxLimits {
            default_timeout: Duration::from_secs(3600),
            max_timeout: Duration::from_secs(24 * 3600),
            default_idle_timeout: Duration::from_secs(600),
            max_idle_timeout: Duration::from_secs(24 * 3600),
            default_ram_mib: 1024,
            min_ram_mib: 64,
            max_ram_mib: 16384,
            default_rootfs_gb: 4,
            max_rootfs_gb: 64,
            pids: 1024,
            default_exec_timeout: Duration::from_millis(300_000),
            max_exec_timeout: Duration::from_secs(24 * 3600),
            interrupt_grace: Duration::from_secs(2),
            max_sandboxes: 1000,
            max_memory_mib: None,
            max_file_bytes: 16 << 30,
            port_connect_timeout: Duration::from_secs(5),
            port_response_timeout: Duration::from_secs(60),
            max_port_connections: 256,
            max_checkpoints: 16,
        }
    }
}
