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
    step_key(&crate::ids::new_id(), &repl_host::events::now_ms().to_le_bytes())
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

    /// Where layer `key` lives (its `diff/`, `layer.json`, `repl/`).
    pub fn dir(&self, key: &str) -> PathBuf {
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
            nix::mount::mount(Some("overlay"), &rootfs, Some("overlay"), nix::mount::MsFlags::MS_RDONLY, Some(options.as_str())).map_err(io::Error::from)?;
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
                created_at: repl_host::events::now_ms(),
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

    /// The overlay's lower layers, top first.
    pub fn lowers(&self) -> Vec<PathBuf> {
        if self.layers.is_empty() {
            vec![self.rootfs.clone()]
        } else {
            self.layers.clone()
        }
    }

    /// A new sandbox on this root; `trust_layer`: the host's CAs over it.
    pub fn spec(self, id: String, limits: jail::Limits, initial_upper: Option<PathBuf>, trust_layer: Option<PathBuf>) -> jail::SandboxSpec {
        jail::SandboxSpec { id, template_rootfs: self.rootfs, template_layers: self.layers, trust_layer, limits, initial_upper, solo: false }
    }
}

/// Whether `path` is the root of a mount (a sealed or stacked template).
pub fn is_mount_root(path: &Path) -> bool {
    rustix::fs::statx(rustix::fs::CWD, path, rustix::fs::AtFlags::SYMLINK_NOFOLLOW, rustix::fs::StatxFlags::BASIC_STATS)
        .map(|st| st.stx_attributes.contains(rustix::fs::StatxAttributes::MOUNT_ROOT))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, LayerStore) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = LayerStore::new(dir.path().join("layers"));
        (dir, store)
    }

    fn add(store: &LayerStore, key: &str, parent: Option<&str>, file: &str) -> LayerMeta {
        store
            .commit(key, parent, Path::new("/base/rootfs"), "a step", |dir| {
                fs::create_dir_all(dir.join("diff/etc"))?;
                fs::write(dir.join("diff").join(file), "x")?;
                fs::write(dir.join("diff/etc/resolv.conf"), "nameserver 127.0.0.53")?;
                Ok(1)
            })
            .expect("commit")
    }

    #[test]
    fn step_keys_chain_their_parent_and_their_step() {
        let a = step_key("builtin:/t/default/1/rootfs", b"{\"run\":\"true\"}");
        assert!(is_key(&a), "{a}");
        assert_eq!(a, step_key("builtin:/t/default/1/rootfs", b"{\"run\":\"true\"}"));
        assert_ne!(a, step_key("builtin:/t/default/2/rootfs", b"{\"run\":\"true\"}"));
        assert_ne!(a, step_key("builtin:/t/default/1/rootfs", b"{\"run\":\"false\"}"));
        assert_ne!(unique_key(), unique_key());
    }

    #[test]
    fn a_committed_layer_is_whole_and_its_chain_walks_to_the_base() {
        let (_dir, store) = store();
        let (a, b) = (step_key("x", b"1"), step_key("x", b"2"));
        add(&store, &a, None, "one");
        let meta = add(&store, &b, Some(&a), "two");
        assert_eq!(meta.parent.as_deref(), Some(a.as_str()));
        let chain: Vec<String> = store.chain(&b).expect("chain").into_iter().map(|m| m.key).collect();
        assert_eq!(chain, vec![b.clone(), a.clone()]);
        // The sandbox's own network file is not part of a layer.
        assert!(!store.dir(&b).join("diff/etc/resolv.conf").exists());
        assert!(store.dir(&b).join("diff/two").exists());
        assert_eq!(store.all().len(), 2);
        // A failed fill leaves nothing, not even a partial directory.
        let c = step_key("x", b"3");
        assert!(store.commit(&c, Some(&b), Path::new("/base/rootfs"), "fails", |_| Err(io::Error::other("no"))).is_err());
        assert!(!store.exists(&c) && !store.root.join(format!("{c}{PARTIAL}")).exists());
        // A chain whose layer is missing is an error, not a shorter stack.
        fs::remove_dir_all(store.dir(&a)).expect("remove");
        assert!(store.chain(&b).is_err());
    }

    #[test]
    fn collect_keeps_what_is_kept_or_pinned_and_removes_the_rest() {
        let (_dir, store) = store();
        let keys: Vec<String> = (0..4).map(|i| step_key("x", &[i])).collect();
        for k in &keys {
            add(&store, k, None, "f");
        }
        fs::create_dir_all(store.root.join(format!("{}{PARTIAL}", step_key("y", b"left by a crash")))).expect("partial");
        let mut pins = store.pins();
        pins.add(&keys[1]);
        let keep: HashSet<String> = [keys[0].clone()].into();
        assert_eq!(store.collect(&keep), 2);
        let mut left = store.all();
        left.sort();
        let mut want = vec![keys[0].clone(), keys[1].clone()];
        want.sort();
        assert_eq!(left, want);
        assert_eq!(fs::read_dir(&store.root).expect("dir").count(), 2, "the partial directory went too");
        drop(pins);
        assert_eq!(store.collect(&keep), 1, "unpinned, it goes");
    }

    #[test]
    fn only_a_layers_own_rootfs_path_names_it() {
        let (_dir, store) = store();
        let k = step_key("x", b"1");
        assert_eq!(store.key_of_rootfs(&store.dir(&k).join("rootfs")), Some(k.clone()));
        assert_eq!(store.key_of_rootfs(&store.dir(&k).join("diff")), None);
        assert_eq!(store.key_of_rootfs(Path::new("/var/lib/forkbox/templates/default/abc/rootfs")), None);
        assert_eq!(store.key_of_rootfs(&store.root.join("not-a-key/rootfs")), None);
        assert!(store.meta("../../etc").is_none());
    }
}
