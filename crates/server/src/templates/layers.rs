//! Template layers (docs/templates.md#on-disk): what one build step, or one
//! saved sandbox, changed on top of its parent layer or a built-in root
//! filesystem. Layers are keyed by content (a step's key hashes its parent's
//! key and the step), so templates built on the same steps share them, and
//! a changed step rebuilds only from there.
//!
//! ```text
//! <user-dir>/layers/<key>/diff        the files, owners relative (uid 0 is root), overlayfs whiteouts for deletions
//! <user-dir>/layers/<key>/layer.json  LayerMeta
//! <user-dir>/layers/<key>/repl/       a saved sandbox's REPL state (.forkbox-space/state.pkl), if any
//! <user-dir>/layers/<key>/rootfs      the stack, mounted read-only: this layer over its parents over the built-in
//! ```
//!
//! Sandboxes use `rootfs` exactly as they use a built-in's root filesystem,
//! so nothing below the server knows a template has layers.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Layers under one template, built-in root filesystem not counted; also
/// keeps the overlay's option string well under a page.
pub const MAX_LAYERS: usize = 32;
/// Bump when a step's commands change what they put in a layer.
const LAYER_FORMAT: u32 = 1;
const META: &str = "layer.json";
/// Files of a sandbox's layer that belong to that sandbox alone.
const SANDBOX_OWN_FILES: &[&str] = &["etc/resolv.conf"];
const PARTIAL: &str = ".partial";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LayerMeta {
    pub key: String,
    /// The layer under this one (`None`: it sits on `base_rootfs` directly).
    pub parent: Option<String>,
    /// The built-in root filesystem at the bottom of the stack.
    pub base_rootfs: PathBuf,
    /// What made it, for people (`apt-get install jq`, `saved from sb-…`).
    pub step: String,
    /// File data in `diff`.
    pub bytes: u64,
    pub created_at: u64,
}

/// The layers of every custom template, under `<templates-dir>/.user/layers`.
#[derive(Clone)]
pub struct LayerStore {
    root: PathBuf,
    /// Layers a build or save in flight made or stands on: never collected.
    pinned: Arc<Mutex<HashSet<String>>>,
}

/// A key for a step on top of `below` (a parent layer's key, or the
/// identity of a built-in root filesystem).
pub fn step_key(below: &str, step: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(b"forkbox-layer\0");
    h.update(LAYER_FORMAT.to_le_bytes());
    h.update(below.as_bytes());
    h.update(b"\0");
    h.update(step);
    let mut key = hex::encode(h.finalize());
    key.truncate(20);
    key
}

/// A key nobody can build again: a saved sandbox is not a recipe.
pub fn unique_key() -> String {
    step_key(&crate::state::new_id(), &crate::events::now_ms().to_le_bytes())
}

fn is_key(s: &str) -> bool {
    s.len() == 20 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Layers a key pinned, released on drop.
pub struct Pins {
    store: LayerStore,
    keys: Vec<String>,
}

impl Pins {
    pub fn add(&mut self, key: &str) {
        if let Ok(mut p) = self.store.pinned.lock() {
            p.insert(key.to_string());
        }
        self.keys.push(key.to_string());
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        if let Ok(mut p) = self.store.pinned.lock() {
            for k in &self.keys {
                p.remove(k);
            }
        }
    }
}

impl LayerStore {
    pub fn new(root: PathBuf) -> LayerStore {
        LayerStore { root, pinned: Default::default() }
    }

    fn dir(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    pub fn pins(&self) -> Pins {
        Pins { store: self.clone(), keys: Vec::new() }
    }

    pub fn meta(&self, key: &str) -> Option<LayerMeta> {
        if !is_key(key) {
            return None;
        }
        let text = fs::read(self.dir(key).join(META)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    pub fn exists(&self, key: &str) -> bool {
        self.meta(key).is_some()
    }

    /// The layers from `key` down, top first (each one's metadata).
    pub fn chain(&self, key: &str) -> io::Result<Vec<LayerMeta>> {
        let mut out = Vec::new();
        let mut next = Some(key.to_string());
        while let Some(k) = next {
            if out.len() >= MAX_LAYERS {
                return Err(io::Error::other(format!("more than {MAX_LAYERS} layers")));
            }
            let meta = self.meta(&k).ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("layer {k} is missing")))?;
            next = meta.parent.clone();
            out.push(meta);
        }
        Ok(out)
    }

    /// Where a saved sandbox's REPL state is, if layer `key` has one.
    pub fn repl_state(&self, key: &str) -> Option<PathBuf> {
        let dir = self.dir(key).join("repl");
        dir.join(".forkbox-space/state.pkl").is_file().then_some(dir)
    }

    /// The stack from layer `key` down, for a sandbox: its layers (the
    /// overlay's lowers) and, for `diff` and for finding which layers a
    /// sandbox stands on, the stack mounted read-only as one directory
    /// (mounted if it is not yet, e.g. after a reboot; the mount outlives
    /// the server, like a built-in's seal).
    pub fn root(&self, key: &str) -> io::Result<Root> {
        let chain = self.chain(key)?;
        let base = &chain.last().expect("a chain has its own layer").base_rootfs;
        let mut layers: Vec<PathBuf> = chain.iter().map(|m| self.dir(&m.key).join("diff")).collect();
        layers.push(base.clone());
        let rootfs = self.dir(key).join("rootfs");
        if !is_mount_root(&rootfs) {
            fs::create_dir_all(&rootfs)?;
            let lower: Vec<String> = layers.iter().map(|p| p.display().to_string()).collect();
            if lower.iter().any(|p| p.contains([',', ':', '\\'])) {
                return Err(io::Error::other("a layer path has a character overlayfs options cannot carry"));
            }
            let options = format!("lowerdir={}", lower.join(":"));
            nix::mount::mount(Some("overlay"), &rootfs, Some("overlay"), nix::mount::MsFlags::MS_RDONLY, Some(options.as_str()))
                .map_err(io::Error::from)?;
        }
        Ok(Root { rootfs, layers })
    }

    /// The key of the layer whose `rootfs` is `path`, if it is one of ours.
    pub fn key_of_rootfs(&self, path: &Path) -> Option<String> {
        let rel = path.strip_prefix(&self.root).ok()?;
        let mut parts = rel.components();
        let key = parts.next()?.as_os_str().to_str()?.to_string();
        (parts.next()?.as_os_str() == "rootfs" && is_key(&key)).then_some(key)
    }

    /// Write a new layer: `fill` puts the files in the directory it is
    /// given (and returns their bytes); the layer appears whole or not at
    /// all. If another build made the same key meanwhile, that one stays.
    pub fn commit(
        &self,
        key: &str,
        parent: Option<&str>,
        base_rootfs: &Path,
        step: &str,
        fill: impl FnOnce(&Path) -> io::Result<u64>,
    ) -> io::Result<LayerMeta> {
        fs::create_dir_all(&self.root)?;
        let partial = self.root.join(format!("{key}{PARTIAL}"));
        let _ = fs::remove_dir_all(&partial);
        fs::create_dir(&partial)?;
        let done = (|| {
            let bytes = fill(&partial)?;
            // The network setup writes these for each sandbox; one sandbox's
            // copy must not become every sandbox's.
            for own in SANDBOX_OWN_FILES {
                let _ = fs::remove_file(partial.join("diff").join(own));
            }
            let meta = LayerMeta {
                key: key.to_string(),
                parent: parent.map(str::to_string),
                base_rootfs: base_rootfs.to_path_buf(),
                step: step.chars().take(300).collect(),
                bytes,
                created_at: crate::events::now_ms(),
            };
            fs::write(partial.join(META), serde_json::to_vec_pretty(&meta)?)?;
            rustix::fs::sync();
            Ok(meta)
        })();
        let meta = match done {
            Ok(m) => m,
            Err(e) => {
                let _ = fs::remove_dir_all(&partial);
                return Err(e);
            }
        };
        match fs::rename(&partial, self.dir(key)) {
            Ok(()) => Ok(meta),
            Err(_) if self.exists(key) => {
                let _ = fs::remove_dir_all(&partial);
                self.meta(key).ok_or_else(|| io::Error::other("layer vanished"))
            }
            Err(e) => {
                let _ = fs::remove_dir_all(&partial);
                Err(e)
            }
        }
    }

    /// Unmount every stack (a graceful shutdown: nothing runs on them any
    /// more, and the next start mounts what it needs).
    pub fn unmount_all(&self) {
        for key in self.all() {
            let rootfs = self.dir(&key).join("rootfs");
            if is_mount_root(&rootfs) {
                let _ = nix::mount::umount2(&rootfs, nix::mount::MntFlags::MNT_DETACH);
            }
        }
    }

    pub fn all(&self) -> Vec<String> {
        let Ok(dir) = fs::read_dir(&self.root) else { return Vec::new() };
        dir.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| is_key(n)).collect()
    }

    /// Remove every layer not in `keep` (nor pinned), and leftovers of
    /// commits a crash cut short. Returns how many layers went.
    pub fn collect(&self, keep: &HashSet<String>) -> usize {
        let pinned = self.pinned.lock().map(|p| p.clone()).unwrap_or_default();
        let mut removed = 0;
        if let Ok(dir) = fs::read_dir(&self.root) {
            for e in dir.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                let partial = name.strip_suffix(PARTIAL).is_some_and(|k| !pinned.contains(k));
                let unused = is_key(&name) && !keep.contains(&name) && !pinned.contains(&name);
                if !(partial || unused) {
                    continue;
                }
                let rootfs = e.path().join("rootfs");
                if is_mount_root(&rootfs) {
                    let _ = nix::mount::umount2(&rootfs, nix::mount::MntFlags::MNT_DETACH);
                }
                match fs::remove_dir_all(e.path()) {
                    Ok(()) => removed += usize::from(unused),
                    Err(err) => tracing::warn!(layer = %name, err = %err, "could not remove an unused template layer"),
                }
            }
        }
        removed
    }
}

/// What a sandbox of a template is made on.
#[derive(Debug, Clone)]
pub struct Root {
    /// The template's files as one directory on the host.
    pub rootfs: PathBuf,
    /// The overlay's lower layers, top first (empty: `rootfs` alone).
    pub layers: Vec<PathBuf>,
}

impl Root {
    /// A built-in's root filesystem.
    pub fn single(rootfs: PathBuf) -> Root {
        Root { rootfs, layers: Vec::new() }
    }

    pub fn spec(self, id: String, limits: jail::Limits, initial_upper: Option<PathBuf>) -> jail::SandboxSpec {
        jail::SandboxSpec { id, template_rootfs: self.rootfs, template_layers: self.layers, limits, initial_upper }
    }
}

/// Whether `path` is the root of a mount (a sealed or stacked template).
pub fn is_mount_root(path: &Path) -> bool {
    rustix::fs::statx(rustix::fs::CWD, path, rustix::fs::AtFlags::SYMLINK_NOFOLLOW, rustix::fs::StatxFlags::BASIC_STATS)
        .map(|st| st.stx_attributes.contains(rustix::fs::StatxAttributes::MOUNT_ROOT))
        .unwrap_or(false)
}
