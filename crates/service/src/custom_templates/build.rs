//! `POST /v1/templates`: build a template from a recipe
//! (docs/templates.md#recipes).
//!
//! Each step (files first, so installs can use what they configure, then
//! apt packages, pip packages, and each command) runs
//! in a sandbox of its own, made on the layers of the steps before it, so
//! a recipe's commands are as isolated as any sandbox's and get the
//! recipe's network. What a step changed becomes a layer whose key hashes
//! the key below it and the step: an unchanged recipe runs nothing, and a
//! changed step rebuilds from there, as image builds do.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use protocol::{BuildEvent, Egress, Event, EventKind, TemplateInfo, TemplateLimits, TemplateRecipe};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::error::Error;
use crate::ids::new_id;
use crate::keys::Caller;
use crate::sandbox::{new_entry, start_repl, ExecBounds, SandboxEntry, Settings};
use crate::state::Service;
use crate::templates::layers::{self, Root, MAX_LAYERS};
use crate::templates::user::UserTemplate;
use repl_host::events::EventSink;

/// Longest a step may run.
const STEP_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Longest recipe text fields, and most entries of each list.
const MAX_TEXT: usize = 64 * 1024;
const MAX_ITEMS: usize = 256;

/// A validated recipe: what to run, and the key of each step's layer.
pub struct Plan {
    recipe: TemplateRecipe,
    owner: Option<String>,
    base: String,
    base_rootfs: PathBuf,
    /// The base's top layer (`None`: the base is a built-in).
    parent: Option<String>,
    steps: Vec<Step>,
    /// The base's modules and the recipe's.
    preimport: Vec<String>,
    limits: TemplateLimits,
    egress: Egress,
}

struct Step {
    action: Action,
    key: String,
    label: String,
}

enum Action {
    Apt(Vec<String>),
    Pip(Vec<String>),
    Files(Vec<(jail::fs::SandboxPath, Vec<u8>, u32)>),
    Command(String),
}

fn bad(msg: String) -> Error {
    Error::Invalid(msg)
}

/// `name` or `name=version`, Debian's way.
fn valid_apt(spec: &str) -> bool {
    let (name, version) = spec.split_once('=').map_or((spec, None), |(n, v)| (n, Some(v)));
    template::is_valid_package(name) && version.is_none_or(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"+.~:-".contains(&b)))
}

/// A pip requirement: anything pip reads as one, but no option and no
/// whitespace (each is passed as one quoted argument).
fn valid_pip(spec: &str) -> bool {
    !spec.is_empty() && spec.len() <= 512 && !spec.starts_with('-') && !spec.chars().any(|c| c.is_whitespace() || c.is_control())
}

fn valid_module(m: &str) -> bool {
    !m.is_empty()
        && m.len() <= 200
        && m.split('.').all(|part| {
            let mut chars = part.chars();
            chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_') && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

fn quote(arg: &str) -> String {
    format!("'{}'", arg.replace('\'', "'\\''"))
}

fn short(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    match line.char_indices().nth(80) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None if text.lines().nth(1).is_some() => format!("{line}…"),
        None => line.to_string(),
    }
}

impl Service {
    /// Check a recipe and work out its steps; every mistake is a `400`
    /// here, before the build's stream starts.
    pub fn plan_build(&self, caller: &Caller, recipe: TemplateRecipe) -> Result<Plan, Error> {
        self.check_new_name(caller, &recipe.name)?;
        let templates = &self.inner.templates;
        let base = recipe.base.clone().unwrap_or_else(|| "default".into());
        if base == recipe.name {
            return Err(bad(format!("template `{base}` cannot be its own base")));
        }
        templates.check_visible(caller, &base)?;
        let base_root = templates.rootfs(&base)?.rootfs;
        let (base_rootfs, parent, below_layers) = match templates.custom(&base) {
            Some(t) => {
                let depth = t.top.as_deref().map(|k| templates.layers.chain(k).map(|c| c.len()).unwrap_or(0)).unwrap_or(0);
                (t.base_rootfs.clone(), t.top.clone(), depth)
            }
            None => (base_root, None, 0),
        };
        if recipe.description.len() > MAX_TEXT {
            return Err(bad(format!("description is longer than {MAX_TEXT} bytes")));
        }
        for (what, n) in [
            ("apt", recipe.apt.len()),
            ("pip", recipe.pip.len()),
            ("files", recipe.files.len()),
            ("commands", recipe.commands.len()),
            ("preimport", recipe.preimport.len()),
        ] {
            if n > MAX_ITEMS {
                return Err(bad(format!("`{what}` has {n} entries; at most {MAX_ITEMS}")));
            }
        }
        if let Some(p) = recipe.apt.iter().find(|p| !valid_apt(p)) {
            return Err(bad(format!("apt: {p:?} is not a Debian package name (or name=version)")));
        }
        if let Some(p) = recipe.pip.iter().find(|p| !valid_pip(p)) {
            return Err(bad(format!("pip: {p:?} is not a requirement (no options, no spaces)")));
        }
        if let Some(m) = recipe.preimport.iter().find(|m| !valid_module(m)) {
            return Err(bad(format!("preimport: {m:?} is not a Python module name")));
        }
        let mut files = Vec::new();
        for f in &recipe.files {
            let path = jail::fs::SandboxPath::parse(&f.path, "/root").map_err(|e| bad(format!("files: {:?}: {}", f.path, e.message)))?;
            if !f.path.starts_with('/') || path.is_root() {
                return Err(bad(format!("files: {:?} must be an absolute path of a file", f.path)));
            }
            let data = base64::engine::general_purpose::STANDARD
                .decode(&f.content_b64)
                .map_err(|e| bad(format!("files: {}: content_b64 is not base64: {e}", f.path)))?;
            let mode = f.mode.unwrap_or(0o644);
            if mode > 0o7777 {
                return Err(bad(format!("files: {}: mode {mode:#o} is not a permission mode", f.path)));
            }
            files.push((path, data, mode));
        }
        for c in &recipe.commands {
            if c.trim().is_empty() || c.contains('\0') || c.len() > MAX_TEXT {
                return Err(bad("commands: a command is empty, contains a NUL byte or is longer than 64 KiB".into()));
            }
        }
        self.check_limits(&recipe.limits)?;
        let egress = recipe.egress.clone().unwrap_or(Egress::On(self.inner.config.default_egress));
        jail::egress::plan(&egress)?;

        // The steps, keyed as a chain from the base.
        let mut actions: Vec<(Action, serde_json::Value, String)> = Vec::new();
        if !files.is_empty() {
            let digest: Vec<serde_json::Value> = files
                .iter()
                .map(|(p, data, mode)| serde_json::json!({"path": p.to_string(), "mode": mode, "sha256": hex::encode(Sha256::digest(data))}))
                .collect();
            let label = match files.len() {
                1 => format!("write {}", files[0].0),
                n => format!("write {n} files"),
            };
            actions.push((Action::Files(files), serde_json::json!({ "files": digest }), label));
        }
        if !recipe.apt.is_empty() {
            let mut apt = recipe.apt.clone();
            apt.sort();
            apt.dedup();
            actions.push((Action::Apt(apt.clone()), serde_json::json!({ "apt": apt }), format!("apt-get install {}", apt.join(" "))));
        }
        if !recipe.pip.is_empty() {
            let label = format!("pip install {}", recipe.pip.join(" "));
            actions.push((Action::Pip(recipe.pip.clone()), serde_json::json!({ "pip": recipe.pip }), label));
        }
        for c in &recipe.commands {
            actions.push((Action::Command(c.clone()), serde_json::json!({ "run": c }), format!("run {}", short(c))));
        }
        if below_layers + actions.len() > MAX_LAYERS {
            return Err(bad(format!("a template may have at most {MAX_LAYERS} layers: its base has {below_layers}, this recipe adds {}", actions.len())));
        }
        let mut below = parent.clone().unwrap_or_else(|| format!("builtin:{}", base_rootfs.display()));
        let steps = actions
            .into_iter()
            .map(|(action, canonical, label)| {
                let key = layers::step_key(&below, canonical.to_string().as_bytes());
                below = key.clone();
                Step { action, key, label }
            })
            .collect();
        let mut preimport = templates.preimport(&base);
        for m in &recipe.preimport {
            if !preimport.contains(m) {
                preimport.push(m.clone());
            }
        }
        let b = templates.limits(&base);
        let own = recipe.limits;
        let limits = TemplateLimits {
            ram_mib: own.ram_mib.or(b.ram_mib),
            rootfs_gb: own.rootfs_gb.or(b.rootfs_gb),
            timeout_seconds: own.timeout_seconds.or(b.timeout_seconds),
            idle_timeout_seconds: own.idle_timeout_seconds.or(b.idle_timeout_seconds),
        };
        Ok(Plan { owner: caller.owner(), base, base_rootfs, parent, steps, preimport, limits, egress, recipe })
    }

    fn check_limits(&self, l: &TemplateLimits) -> Result<(), Error> {
        let c = &self.inner.config.limits;
        if let Some(r) = l.ram_mib {
            if r < c.min_ram_mib || r > c.max_ram_mib {
                return Err(bad(format!("limits.ram_mib must be between {} and {}, got {r}", c.min_ram_mib, c.max_ram_mib)));
            }
        }
        if let Some(g) = l.rootfs_gb {
            if g == 0 || g > c.max_rootfs_gb {
                return Err(bad(format!("limits.rootfs_gb must be between 1 and {}, got {g}", c.max_rootfs_gb)));
            }
        }
        if l.timeout_seconds == Some(0) || l.idle_timeout_seconds == Some(0) {
            return Err(bad("limits: timeouts must be at least 1 second".into()));
        }
        Ok(())
    }

    /// Run a planned build, telling `events` how it goes; the last event is
    /// `done` or `error`. A client that goes away does not stop it.
    pub async fn build_template(&self, plan: Plan, events: mpsc::Sender<BuildEvent>) {
        let name = plan.recipe.name.clone();
        let started = std::time::Instant::now();
        let last = match self.inner.templates.start_building(&name) {
            None => BuildEvent::Error { error: format!("template `{name}` is being built already; try again when that build ends") },
            Some(_building) => match self.run_build(plan, &events).await {
                Ok(template) => BuildEvent::Done { template: Box::new(template) },
                Err(error) => BuildEvent::Error { error: error.to_string() },
            },
        };
        match &last {
            BuildEvent::Error { error } => tracing::warn!(template = %name, err = %error, "template build failed"),
            _ => tracing::info!(template = %name, secs = started.elapsed().as_secs_f32(), "template built"),
        }
        let _ = events.send(last).await;
    }

    async fn run_build(&self, plan: Plan, events: &mpsc::Sender<BuildEvent>) -> Result<TemplateInfo, BuildError> {
        let layers = self.inner.templates.layers.clone();
        let mut pins = layers.pins();
        if let Some(p) = &plan.parent {
            for m in layers.chain(p).map_err(BuildError::BaseLayers)? {
                pins.add(&m.key);
            }
        }
        let own_imports: Vec<&String> = plan.recipe.preimport.iter().collect();
        let total = (plan.steps.len() + usize::from(!own_imports.is_empty())) as u32;
        let mut below = plan.parent.clone();
        for (i, step) in plan.steps.iter().enumerate() {
            pins.add(&step.key);
            let cached = layers.exists(&step.key);
            let _ = events.send(BuildEvent::Step { index: i as u32 + 1, total, step: step.label.clone(), cached }).await;
            if !cached {
                let ran = self.run_step(&plan, below.as_deref(), step, events).await;
                if let Err(e) = ran {
                    self.note_build_cache(&plan.recipe.name, below.as_deref());
                    return Err(BuildError::Step { index: i + 1, label: step.label.clone(), why: e });
                }
            }
            below = Some(step.key.clone());
        }
        self.note_build_cache(&plan.recipe.name, below.as_deref());
        if !own_imports.is_empty() {
            let list: Vec<&str> = own_imports.iter().map(|s| s.as_str()).collect();
            let label = format!("import {}", list.join(", "));
            let _ = events.send(BuildEvent::Step { index: total, total, step: label.clone(), cached: false }).await;
            let code = format!(
                "python3 -c 'import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)' {}",
                list.iter().map(|m| quote(m)).collect::<Vec<_>>().join(" ")
            );
            let rootfs = self.stack_rootfs(&plan, below.as_deref()).await?;
            let entry = self.scratch_sandbox(&plan, rootfs).await?;
            let ran = run_logged(&entry, &code, events).await;
            self.teardown(&entry).await;
            ran.map_err(|why| BuildError::Step { index: total as usize, label, why })?;
        }
        let mut recipe = plan.recipe.clone();
        // The record keeps what each file was, not its bytes.
        for f in &mut recipe.files {
            f.content_b64.clear();
        }
        let t = UserTemplate {
            name: recipe.name.clone(),
            owner: plan.owner.clone(),
            kind: "recipe".into(),
            description: recipe.description.clone(),
            base: plan.base.clone(),
            top: below,
            base_rootfs: plan.base_rootfs.clone(),
            base_top: plan.parent.clone(),
            preimport: plan.preimport.clone(),
            limits: plan.limits,
            recipe: Some(recipe),
            saved_from: None,
            unsaved: Vec::new(),
            created_at: repl_host::events::now_ms(),
        };
        let mut info = self.register_template(t).await.map_err(BuildError::Register)?;
        info.in_use = self.template_use(&info.name).await;
        Ok(info)
    }

    fn note_build_cache(&self, name: &str, top: Option<&str>) {
        if let (Some(top), Ok(u)) = (top, self.inner.templates.user.read()) {
            if let Err(e) = u.set_build_cache(name, top) {
                tracing::warn!(template = name, err = %e, "could not note the build cache");
            }
        }
    }

    /// The root filesystem of the stack with `top` over the plan's base.
    async fn stack_rootfs(&self, plan: &Plan, top: Option<&str>) -> Result<Root, StepError> {
        match top {
            None => Ok(Root::single(plan.base_rootfs.clone())),
            Some(k) => {
                let (layers, k) = (self.inner.templates.layers.clone(), k.to_string());
                tokio::task::spawn_blocking(move || layers.root(&k)).await?.map_err(StepError::Mount)
            }
        }
    }

    /// One step in a sandbox of its own; what it changed becomes its layer.
    async fn run_step(&self, plan: &Plan, below: Option<&str>, step: &Step, events: &mpsc::Sender<BuildEvent>) -> Result<(), StepError> {
        let rootfs = self.stack_rootfs(plan, below).await?;
        let entry = self.scratch_sandbox(plan, rootfs).await?;
        let ran = self.run_action(&entry, &step.action, events).await;
        let committed = match ran {
            Err(e) => Err(e),
            Ok(()) => {
                // Whatever the step left running stands still while its files are copied.
                let _ = crate::sandbox::freezer::set_paused(&entry, true).await;
                let (layers, engine) = (self.inner.templates.layers.clone(), Arc::clone(&entry.engine));
                let (key, parent, base, label) = (step.key.clone(), below.map(str::to_string), plan.base_rootfs.clone(), step.label.clone());
                tokio::task::spawn_blocking(move || {
                    layers.commit(&key, parent.as_deref(), &base, &label, |dir| Ok(engine.export_upper(&dir.join("diff")).map_err(std::io::Error::from)?.bytes))
                })
                .await
                .map_err(StepError::from)
                .and_then(|r| r.map(|_| ()).map_err(StepError::Save))
            }
        };
        self.teardown(&entry).await;
        committed
    }

    async fn run_action(&self, entry: &Arc<SandboxEntry>, action: &Action, events: &mpsc::Sender<BuildEvent>) -> Result<(), StepError> {
        match action {
            Action::Apt(packages) => {
                let apt = "apt-get -o APT::Sandbox::User=root -o Dpkg::Use-Pty=0 -q";
                let script = format!(
                    "set -e\nexport DEBIAN_FRONTEND=noninteractive\n{apt} update\n{apt} install -y --no-install-recommends {}\n{apt} clean\nrm -rf /var/lib/apt/lists/*\n",
                    packages.iter().map(|p| quote(p)).collect::<Vec<_>>().join(" ")
                );
                run_logged(entry, &script, events).await
            }
            Action::Pip(specs) => {
                let script = format!(
                    "python3 -m pip install --no-cache-dir --disable-pip-version-check --root-user-action=ignore --progress-bar off {}",
                    specs.iter().map(|s| quote(s)).collect::<Vec<_>>().join(" ")
                );
                run_logged(entry, &script, events).await
            }
            Action::Command(c) => run_logged(entry, c, events).await,
            Action::Files(files) => {
                let fs = entry.engine.fs().map_err(|e| StepError::Files(e.to_string()))?;
                for (path, data, mode) in files {
                    let mut w = fs.write(path, false, Some(*mode), true).map_err(|e| StepError::Files(e.message))?;
                    std::io::Write::write_all(w.file(), data).map_err(|e| StepError::Files(w.error(&e).message))?;
                    w.commit().map_err(|e| StepError::Files(e.message))?;
                    fs.chmod(path, *mode).map_err(|e| StepError::Files(e.message))?;
                    let _ =
                        events.send(BuildEvent::Log { stream: "stdout".into(), text: format!("wrote {} ({} bytes, mode {mode:o})\n", path, data.len()) }).await;
                }
                Ok(())
            }
        }
    }

    /// A hidden sandbox on `rootfs` for one build step, with the recipe's network.
    async fn scratch_sandbox(&self, plan: &Plan, root: Root) -> Result<Arc<SandboxEntry>, StepError> {
        let l = &self.inner.config.limits;
        let settings = Settings {
            template: plan.recipe.name.clone(),
            ram_mib: plan.limits.ram_mib.unwrap_or(0).max(l.default_ram_mib),
            rootfs_gb: l.max_rootfs_gb,
            timeout: Duration::MAX,
            idle_timeout: Duration::MAX,
            interrupt_grace: l.interrupt_grace,
            egress: plan.egress.clone(),
            persistent: false,
            keep_processes: false,
            owner: None,
            setup: std::sync::Arc::clone(&self.inner.setup),
            env: Vec::new(),
            metadata: Default::default(),
            pause_at_timeout: false,
            public_ports: false,
        };
        crate::disk::ensure_room_for_sandboxes(&self.inner.config.state_dir, self.inner.engine.as_ref())?;
        let trust = self.trust_layer(&root)?;
        let spec = root.spec(new_id(), self.limits_for(&settings), None, trust);
        let id = spec.id.clone();
        let engine = self.inner.engine.create(spec).await.map_err(StepError::Sandbox)?;
        let session = match start_repl(engine.as_ref(), &settings.setup).await {
            Ok(s) => s,
            Err(e) => {
                let _ = self.inner.engine.destroy(engine.as_ref()).await;
                return Err(StepError::Repl(e));
            }
        };
        let entry = new_entry(id, settings, engine, session, Vec::new());
        crate::sandbox::network::apply_soon(&entry, plan.egress.clone()).await;
        Ok(entry)
    }
}

/// Run a bash script in the sandbox, its output sent as `log` events;
/// a non-zero exit is an error.
async fn run_logged(entry: &Arc<SandboxEntry>, script: &str, events: &mpsc::Sender<BuildEvent>) -> Result<(), StepError> {
    let (tx, mut rx) = mpsc::channel::<Event>(256);
    let out = events.clone();
    let forward = tokio::spawn(async move {
        let (mut exit, mut error) = (None, None);
        while let Some(ev) = rx.recv().await {
            let text = ev.data.as_str().map(str::to_string).unwrap_or_default();
            match ev.kind {
                EventKind::Stdout | EventKind::Stderr => {
                    let stream = if ev.kind == EventKind::Stdout { "stdout" } else { "stderr" };
                    let text = if ev.nl == Some(true) { format!("{text}\n") } else { text };
                    let _ = out.send(BuildEvent::Log { stream: stream.into(), text }).await;
                }
                EventKind::Error => error = Some(text),
                EventKind::Exit => exit = ev.data.as_i64(),
                _ => {}
            }
        }
        (exit, error)
    });
    let mut sink = EventSink::new(tx, Default::default());
    // The step's network comes up in the background (sandbox/network.rs): wait
    // for it, as an exec does, or a command's first connection may fail.
    let network_failed = entry.network.lock().await.failed.take();
    if let Some(why) = network_failed {
        let _ = events.send(BuildEvent::Log { stream: "stderr".into(), text: format!("{why}\n") }).await;
    }
    {
        let mut slot = entry.slot.lock().await;
        entry.run_bash(&mut slot, script, &ExecBounds::timeout_only(STEP_TIMEOUT), &mut sink).await;
    }
    drop(sink);
    let (exit, error) = forward.await?;
    match (exit, error) {
        (Some(0), _) => Ok(()),
        (_, Some(e)) => Err(StepError::Failed(e)),
        (Some(code), None) => Err(StepError::Exit(code)),
        (None, None) => Err(StepError::NoExit),
    }
}

/// Why a build failed, as its `error` event tells the client.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("the base's layers: {0}")]
    BaseLayers(std::io::Error),
    #[error("step {index} ({label}): {why}")]
    Step { index: usize, label: String, why: StepError },
    /// Making the sandbox for the recipe's own imports.
    #[error("{0}")]
    Setup(#[from] StepError),
    #[error("{0}")]
    Register(Error),
}

/// Why one build step failed.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error("mount the layers: {0}")]
    Mount(std::io::Error),
    #[error("save the layer: {0}")]
    Save(std::io::Error),
    #[error("{0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("{0}")]
    Files(String),
    /// The step's command failed (its error event).
    #[error("{0}")]
    Failed(String),
    #[error("exited with {0}")]
    Exit(i64),
    #[error("ended without an exit status")]
    NoExit,
    #[error("{0}")]
    Service(#[from] Error),
    #[error("make the build's sandbox: {0}")]
    Sandbox(jail::Error),
    #[error("start the build sandbox's REPL: {0}")]
    Repl(crate::sandbox::ReplError),
}
