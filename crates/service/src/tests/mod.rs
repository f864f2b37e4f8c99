//! The service's lifecycle over the fake engine (engine/fake.rs): no root,
//! no kernel features, no Python; each test makes its own service in a
//! temporary state directory and checks what the engine was left holding.

mod create;
mod fork;
mod pause;
mod pool;
mod quota;

use std::path::Path;
use std::time::Duration;

use protocol::{CreateSandbox, Event, EventKind, ExecRequest};

use crate::config::{SandboxLimits, ServerConfig};
use crate::engine::fake::FakeEngine;
use crate::keys::Caller;
use crate::{Service, Templates};

/// A service over a fake engine, and the engine to arm and inspect.
pub(crate) struct Harness {
    pub service: Service,
    pub fake: FakeEngine,
    _state: tempfile::TempDir,
}

fn config(state: &Path) -> ServerConfig {
    ServerConfig {
        listen: "127.0.0.1:0".parse().expect("an address"),
        state_dir: state.to_path_buf(),
        templates_dir: state.join("templates"),
        debian: Default::default(),
        api_keys: vec![],
        key_limits: Default::default(),
        limits: SandboxLimits { max_memory_mib: Some(1 << 20), ..Default::default() },
        volume: jail::volume::VolumeSize::up_to_gib(1),
        host_cas: None,
        egress_proxy: None,
        build_templates: false,
        shim_exe: "/nonexistent".into(),
        warm_pool: false,
        pool_idle: Duration::from_secs(600),
        max_pools: 4,
        default_egress: false,
        idle_pause: None,
        orphan_grace: Duration::ZERO,
        drain: Duration::from_secs(5),
        cpu_boost: 1,
        lazy_resume: false,
        directory: Default::default(),
        cluster_secret_sha256: None,
        criu: criu::Readiness::Unavailable("not probed in tests".into()),
    }
}

impl Harness {
    pub fn new() -> Harness {
        Self::with(|_| {})
    }

    /// A harness whose configuration `edit` changed first.
    pub fn with(edit: impl FnOnce(&mut ServerConfig)) -> Harness {
        let state = tempfile::tempdir().expect("a state directory");
        let mut config = config(state.path());
        edit(&mut config);
        let templates = Templates::new(config.templates_dir.clone(), &state.path().join("custom-templates"), config.debian);
        templates.pretend_built("default", state.path().join("default-rootfs"));
        let fake = FakeEngine::new();
        Harness { service: Service::new(config, fake.clone(), templates), fake, _state: state }
    }

    pub async fn create(&self) -> String {
        self.create_as(&Caller::anonymous()).await.expect("create")
    }

    pub async fn create_as(&self, caller: &Caller) -> Result<String, crate::Error> {
        self.service.create(caller, CreateSandbox::default()).await.map(|e| e.id.clone())
    }

    /// Start `code` in `id`; its events as they come.
    pub async fn start(&self, id: &str, code: &str) -> Result<tokio::sync::mpsc::Receiver<Event>, crate::Error> {
        let req = ExecRequest { code: code.into(), language: None, timeout_ms: None, output: Default::default() };
        self.service.exec(&Caller::anonymous(), id, req).await
    }

    /// Run `code` in `id`; its events, to the end.
    pub async fn exec(&self, id: &str, code: &str) -> Result<Vec<Event>, crate::Error> {
        let mut events = self.start(id, code).await?;
        let mut all = Vec::new();
        while let Some(e) = events.recv().await {
            all.push(e);
        }
        Ok(all)
    }

    /// What `code` printed in `id`, and its exit code.
    pub async fn run(&self, id: &str, code: &str) -> (String, i64) {
        let events = self.exec(id, code).await.expect("exec");
        let out = events.iter().filter(|e| e.kind == EventKind::Stdout).filter_map(|e| e.data.as_str()).collect();
        let exit = events.iter().find(|e| e.kind == EventKind::Exit).and_then(|e| e.data.as_i64()).expect("an exit event");
        (out, exit)
    }

    /// Ids in the registry.
    pub async fn registered(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.service.list(&Caller::anonymous()).await.iter().map(|e| e.id.clone()).collect();
        ids.sort();
        ids
    }

    /// Members the engine holds, as a sorted list.
    pub fn live(&self) -> Vec<String> {
        self.fake.live().into_iter().collect()
    }
}
