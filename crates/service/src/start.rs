//! Starting and stopping the service: open the engine and the templates,
//! take back what a previous server left (Spaces, running sandboxes), start
//! the timers; at the end, destroy everything or leave it for the next
//! server. The front end owns only its listener.

use std::time::Duration;

use crate::config::ServerConfig;
use crate::state::Service;
use crate::templates::Templates;

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("--max-sandboxes can be at most {0} (the host ids one server owns)")]
    TooManySandboxes(u32),
    /// A tool the configuration needs is missing (with how to get it).
    #[error("{0}")]
    MissingTool(String),
    #[error("could not open the engine: {0}")]
    Engine(#[from] jail::Error),
    #[error("recover the spaces in {dir}: {err}")]
    Spaces { dir: std::path::PathBuf, err: std::io::Error },
    #[error("could not start the template builder: {0}")]
    Builder(std::io::Error),
}

/// How the service ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Every sandbox goes with the server (persistent ones as Spaces),
    /// after in-flight calls drain.
    DestroyAll,
    /// The sandboxes keep running, for the next server on this state
    /// directory to adopt (docs/state.md#restarts).
    LeaveRunning,
}

impl Service {
    /// Open the engine on `config.state_dir`, adopt the survivors of a
    /// previous server and start the background loops (expiry, pool,
    /// quota sweep, CPU boost, template builds).
    pub async fn start(config: ServerConfig) -> Result<Service, StartError> {
        if config.limits.max_sandboxes > jail::SLOT_BLOCKS as usize {
            return Err(StartError::TooManySandboxes(jail::SLOT_BLOCKS));
        }
        if config.build_templates {
            template::check_tools().map_err(|e| StartError::MissingTool(e.to_string()))?;
        }
        if config.default_egress && config.egress_proxy.is_none() {
            for (tool, package) in [("pasta", "passt"), ("nft", "nftables")] {
                jail::require_tool(tool, package).map_err(|e| StartError::MissingTool(format!("{e} (or start with --default-egress false)")))?;
            }
        }
        let jail = jail::Jail::open(jail::JailConfig {
            orphan_grace: config.orphan_grace,
            volume: config.volume,
            ..jail::JailConfig::new(config.state_dir.clone(), config.shim_exe.clone(), 0)
        })?;
        jail.wait_for_dumps().await;
        let templates = Templates::new(config.templates_dir.clone(), &config.state_dir.join("custom-templates"), config.debian);
        tracing::info!(debian = %config.debian, python = config.debian.python(), "built-in templates are made from this release");
        templates.scan();
        if !config.build_templates {
            templates.mark_unbuilt();
        }
        let state = Service::new(config.clone(), jail, templates.clone());
        match &config.host_cas {
            // Logs which CAs sandboxes trust.
            Some(_) => drop(state.inner.trust.refresh()),
            None => tracing::info!("sandboxes trust only their template's CAs (--no-host-cas)"),
        }
        match &config.criu {
            criu::Readiness::Ready(criu) => tracing::info!(criu = %criu.describe(), kinds = "processes, globals",
                "freezes of keep_processes sandboxes (persistent ones by default) make Spaces that keep every process; others keep files and the REPL's globals"),
            criu::Readiness::Unavailable(why) => tracing::info!(criu = %why, kinds = "globals",
                "freezes make Spaces that keep files and the REPL's globals: without criu no process is kept"),
        }
        if let Some(proxy) = &config.egress_proxy {
            tracing::info!(proxy = %proxy, "sandboxes with egress reach the network only through the upstream proxy");
        }
        state.inner.spaces.recover().map_err(|err| StartError::Spaces { dir: config.state_dir.clone(), err })?;
        let (adopted, lost) = state.adopt_survivors().await?;
        if adopted + lost > 0 {
            tracing::info!(adopted, lost, "took back the sandboxes a previous server left running");
        }
        state.mount_template_stacks().await;
        state.sweep_trust_layers().await;
        if config.build_templates {
            std::thread::Builder::new().name("template-builder".into()).spawn(move || templates.build_all()).map_err(StartError::Builder)?;
        }
        tokio::spawn(state.clone().expire_loop());
        tokio::spawn(state.clone().hibernated_expiry_loop());
        tokio::spawn(state.clone().pool_loop());
        tokio::spawn(state.clone().quota_sweep_loop());
        tokio::spawn(state.clone().cpu_boost_loop());
        tokio::spawn(crate::sandbox::network::follow_host_addrs(state.clone()));
        Ok(state)
    }

    /// Begin the end (the front end stops taking requests after this).
    pub async fn begin_exit(&self, exit: Exit) {
        match exit {
            Exit::DestroyAll => {
                self.drain(self.inner.config.drain).await;
                tracing::info!("shutting down: destroying all sandboxes");
                self.destroy_all().await;
            }
            Exit::LeaveRunning => {
                tracing::info!("exiting for an upgrade: the sandboxes keep running for the next server");
                self.leave_running().await;
            }
        }
    }

    /// Once the front end has stopped: free whatever is left, unless the
    /// sandboxes were left running for the next server.
    pub async fn finish(&self) -> Result<(), jail::Error> {
        if self.inner.engine.is_left_running() {
            return Ok(());
        }
        self.destroy_all().await;
        self.inner.engine.close()
    }
}

impl Service {
    /// Refuse new work, wait up to `grace` for running execs, then interrupt
    /// the rest and wait for them to report (bounded by their interrupt
    /// grace: an exec that ignores SIGINT has its REPL killed).
    pub async fn drain(&self, grace: Duration) {
        let drain = &self.inner.drain;
        drain.begin();
        let running = self.running_execs().await;
        tracing::info!(running, grace_s = grace.as_secs_f64(), "draining: new requests get 503");
        if self.wait_execs_done(grace).await {
            return;
        }
        let left = self.running_execs().await;
        tracing::warn!(left, "drain time is up: interrupting the execs still running");
        drain.stop_now();
        let bound = self.inner.config.limits.interrupt_grace + Duration::from_secs(5);
        if !self.wait_execs_done(bound).await {
            let left = self.running_execs().await;
            tracing::error!(left, "execs still running after they were interrupted");
        }
    }

    async fn wait_execs_done(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.running_execs().await == 0 {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Execs running or queued behind another in their sandbox.
    async fn running_execs(&self) -> u64 {
        self.inner.sandboxes.read().await.values().map(|e| e.busy_count()).sum()
    }
}
