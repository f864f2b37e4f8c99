//! `forkbox`: the server and its command-line client in one binary.

mod client;
mod node;
mod recipe_file;
mod tools_root;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "forkbox", version, about = "Self-hosted sandboxes for AI agents, with a persistent Python REPL you can fork")]
struct Cli {
    /// Log format on stderr: `text`, or `json` (one object per line, with
    /// each request's id and trace id; docs/operations.md#logs).
    #[arg(long, global = true, env = "FORKBOX_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the HTTP server (builds missing built-in templates first).
    Serve(Box<ServeArgs>),
    /// Manage templates (root filesystems sandboxes start from).
    Template {
        #[command(subcommand)]
        command: TemplateCommand,
    },
    /// Roots of host tools the server runs; today criu, for freezes that
    /// keep every process (docs/state.md#where-criu-comes-from).
    Tools {
        #[command(subcommand)]
        command: ToolsCommand,
    },
    /// Run code in a sandbox and print its output (exit code = the code's).
    Run(RunArgs),
    /// List live sandboxes.
    Ls(ClientArgs),
    /// Live sandboxes with their CPU and memory, busiest first, redrawn.
    Top {
        #[command(flatten)]
        client: ClientArgs,
        /// Seconds between readings.
        #[arg(long, default_value_t = 2.0)]
        interval: f64,
        /// Print one table (after one interval) and exit.
        #[arg(long)]
        once: bool,
    },
    /// Destroy sandboxes.
    Rm {
        #[command(flatten)]
        client: ClientArgs,
        /// Sandbox ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Manage API keys in <state-dir>/keys.json, or a cluster's with
    /// --cluster-etcd (stored as hashes; docs/operations.md#api-keys).
    Key {
        #[command(subcommand)]
        command: KeyCommand,
        #[arg(long, env = "FORKBOX_STATE_DIR", default_value = "/var/lib/forkbox", global = true)]
        state_dir: PathBuf,
        /// A cluster's etcd endpoints: manage its keys instead.
        #[arg(long = "cluster-etcd", env = "FORKBOX_CLUSTER_ETCD", value_delimiter = ',', global = true)]
        cluster_etcd: Vec<String>,
        #[arg(long = "cluster-prefix", env = "FORKBOX_CLUSTER_PREFIX", default_value = "/forkbox", global = true)]
        cluster_prefix: String,
    },
    /// The stateless front of a cluster: serves every API forkbox speaks
    /// and routes each call to the node that holds its sandbox (docs/cluster.md).
    Gateway(GatewayArgs),
    /// A cluster's nodes, and draining one (docs/cluster.md).
    Node {
        #[command(subcommand)]
        command: NodeCommand,
    },
    /// MCP server for models, a client of a running forkbox server (docs/mcp.md).
    Mcp(McpArgs),
    /// The per-family supervisor (started by the server; not for humans).
    #[command(name = "__shim", hide = true)]
    Shim { config: String },
}

#[derive(Subcommand)]
enum TemplateCommand {
    /// Build a built-in template (`default`, `python-datasci`) here if its
    /// recipe changed, or have the server build a custom one from a TOML
    /// recipe file (a path: it has a `/`, ends in `.toml` or exists).
    Build {
        /// A built-in template's name, or the path of a recipe file.
        #[arg(value_name = "NAME|PATH")]
        name: String,
        /// Where a built-in is built.
        #[arg(long, env = "FORKBOX_STATE_DIR", default_value = "/var/lib/forkbox")]
        state_dir: PathBuf,
        #[command(flatten)]
        debian: DebianArg,
        /// The server a recipe file is sent to.
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List built-in templates and the versions built on disk.
    Ls {
        #[arg(long, env = "FORKBOX_STATE_DIR", default_value = "/var/lib/forkbox")]
        state_dir: PathBuf,
        #[command(flatten)]
        debian: DebianArg,
    },
    /// List the server's templates (built-in and custom).
    List(ClientArgs),
    /// Print what the server knows of a template, as JSON.
    Show {
        #[command(flatten)]
        client: ClientArgs,
        name: String,
    },
    /// Delete custom templates from the server (409 while in use, unless --force).
    Rm {
        #[command(flatten)]
        client: ClientArgs,
        /// Delete even while sandboxes, Spaces or templates depend on it.
        #[arg(long)]
        force: bool,
        #[arg(required = true)]
        names: Vec<String>,
    },
}

#[derive(Subcommand)]
enum ToolsCommand {
    /// Build tools root NAME (`criu`) under <state-dir>/tools unless it is
    /// built for its recipe; prints its path.
    Build {
        name: String,
        #[arg(long, env = "FORKBOX_STATE_DIR", default_value = "/var/lib/forkbox")]
        state_dir: PathBuf,
    },
    /// Say which criu a server here would use, or why none (exit 1).
    Check {
        #[arg(long, env = "FORKBOX_STATE_DIR", default_value = "/var/lib/forkbox")]
        state_dir: PathBuf,
    },
}

/// `--debian`, which `serve`, `template build` and `template ls` share.
#[derive(Args)]
struct DebianArg {
    /// The Debian release the built-in templates are made from: 13 (trixie:
    /// Python 3.13, numpy 2, pandas 2) or 12 (bookworm: Python 3.11, numpy
    /// 1.24, pandas 1.5). What was made on the other stays as it was.
    #[arg(long = "debian", env = "FORKBOX_DEBIAN", default_value = "13", value_parser = parse_debian)]
    release: template::Debian,
}

fn parse_debian(raw: &str) -> Result<template::Debian, String> {
    raw.parse().map_err(|e: template::TemplateError| e.to_string())
}

fn parse_egress_proxy(raw: &str) -> Result<egress_proxy::Upstream, String> {
    raw.parse().map_err(|e: egress_proxy::UpstreamError| e.to_string())
}

/// Whether `template build`'s argument is a recipe file rather than a
/// built-in's name: a built-in's name wins over a file of that name.
fn is_recipe_path(arg: &str) -> bool {
    arg.contains('/') || arg.ends_with(".toml") || (template::builtin(arg).is_none() && std::path::Path::new(arg).is_file())
}

#[derive(Args)]
struct GatewayArgs {
    /// Address to listen on.
    #[arg(long, env = "FORKBOX_LISTEN", default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    #[command(flatten)]
    cluster: node::ClusterArgs,
}

#[derive(Subcommand)]
enum NodeCommand {
    /// The cluster's nodes with their load.
    List(ClientArgs),
    /// Move every sandbox off a node (frozen and resumed under the same id
    /// on others); it takes no new work after (docs/cluster.md#drain).
    Drain {
        #[command(flatten)]
        client: ClientArgs,
        /// The node's name (`forkbox node list`).
        node: String,
        /// The cluster secret's file: draining is an operator's.
        #[arg(long = "cluster-secret-file", env = "FORKBOX_CLUSTER_SECRET_FILE")]
        secret_file: PathBuf,
    },
    /// Let a drained node take new work again.
    Undrain {
        #[command(flatten)]
        client: ClientArgs,
        node: String,
        #[arg(long = "cluster-secret-file", env = "FORKBOX_CLUSTER_SECRET_FILE")]
        secret_file: PathBuf,
    },
}

#[derive(Subcommand)]
enum KeyCommand {
    /// Add a key and print it (once: only its hash is kept).
    Add {
        /// The key's name (owns its sandboxes and Spaces).
        name: String,
        #[command(flatten)]
        limits: KeyLimitArgs,
    },
    /// List the keys' names and limits (never the keys).
    List,
    /// Remove a key: it gets 401 from then on (its sandboxes run on
    /// until they expire).
    Remove { name: String },
}

#[derive(Args)]
struct KeyLimitArgs {
    /// Most live sandboxes (fork children count) [default: unlimited].
    #[arg(long)]
    max_sandboxes: Option<u64>,
    /// Most fork children per sliding minute [default: unlimited].
    #[arg(long)]
    forks_per_minute: Option<u64>,
    /// Most memory in all, as the sum of its live sandboxes' `ram_mib` (MiB) [default: unlimited].
    #[arg(long)]
    max_memory_mib: Option<u64>,
}

impl KeyLimitArgs {
    fn limits(&self) -> server::keys::KeyLimits {
        server::keys::KeyLimits { max_sandboxes: self.max_sandboxes, forks_per_minute: self.forks_per_minute, max_memory_mib: self.max_memory_mib }
    }
}

#[derive(Args)]
struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "FORKBOX_LISTEN", default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    /// Where templates, the sandbox volume and run files live.
    #[arg(long, env = "FORKBOX_STATE_DIR", default_value = "/var/lib/forkbox")]
    state_dir: PathBuf,
    /// Where templates are built and cached (default: <state-dir>/templates).
    #[arg(long, env = "FORKBOX_TEMPLATES_DIR")]
    templates_dir: Option<PathBuf>,
    /// Where tools roots are built (`forkbox tools build criu`; default:
    /// <state-dir>/tools); a host criu >= 4.2 is used before them.
    #[arg(long, env = "FORKBOX_TOOLS_DIR")]
    tools_dir: Option<PathBuf>,
    #[command(flatten)]
    debian: DebianArg,
    /// Accepted bearer API key (repeat, or comma-separate in the env var);
    /// hashed at start. Keys of <state-dir>/keys.json are accepted too.
    #[arg(long = "api-key", env = "FORKBOX_API_KEYS", value_delimiter = ',')]
    api_keys: Vec<String>,
    /// Limits of the --api-key keys: most live sandboxes [default: unlimited].
    #[arg(long)]
    key_max_sandboxes: Option<u64>,
    /// Limits of the --api-key keys: most fork children per minute [default: unlimited].
    #[arg(long)]
    key_forks_per_minute: Option<u64>,
    /// Limits of the --api-key keys: most memory, as the sum of their live
    /// sandboxes' `ram_mib` (MiB) [default: unlimited].
    #[arg(long)]
    key_max_memory_mib: Option<u64>,
    /// Do not build missing built-in templates at start.
    #[arg(long)]
    no_build_templates: bool,
    /// Largest size the sandbox volume grows to (GiB; docs/operations.md#disk).
    #[arg(long, env = "FORKBOX_VOLUME_GIB", default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    volume_gib: u64,
    /// Size of a new sandbox volume image; it grows from there (GiB).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    volume_initial_gib: u64,
    /// Free space the volume leaves on the disk under the state directory
    /// (GiB) [default: 5% of that disk, between 1 and 16].
    #[arg(long, env = "FORKBOX_DISK_RESERVE_GIB")]
    disk_reserve_gib: Option<u64>,
    /// Default sandbox lifetime (seconds).
    #[arg(long, default_value_t = 3600)]
    default_timeout: u64,
    /// Longest sandbox lifetime a client may ask for (seconds).
    #[arg(long, default_value_t = 86400)]
    max_timeout: u64,
    /// Default idle timeout (seconds without an exec).
    #[arg(long, default_value_t = 600)]
    default_idle_timeout: u64,
    /// Longest idle timeout a client may ask for (seconds).
    #[arg(long, default_value_t = 86400)]
    max_idle_timeout: u64,
    /// Default memory limit per sandbox (MiB).
    #[arg(long, default_value_t = 1024)]
    default_ram_mib: u64,
    /// Largest memory limit a client may ask for (MiB).
    #[arg(long, default_value_t = 16384)]
    max_ram_mib: u64,
    /// Most processes per sandbox.
    #[arg(long, default_value_t = 1024)]
    pids_limit: u64,
    /// Most live sandboxes (creates and fork children beyond it answer 429).
    #[arg(long, default_value_t = 1000)]
    max_sandboxes: usize,
    /// Refuse creates and forks (429) while sandboxes use this much memory
    /// in all, MiB [default: 90% of the host's memory].
    #[arg(long)]
    max_memory_mib: Option<u64>,
    /// Egress of sandboxes whose create does not say: true (the internet,
    /// through pasta) or false (loopback only).
    #[arg(long, env = "FORKBOX_DEFAULT_EGRESS", default_value_t = true, action = clap::ArgAction::Set)]
    default_egress: bool,
    /// CAs every sandbox and template build trusts beside its template's
    /// own: a directory of `*.crt` files (as update-ca-certificates reads
    /// it) or a PEM bundle (docs/network.md#host-cas).
    #[arg(long, env = "FORKBOX_HOST_CAS", default_value = "/usr/local/share/ca-certificates")]
    host_cas: PathBuf,
    /// Sandboxes trust only their template's CAs, none of the host's.
    #[arg(long)]
    no_host_cas: bool,
    /// An HTTP proxy, `http://[user:password@]host:port`, that sandboxes
    /// with egress reach the network through (and nothing else); the
    /// credentials stay in the server (docs/network.md#upstream-proxies).
    #[arg(long, env = "FORKBOX_EGRESS_PROXY", value_parser = parse_egress_proxy)]
    egress_proxy: Option<egress_proxy::Upstream>,
    /// Pause sandboxes after this many seconds without activity (0: never);
    /// the next call resumes them.
    #[arg(long, default_value_t = 0)]
    idle_pause_seconds: u64,
    /// CPU weight multiplier of sandboxes using under a quarter of a core;
    /// those using more run in the idle scheduling class
    /// (docs/reliability.md#noisy-neighbours): a quiet sandbox's execs
    /// run ahead of busy neighbours'. 1 turns both off.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=100))]
    cpu_boost: u64,
    /// Resume `processes` Spaces reading every page before the sandbox
    /// answers. By default they resume lazily where they can (criu's lazy
    /// pages: the tools root's criu and /dev/userfaultfd) and answer before
    /// their memory is all in (docs/state.md#lazy-resume).
    #[arg(long, env = "FORKBOX_EAGER_RESUME")]
    eager_resume: bool,
    /// Join a cluster as one of its nodes (docs/cluster.md).
    #[command(flatten)]
    node: node::NodeArgs,
    /// Largest file one files-API upload may write (MiB).
    #[arg(long, default_value_t = 16384)]
    max_file_mib: u64,
    /// Port proxy: how long connecting to a sandbox's port may take (ms).
    #[arg(long, default_value_t = 5000)]
    port_connect_timeout_ms: u64,
    /// Port proxy: how long a service may take to send its response headers
    /// once the request is sent (ms; then 504).
    #[arg(long, default_value_t = 60_000)]
    port_response_timeout_ms: u64,
    /// Port proxy: most open proxied connections per sandbox (then 429).
    #[arg(long, default_value_t = 256)]
    max_port_connections: usize,
    /// Most checkpoints kept per sandbox (then 429; docs/state.md).
    #[arg(long, default_value_t = 16)]
    max_checkpoints: usize,
    /// How long sandboxes outlive a server that dies (or exits with
    /// SIGUSR2 for an upgrade), waiting for the next server on the same
    /// state directory to adopt them (seconds; 0: they end with it).
    #[arg(long, env = "FORKBOX_ORPHAN_GRACE_SECONDS", default_value_t = 300)]
    orphan_grace_seconds: u64,
    /// On SIGTERM: refuse new requests (503) and let running execs finish
    /// for this long before interrupting them (seconds).
    #[arg(long, env = "FORKBOX_DRAIN_SECONDS", default_value_t = 30)]
    drain_seconds: u64,
    /// Create every sandbox the slow way instead of forking a warm,
    /// pre-imported zygote of its template (docs/fork.md).
    #[arg(long)]
    no_warm_pool: bool,
    /// Let a template's warm zygote go after this many seconds without a
    /// create (with API keys each key has its own; docs/fork.md#the-warm-pool).
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    pool_idle_seconds: u64,
    /// Most warm pools (a zygote and its spares, per template and key) at
    /// once; warming one more lets the least recently used go.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    max_warm_pools: u64,
    /// Default exec timeout (milliseconds).
    #[arg(long, default_value_t = 300_000)]
    exec_timeout_ms: u64,
    /// Grace period between interrupting a timed-out exec and killing the REPL (ms).
    #[arg(long, default_value_t = 2000)]
    interrupt_grace_ms: u64,
}

#[derive(Args, Clone)]
struct ClientArgs {
    /// Server URL.
    #[arg(long, env = "FORKBOX_URL", default_value = "http://127.0.0.1:7070")]
    url: String,
    /// API key.
    #[arg(long, env = "FORKBOX_API_KEY")]
    api_key: Option<String>,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// Run in this sandbox (default: a new one, destroyed afterwards).
    #[arg(long, short)]
    sandbox: Option<String>,
    /// `python` or `bash`.
    #[arg(long, short, default_value = "python")]
    language: String,
    /// Template for a new sandbox.
    #[arg(long, short)]
    template: Option<String>,
    /// Exec timeout in milliseconds.
    #[arg(long)]
    timeout_ms: Option<u64>,
    /// The code; `-` reads it from stdin.
    code: String,
}

#[derive(Args)]
struct McpArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// Serve streamable HTTP at http://ADDR/mcp instead of stdio (loopback only).
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,
    /// Template of the sandboxes it creates.
    #[arg(long, env = "FORKBOX_MCP_TEMPLATE")]
    template: Option<String>,
}

fn main() {
    // A sandbox's init is this binary exec'd under another name.
    if std::env::args_os().next().is_some_and(|a| a == jail::entry::INIT_ARGV0) {
        jail::entry::init_main();
    }
    let cli = Cli::parse();
    if let Command::Shim { config } = &cli.command {
        // Single-threaded on purpose: the shim forks.
        jail::entry::shim_main(config);
    }
    if !matches!(cli.command, Command::Serve(_) | Command::Mcp(_)) {
        // A command whose reader went away (`forkbox template ls | head -1`)
        // ends quietly, as other Unix tools do, instead of panicking in
        // println!. Servers keep Rust's default (ignored; EPIPE is an
        // error), or a client hanging up would kill them.
        // SAFETY: setting a signal's disposition to the default touches no
        // memory; no other thread runs yet.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    if matches!(cli.command, Command::Serve(_) | Command::Gateway(_)) {
        limit_malloc_arenas();
    }
    let logs = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr);
    if cli.log_format == "json" {
        logs.json().with_current_span(true).with_span_list(false).init();
    } else {
        logs.init();
    }
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("forkbox: {e:#}");
            1
        }
    };
    std::process::exit(code);
}

/// glibc gives threads that allocate arenas of their own (up to eight per
/// core) and hands little of them back: under bench/load.py the server's
/// RSS grew from 44 to 209 MiB over five minutes and stayed there once
/// everything was destroyed. With two arenas it levelled off at 111 MiB,
/// at the same request rate (docs/reliability.md#load).
fn limit_malloc_arenas() {
    #[cfg(target_env = "gnu")]
    // SAFETY: sets an allocator parameter; no other thread runs yet.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Shim { .. } => unreachable!("handled before the runtime starts"),
        Command::Serve(args) => {
            let node_args = args.node.clone();
            let mut config = server_config(*args)?;
            let rt = server::runtime()?;
            if !node_args.cluster.enabled() {
                rt.block_on(server::serve(config))?;
                return Ok(0);
            }
            rt.block_on(async move {
                let node = std::sync::Arc::new(node::join(&node_args, &mut config).await?);
                let started = std::sync::Arc::clone(&node);
                server::serve_then(config, move |state| started.started(state)).await?;
                node.stopped().await;
                anyhow::Ok(())
            })?;
            Ok(0)
        }
        Command::Gateway(args) => {
            let rt = server::runtime()?;
            rt.block_on(async move {
                let config = args.cluster.etcd_only();
                let secret = args.cluster.secret()?;
                gateway::serve(gateway::GatewayConfig { listen: args.listen, cluster: config, secret }).await
            })?;
            Ok(0)
        }
        Command::Node { command: NodeCommand::List(client) } => tokio::runtime::Runtime::new()?.block_on(client::nodes(&client)),
        Command::Node { command: NodeCommand::Drain { client, node, secret_file } } => {
            let secret = cluster::secret::Secret::from_file(&secret_file)?;
            tokio::runtime::Runtime::new()?.block_on(client::drain(&client, &node, secret.expose()))
        }
        Command::Node { command: NodeCommand::Undrain { client, node, secret_file } } => {
            let secret = cluster::secret::Secret::from_file(&secret_file)?;
            tokio::runtime::Runtime::new()?.block_on(client::undrain(&client, &node, secret.expose()))
        }
        Command::Template { command: TemplateCommand::Build { name, client, .. } } if is_recipe_path(&name) => {
            tokio::runtime::Runtime::new()?.block_on(client::templates::build(&client, std::path::Path::new(&name)))
        }
        Command::Template { command: TemplateCommand::Build { name, state_dir, debian, .. } } => {
            template::check_tools().map_err(|e| anyhow::anyhow!("{e}"))?;
            let store = template::TemplateStore::new(state_dir.join("templates")).with_debian(debian.release);
            let recipe = store
                .recipe(&name)
                .with_context(|| format!("unknown template `{name}` (built-in: {}; or a recipe file's path)", template::builtin_names().join(", ")))?;
            let built = store.build(&recipe, &template::BarProgress).map_err(|e| anyhow::anyhow!("{e}"))?;
            println!("{} {} {}", built.name, built.hash, built.rootfs.display());
            Ok(0)
        }
        Command::Template { command: TemplateCommand::Ls { state_dir, debian } } => {
            let store = template::TemplateStore::new(state_dir.join("templates")).with_debian(debian.release);
            for name in template::builtin_names() {
                let recipe = store.recipe(name).context("built-in recipe")?;
                let current = store.lookup(&recipe).ok().flatten().map(|t| t.hash);
                let versions: Vec<String> = store.versions(name).into_iter().map(|t| t.hash).collect();
                println!("{name}\tcurrent={}\tbuilt={}", current.unwrap_or_else(|| "-".into()), versions.join(","));
            }
            Ok(0)
        }
        Command::Template { command: TemplateCommand::List(client) } => tokio::runtime::Runtime::new()?.block_on(client::templates::list(&client)),
        Command::Template { command: TemplateCommand::Show { client, name } } => {
            tokio::runtime::Runtime::new()?.block_on(client::templates::show(&client, &name))
        }
        Command::Template { command: TemplateCommand::Rm { client, force, names } } => {
            tokio::runtime::Runtime::new()?.block_on(client::templates::rm(&client, &names, force))
        }
        Command::Tools { command: ToolsCommand::Build { name, state_dir } } => {
            template::check_tools().map_err(|e| anyhow::anyhow!("{e}"))?;
            let built = tools_root::build(&tools_root::default_dir(&state_dir), &name)?;
            println!("{} {} {}", built.name, built.hash, built.rootfs.display());
            Ok(0)
        }
        Command::Tools { command: ToolsCommand::Check { state_dir } } => {
            let readiness = tools_root::criu_readiness(&tools_root::default_dir(&state_dir));
            println!("{}", readiness.describe());
            Ok(if matches!(readiness, criu::Readiness::Ready(_)) { 0 } else { 1 })
        }
        Command::Run(args) => tokio::runtime::Runtime::new()?.block_on(client::run(args)),
        Command::Ls(args) => tokio::runtime::Runtime::new()?.block_on(client::ls(args)),
        Command::Top { client, interval, once } => {
            let interval = Duration::try_from_secs_f64(interval).ok().filter(|d| !d.is_zero()).context("--interval must be a positive number of seconds")?;
            tokio::runtime::Runtime::new()?.block_on(client::top(client, interval, once))
        }
        Command::Rm { client, ids } => tokio::runtime::Runtime::new()?.block_on(client::rm(client, ids)),
        Command::Key { command, cluster_etcd, cluster_prefix, .. } if !cluster_etcd.is_empty() => {
            tokio::runtime::Runtime::new()?.block_on(cluster_key(command, cluster_etcd, cluster_prefix))
        }
        Command::Key { command, state_dir, .. } => key(command, &state_dir),
        Command::Mcp(args) => {
            let config = mcp::Config { url: args.client.url, api_key: args.client.api_key, template: args.template };
            let rt = tokio::runtime::Runtime::new()?;
            match args.http {
                Some(addr) => rt.block_on(mcp::serve_http(config, addr))?,
                None => rt.block_on(mcp::serve_stdio(config))?,
            }
            Ok(0)
        }
    }
}

fn key(command: KeyCommand, state_dir: &std::path::Path) -> anyhow::Result<i32> {
    use server::keys::{key_file_path, KeyFile};
    let path = key_file_path(state_dir);
    let mut file = KeyFile::load(&path)?;
    match command {
        KeyCommand::Add { name, limits } => {
            let key = file.add(&name, limits.limits())?;
            file.save(&path)?;
            eprintln!("added key `{name}` ({}); it is shown this once and stored only as a hash:", limits.limits());
            println!("{key}");
        }
        KeyCommand::List => {
            for k in &file.keys {
                println!("{}\tcreated={}\t{}", k.name, k.created, k.limits);
            }
        }
        KeyCommand::Remove { name } => {
            file.remove(&name)?;
            file.save(&path)?;
            eprintln!("removed key `{name}`");
        }
    }
    Ok(0)
}

/// `forkbox key` against a cluster's etcd: the same keys, stored hashed,
/// which every node follows.
async fn cluster_key(command: KeyCommand, etcd: Vec<String>, prefix: String) -> anyhow::Result<i32> {
    // Keys need etcd only: the object store is not opened.
    let cluster = cluster::Cluster::connect(&cluster::ClusterConfig { etcd, prefix, store: None }).await.context("connect to the cluster")?;
    match command {
        KeyCommand::Add { name, limits } => {
            // Made as a single server makes them: same names, same hashes.
            let mut file = server::keys::KeyFile::default();
            let key = file.add(&name, limits.limits())?;
            let made = &file.keys[0];
            let record = cluster::keys::ClusterKey { name: made.name.clone(), sha256: made.sha256.clone(), created: made.created, limits: made.limits };
            cluster.add_key(&record).await?;
            eprintln!("added key `{name}` to the cluster ({}); it is shown this once and stored only as a hash:", limits.limits());
            println!("{key}");
        }
        KeyCommand::List => {
            for k in cluster.keys().await? {
                let (n, mib) = cluster.usage(&k.name).await.unwrap_or((0, 0));
                println!("{}\tcreated={}\tsandboxes={n}\tmemory_mib={mib}", k.name, k.created);
            }
        }
        KeyCommand::Remove { name } => {
            if !cluster.remove_key(&name).await? {
                anyhow::bail!("no key named `{name}` in the cluster");
            }
            eprintln!("removed key `{name}` from the cluster");
        }
    }
    Ok(0)
}

fn server_config(a: ServeArgs) -> anyhow::Result<server::ServerConfig> {
    let limits = server::SandboxLimits {
        default_timeout: Duration::from_secs(a.default_timeout),
        max_timeout: Duration::from_secs(a.max_timeout),
        default_idle_timeout: Duration::from_secs(a.default_idle_timeout),
        max_idle_timeout: Duration::from_secs(a.max_idle_timeout),
        default_ram_mib: a.default_ram_mib,
        max_ram_mib: a.max_ram_mib,
        pids: a.pids_limit,
        max_sandboxes: a.max_sandboxes,
        max_memory_mib: a.max_memory_mib,
        max_file_bytes: a.max_file_mib << 20,
        default_exec_timeout: Duration::from_millis(a.exec_timeout_ms),
        interrupt_grace: Duration::from_millis(a.interrupt_grace_ms),
        port_connect_timeout: Duration::from_millis(a.port_connect_timeout_ms),
        port_response_timeout: Duration::from_millis(a.port_response_timeout_ms),
        max_port_connections: a.max_port_connections,
        max_checkpoints: a.max_checkpoints,
        ..Default::default()
    };
    let criu = tools_root::criu_readiness(&a.tools_dir.clone().unwrap_or_else(|| tools_root::default_dir(&a.state_dir)));
    Ok(server::ServerConfig {
        listen: a.listen,
        templates_dir: a.templates_dir.unwrap_or_else(|| a.state_dir.join("templates")),
        debian: a.debian.release,
        state_dir: a.state_dir,
        // Only the hashes are kept; the keys are dropped with `a`.
        api_keys: a.api_keys.iter().filter(|k| !k.is_empty()).map(|k| server::keys::KeyHash::of(k)).collect(),
        key_limits: server::keys::KeyLimits {
            max_sandboxes: a.key_max_sandboxes,
            forks_per_minute: a.key_forks_per_minute,
            max_memory_mib: a.key_max_memory_mib,
        },
        limits,
        volume: jail::volume::VolumeSize {
            initial_bytes: a.volume_initial_gib << 30,
            max_bytes: a.volume_gib << 30,
            host_reserve_bytes: a.disk_reserve_gib.map(|g| g << 30),
        },
        host_cas: (!a.no_host_cas).then_some(a.host_cas),
        egress_proxy: a.egress_proxy.map(std::sync::Arc::new),
        build_templates: !a.no_build_templates,
        shim_exe: std::env::current_exe().context("locate the forkbox executable")?,
        warm_pool: !a.no_warm_pool,
        pool_idle: Duration::from_secs(a.pool_idle_seconds),
        max_pools: a.max_warm_pools as usize,
        default_egress: a.default_egress,
        idle_pause: (a.idle_pause_seconds > 0).then(|| Duration::from_secs(a.idle_pause_seconds)),
        orphan_grace: Duration::from_secs(a.orphan_grace_seconds),
        drain: Duration::from_secs(a.drain_seconds),
        cpu_boost: a.cpu_boost,
        criu,
        lazy_resume: !a.eager_resume,
        directory: Default::default(),
        cluster_secret_sha256: None,
    })
}
