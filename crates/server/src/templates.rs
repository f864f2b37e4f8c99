//! Built-in templates as the server sees them: built in the background at
//! start (`default` first), with their state and progress, so a create from
//! a template still building answers 503 with its progress.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use protocol::TemplateInfo;
use template::{Progress, Recipe, TemplateStore};

use crate::error::ApiError;

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
}

impl Templates {
    pub fn new(root: PathBuf) -> Templates {
        let order: Vec<String> = template::builtin_names().iter().map(|s| s.to_string()).collect();
        let states = order.iter().map(|n| (n.clone(), State::Queued)).collect();
        Templates { store: TemplateStore::new(root), states: Arc::new(Mutex::new(states)), order }
    }

    fn set(&self, name: &str, state: State) {
        if let Ok(mut s) = self.states.lock() {
            s.insert(name.to_string(), state);
        }
    }

    /// Mark templates already built as ready (cheap; no building).
    pub fn scan(&self) {
        for name in &self.order {
            if let Some(recipe) = template::builtin(name) {
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
            let Some(recipe) = template::builtin(&name) else { continue };
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
    pub fn rootfs(&self, name: &str) -> Result<PathBuf, ApiError> {
        let states = self.states.lock().map_err(|_| ApiError::Internal("template state".into()))?;
        match states.get(name) {
            None => Err(ApiError::NotFound(format!("unknown template `{name}` (known: {})", self.order.join(", ")))),
            Some(State::Ready(p)) => Ok(p.clone()),
            Some(State::Failed(e)) => Err(ApiError::Unavailable { message: format!("template `{name}` failed to build: {e}"), progress: None }),
            Some(State::Queued) => Err(ApiError::Unavailable { message: format!("template `{name}` is queued for building"), progress: Some(0.0) }),
            Some(State::Building { done, total, message }) => {
                let p = fraction(*done, *total);
                Err(ApiError::Unavailable { message: format!("template `{name}` is still building ({:.0}%: {message})", p * 100.0), progress: Some(p) })
            }
        }
    }

    pub fn is_ready(&self, name: &str) -> bool {
        matches!(self.states.lock().ok().and_then(|s| s.get(name).cloned()), Some(State::Ready(_)))
    }

    pub fn list(&self) -> Vec<TemplateInfo> {
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
                TemplateInfo { name: name.clone(), state: state.into(), progress, error, kind: "builtin".into(), ..Default::default() }
            })
            .collect()
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
    let sealed = rustix::fs::statx(rustix::fs::CWD, rootfs, rustix::fs::AtFlags::empty(), rustix::fs::StatxFlags::BASIC_STATS)
        .map(|st| st.stx_attributes.contains(rustix::fs::StatxAttributes::MOUNT_ROOT));
    if matches!(sealed, Ok(true)) {
        return;
    }
    let done = mount(Some(rootfs), rootfs, None::<&str>, MsFlags::MS_BIND, None::<&str>).and_then(|()| {
        mount(None::<&str>, rootfs, None::<&str>, MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY, None::<&str>)
    });
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
