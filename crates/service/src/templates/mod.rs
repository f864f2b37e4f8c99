//! Templates as the server sees them (docs/templates.md).
//!
//! Built-ins are built in the background at start (`default` first), with
//! their state and progress, so a create from a template still building
//! answers 503 with its progress. Custom templates (built from a recipe, or
//! saved from a live sandbox) are stacks of layers on a built-in
//! (`layers`), named in `user`; `build` and `save` make them.

pub mod layers;
pub mod user;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use protocol::{TemplateInfo, TemplateLimits};
use template::{Debian, Progress, Recipe, TemplateStore};

use crate::error::Error;
use crate::keys::Caller;
use layers::LayerStore;
pub use layers::Root;
use user::{UserTemplate, UserTemplates};

#[derive(Debug, Clone)]
enum State {
    Queued,
    Building { done: u64, total: u64, message: String },
    Ready(PathBuf),
    Failed(String),
}

#[derive(Clone)]
pub struct Templates {
    store: TemplateStore,
    states: Arc<Mutex<HashMap<String, State>>>,
    order: Vec<String>,
    /// Custom templates by name, and their layers (under `<state-dir>/custom-templates`).
    pub user: Arc<RwLock<UserTemplates>>,
    pub layers: LayerStore,
    /// Names being built (one build per name at a time).
    building: Arc<Mutex<HashSet<String>>>,
}

/// A build of one name in flight; the name is free again when it drops.
pub struct Building {
    names: Arc<Mutex<HashSet<String>>>,
    name: String,
}

impl Drop for Building {
    fn drop(&mut self) {
        if let Ok(mut b) = self.names.lock() {
            b.remove(&self.name);
        }
    }
}

impl Templates {
    /// Built-ins under `root` (shared by servers), made from `debian`;
    /// custom templates under `custom`.
    pub fn new(root: PathBuf, custom: &Path, debian: Debian) -> Templates {
        let order: Vec<String> = template::builtin_names().iter().map(|s| s.to_string()).collect();
        let states = order.iter().map(|n| (n.clone(), State::Queued)).collect();
        Templates {
            store: TemplateStore::new(root).with_debian(debian),
            states: Arc::new(Mutex::new(states)),
            order,
            user: Arc::new(RwLock::new(UserTemplates::load(custom.join("templates")))),
            layers: LayerStore::new(custom.join("layers")),
            building: Default::default(),
        }
    }

    /// Claim `name` for a build; `None` while another build of it runs.
    pub fn start_building(&self, name: &str) -> Option<Building> {
        let mut b = self.building.lock().ok()?;
        b.insert(name.to_string()).then(|| Building { names: Arc::clone(&self.building), name: name.to_string() })
    }

    pub fn is_builtin(&self, name: &str) -> bool {
        self.order.iter().any(|n| n == name)
    }

    /// A custom template, by name.
    pub fn custom(&self, name: &str) -> Option<UserTemplate> {
        self.user.read().ok()?.get(name).cloned()
    }

    pub fn customs(&self) -> Vec<UserTemplate> {
        self.user.read().map(|u| u.all().cloned().collect()).unwrap_or_default()
    }

    /// `name` as `caller` may use it: another key's custom template is as
    /// unknown as one that does not exist.
    pub fn check_visible(&self, caller: &Caller, name: &str) -> Result<(), Error> {
        if self.is_builtin(name) {
            return Ok(());
        }
        match self.custom(name) {
            Some(t) if caller.may_use(t.owner.as_deref()) => Ok(()),
            _ => Err(self.unknown(name)),
        }
    }

    fn unknown(&self, name: &str) -> Error {
        Error::NotFound(format!("unknown template `{name}` (built-in: {}; GET /v1/templates lists yours)", self.order.join(", ")))
    }

    /// The defaults a template gives its sandboxes.
    pub fn limits(&self, name: &str) -> TemplateLimits {
        self.custom(name).map(|t| t.limits).unwrap_or_default()
    }

    /// Modules the warm REPL of `name` imports (a custom template's list
    /// includes its base's, taken when it was made).
    pub fn preimport(&self, name: &str) -> Vec<String> {
        match self.custom(name) {
            Some(t) => t.preimport,
            None => builtin_preimport(name).iter().map(|m| m.to_string()).collect(),
        }
    }

    /// The saved REPL state new sandboxes of `name` start from, if any
    /// (a directory to start the sandbox's files with; docs/templates.md).
    pub fn repl_state(&self, name: &str) -> Option<PathBuf> {
        let t = self.custom(name)?;
        (t.kind == "saved").then_some(())?;
        self.layers.repl_state(t.top.as_deref()?)
    }

    /// What a custom template's sandboxes are made on.
    pub fn layers_root(&self, t: &UserTemplate) -> std::io::Result<Root> {
        match &t.top {
            None => Ok(Root::single(t.base_rootfs.clone())),
            Some(top) => self.layers.root(top),
        }
    }

    /// Layer keys every custom template, and each name's latest build,
    /// stands on.
    pub fn layers_in_use(&self) -> HashSet<String> {
        let mut keep = HashSet::new();
        let mut tops: Vec<String> = self.customs().into_iter().filter_map(|t| t.top).collect();
        tops.extend(self.user.read().map(|u| u.build_cache_tops()).unwrap_or_default());
        for top in tops {
            match self.layers.chain(&top) {
                Ok(chain) => keep.extend(chain.into_iter().map(|m| m.key)),
                Err(_) => {
                    keep.insert(top);
                }
            }
        }
        keep
    }

    fn set(&self, name: &str, state: State) {
        if let Ok(mut s) = self.states.lock() {
            s.insert(name.to_string(), state);
        }
    }

    /// Take `rootfs` as built-in `name`'s built root (unit tests, whose
    /// fake engine never reads it).
    #[cfg(test)]
    pub(crate) fn pretend_built(&self, name: &str, rootfs: PathBuf) {
        self.set(name, State::Ready(rootfs));
    }

    /// Mark templates already built as ready (cheap; no building).
    pub fn scan(&self) {
        for name in &self.order {
            if let Some(recipe) = self.store.recipe(name) {
                if let Ok(Some(built)) = self.store.lookup(&recipe) {
                    seal(&built.rootfs);
                    self.set(name, State::Ready(built.rootfs));
                }
            }
        }
    }

    /// With building disabled, say how to build what is missing instead of
    /// "queued" forever.
    pub fn mark_unbuilt(&self) {
        for name in &self.order {
            if !self.is_ready(name) {
                self.set(name, State::Failed(format!("not built: run `forkbox template build {name}`")));
            }
        }
    }

    /// Build every missing built-in, in order; blocking (run it on a thread).
    pub fn build_all(&self) {
        for name in self.order.clone() {
            let Some(recipe) = self.store.recipe(&name) else { continue };
            self.build_one(&name, &recipe);
        }
    }

    fn build_one(&self, name: &str, recipe: &Recipe) {
        if let Ok(Some(built)) = self.store.lookup(recipe) {
            seal(&built.rootfs);
            self.set(name, State::Ready(built.rootfs));
            return;
        }
        tracing::info!(template = name, "building template (first start: a few minutes)");
        let progress = ServerProgress { templates: self.clone(), name: name.to_string() };
        self.set(name, State::Building { done: 0, total: 1, message: "starting".into() });
        match self.store.build(recipe, &progress) {
            Ok(built) => {
                tracing::info!(template = name, rootfs = %built.rootfs.display(), "template ready");
                seal(&built.rootfs);
                self.set(name, State::Ready(built.rootfs));
            }
            Err(e) => {
                tracing::error!(template = name, err = %e, "template build failed");
                self.set(name, State::Failed(e.to_string()));
            }
        }
    }

    /// The root filesystem of a ready template, or the API error to answer.
    pub fn rootfs(&self, name: &str) -> Result<Root, Error> {
        if !self.is_builtin(name) {
            let t = self.custom(name).ok_or_else(|| self.unknown(name))?;
            return self.layers_root(&t).map_err(|e| Error::Internal(format!("template `{name}`: {e}")));
        }
        let states = self.states.lock().map_err(|_| Error::Internal("template state".into()))?;
        match states.get(name) {
            None => Err(Error::NotFound(format!("unknown template `{name}` (known: {})", self.order.join(", ")))),
            Some(State::Ready(p)) => Ok(Root::single(p.clone())),
            Some(State::Failed(e)) => Err(Error::Unavailable { message: format!("template `{name}` failed to build: {e}"), progress: None }),
            Some(State::Queued) => Err(Error::Unavailable { message: format!("template `{name}` is queued for building"), progress: Some(0.0) }),
            Some(State::Building { done, total, message }) => {
                let p = fraction(*done, *total);
                Err(Error::Unavailable { message: format!("template `{name}` is still building ({:.0}%: {message})", p * 100.0), progress: Some(p) })
            }
        }
    }

    /// The root filesystem of `name` as `pinned` names it: the built-in's
    /// version something was made on (a Space frozen before the built-in
    /// was rebuilt, e.g. from another Debian), while that version is on
    /// disk; else the current one.
    pub fn rootfs_pinned(&self, name: &str, pinned: Option<&Path>) -> Result<Root, Error> {
        let current = self.rootfs(name);
        let Some(pinned) = pinned.filter(|p| self.is_builtin(name) && self.is_version_of(name, p)) else { return current };
        if current.as_ref().is_ok_and(|root| root.rootfs == pinned) {
            return current;
        }
        tracing::info!(template = name, rootfs = %pinned.display(), "starting on the template version it was made on, not the current one");
        seal(pinned);
        Ok(Root::single(pinned.to_path_buf()))
    }

    /// Whether `rootfs` is a built version of built-in `name` in this store
    /// (a path from a Space's metadata is not trusted to point elsewhere).
    fn is_version_of(&self, name: &str, rootfs: &Path) -> bool {
        self.store.versions(name).iter().any(|v| v.rootfs == rootfs)
    }

    pub fn is_ready(&self, name: &str) -> bool {
        if !self.is_builtin(name) {
            return self.custom(name).is_some();
        }
        matches!(self.states.lock().ok().and_then(|s| s.get(name).cloned()), Some(State::Ready(_)))
    }

    /// Built-ins, then the custom templates `caller` may see, by name.
    pub fn list(&self, caller: &Caller) -> Vec<TemplateInfo> {
        let mut out = self.builtins();
        let mut custom: Vec<UserTemplate> = self.customs().into_iter().filter(|t| self.check_visible(caller, &t.name).is_ok()).collect();
        custom.sort_by(|a, b| a.name.cmp(&b.name));
        out.extend(custom.iter().map(|t| self.custom_info(t)));
        out
    }

    /// What `GET /v1/templates/{name}` shows (`in_use` is the caller's to fill).
    pub fn info(&self, caller: &Caller, name: &str) -> Result<TemplateInfo, Error> {
        self.check_visible(caller, name)?;
        match self.custom(name) {
            Some(t) => Ok(self.custom_info(&t)),
            None => self.builtins().into_iter().find(|i| i.name == name).ok_or_else(|| self.unknown(name)),
        }
    }

    pub fn custom_info(&self, t: &UserTemplate) -> TemplateInfo {
        let chain = t.top.as_deref().and_then(|k| self.layers.chain(k).ok()).unwrap_or_default();
        let own: u64 = chain.iter().take_while(|m| Some(&m.key) != t.base_top.as_ref()).map(|m| m.bytes).sum();
        TemplateInfo {
            name: t.name.clone(),
            state: "ready".into(),
            progress: 1.0,
            error: None,
            kind: t.kind.clone(),
            description: t.description.clone(),
            base: Some(t.base.clone()),
            created_at: t.created_at,
            size_bytes: own,
            layers: chain.len() as u32 + 1,
            preimport: self.preimport(&t.name),
            limits: t.limits,
            recipe: t.recipe.clone().map(Box::new),
            saved_from: t.saved_from.clone(),
            unsaved: t.unsaved.clone(),
            in_use: Default::default(),
        }
    }

    fn builtins(&self) -> Vec<TemplateInfo> {
        let states = self.states.lock().map(|s| s.clone()).unwrap_or_default();
        self.order
            .iter()
            .map(|name| {
                let (state, progress, error) = match states.get(name) {
                    Some(State::Ready(_)) => ("ready", 1.0, None),
                    Some(State::Building { done, total, .. }) => ("building", fraction(*done, *total), None),
                    Some(State::Failed(e)) => ("failed", 0.0, Some(e.clone())),
                    _ => ("queued", 0.0, None),
                };
                TemplateInfo {
                    name: name.clone(),
                    state: state.into(),
                    progress,
                    error,
                    kind: "builtin".into(),
                    layers: 1,
                    preimport: builtin_preimport(name).iter().map(|m| m.to_string()).collect(),
                    ..Default::default()
                }
            })
            .collect()
    }
}

/// Modules the warm REPL of a built-in imports: what it ships for data work.
fn builtin_preimport(template: &str) -> &'static [&'static str] {
    match template {
        "python-datasci" => &["numpy", "pandas", "matplotlib", "matplotlib.pyplot", "scipy", "sklearn"],
        "default" => &["numpy", "pandas"],
        _ => &[],
    }
}

/// Make a ready template's root filesystem read-only on the host, with a
/// bind mount of it onto itself that stays after the server (one per
/// template, however many servers share it). Every sandbox of the template
/// uses it as its lower layer, so deleting or editing its files would pull
/// them from under all of them at once; sealed, a `rm -rf` fails with
/// EROFS/EBUSY and changes nothing (tests/e2e/test_faults.py).
fn seal(rootfs: &Path) {
    use nix::mount::{mount, MsFlags};
    if layers::is_mount_root(rootfs) {
        return;
    }
    let done = mount(Some(rootfs), rootfs, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .and_then(|()| mount(None::<&str>, rootfs, None::<&str>, MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY, None::<&str>));
    if let Err(e) = done {
        tracing::warn!(rootfs = %rootfs.display(), err = %e, "could not seal the template read-only");
    }
}

fn fraction(done: u64, total: u64) -> f32 {
    if total == 0 {
        0.0
    } else {
        (done as f32 / total as f32).min(0.99)
    }
}

struct ServerProgress {
    templates: Templates,
    name: String,
}

impl ServerProgress {
    fn update(&self, f: impl FnOnce(&mut u64, &mut u64, &mut String)) {
        if let Ok(mut states) = self.templates.states.lock() {
            if let Some(State::Building { done, total, message }) = states.get_mut(&self.name) {
                f(done, total, message);
            }
        }
    }
}

impl Progress for ServerProgress {
    fn begin(&self, _template: &str, total_steps: u64) {
        self.update(|d, t, _| {
            *d = 0;
            *t = total_steps.max(1);
        });
    }
    fn advance(&self, steps: u64, message: &str) {
        let name = &self.name;
        self.update(|d, t, m| {
            let before = *d * 10 / (*t).max(1);
            *d += steps;
            *m = message.to_string();
            // A line per 10%: the server's log shows background builds moving.
            if *d * 10 / (*t).max(1) > before {
                tracing::info!(template = %name, percent = (*d * 100 / (*t).max(1)).min(99), step = %m, "building template");
            }
        });
    }
    fn message(&self, message: &str) {
        self.update(|_, _, m| *m = message.to_string());
    }
    fn finish(&self, _template: &str) {}
    fn set_total(&self, total_steps: u64) {
        self.update(|_, t, _| *t = total_steps.max(1));
    }
}
