//! API keys and quotas (docs/operations.md#api-keys): who is calling, and
//! what they may use.
//!
//! Keys are held only as SHA-256 hashes: those given with `--api-key` are
//! hashed at start, and the keys file `<state>/keys.json` (mode 0600,
//! managed by `forkbox key add|list|remove`) stores nothing else. Each key
//! has a name, which is what owns sandboxes and Spaces: a `--api-key` key
//! is named `api-key-` and the start of its hash, so the name (and the
//! ownership of what it made) survives a restart.
//!
//! The keys file is read again whenever it changes (a `stat` per request,
//! compared with the last one's), so `key add` and `key remove` act at once.
//! Whether keys are required at all is settled at start: a server that
//! started with no keys stays open (it listens on loopback only), and one
//! that started with keys never turns open, even if every key is removed.
//!
//! Quotas are per key name: live sandboxes (fork children count), the sum
//! of their memory limits, and fork children per sliding minute. A create or
//! fork reserves what it will use before it starts (`Quotas::reserve`), under
//! one lock, so concurrent requests cannot overshoot; a request that fails
//! hands its reservation back, and one that succeeds keeps it charged until
//! its sandboxes leave the registry (`Quotas::release`).

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The window of the forks-per-minute limit.
pub const FORK_WINDOW: Duration = Duration::from_secs(60);
/// `Retry-After` of a refusal that only a sandbox ending can lift (seconds).
pub const RETRY_AFTER_LIVE: u64 = 1;
/// Prefix of generated keys (so a leaked one is recognisable).
const KEY_PREFIX: &str = "fbk_";
/// Prefix of the names of keys given with `--api-key`.
const FLAG_KEY_PREFIX: &str = "api-key-";

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("read {path}: {err}")]
    Read { path: String, err: std::io::Error },
    #[error("{path} is not a valid keys file: {err}")]
    Parse { path: String, err: serde_json::Error },
    #[error("write {path}: {err}")]
    Write { path: String, err: std::io::Error },
    #[error("invalid key name `{0}`: use 1 to 64 letters, digits, `-`, `_` or `.`, not starting with `api-key-`")]
    InvalidName(String),
    #[error("a key named `{0}` exists already")]
    Exists(String),
    #[error("no key named `{0}`")]
    NoSuchKey(String),
}

/// SHA-256 of a key.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct KeyHash([u8; 32]);

impl KeyHash {
    pub fn of(key: &str) -> KeyHash {
        KeyHash(Sha256::digest(key.as_bytes()).into())
    }

    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }

    fn parse(s: &str) -> Option<KeyHash> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).ok()?;
        Some(KeyHash(out))
    }

    /// Constant-time comparison (the hash of a guess says nothing useful
    /// about the key, but this costs nothing).
    fn matches(&self, other: &KeyHash) -> bool {
        self.0.iter().zip(other.0.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }

    /// The name of a key given with `--api-key`: stable across restarts.
    pub fn flag_name(&self) -> String {
        format!("{FLAG_KEY_PREFIX}{}", &self.hex()[..12])
    }
}

impl std::fmt::Debug for KeyHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyHash({}…)", &self.hex()[..12])
    }
}

pub use protocol::keys::KeyLimits;

/// One key of the keys file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredKey {
    pub name: String,
    /// Hex SHA-256 of the key.
    pub sha256: String,
    /// Milliseconds since the epoch.
    pub created: u64,
    #[serde(default)]
    pub limits: KeyLimits,
}

/// `<state>/keys.json`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct KeyFile {
    pub keys: Vec<StoredKey>,
}

pub fn key_file_path(state_dir: &Path) -> PathBuf {
    state_dir.join("keys.json")
}

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && !name.starts_with(FLAG_KEY_PREFIX) && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

impl KeyFile {
    /// The file at `path`; a missing file has no keys.
    pub fn load(path: &Path) -> Result<KeyFile, KeyError> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|err| KeyError::Parse { path: path.display().to_string(), err }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(KeyFile::default()),
            Err(err) => Err(KeyError::Read { path: path.display().to_string(), err }),
        }
    }

    /// Write it whole, mode 0600, by a rename (a reader sees the old file
    /// or the new one).
    pub fn save(&self, path: &Path) -> Result<(), KeyError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let err = |err| KeyError::Write { path: path.display().to_string(), err };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).map_err(err)?;
        let body = serde_json::to_vec_pretty(self).map_err(|e| err(std::io::Error::other(e)))?;
        f.write_all(&body).and_then(|()| f.sync_all()).map_err(err)?;
        std::fs::rename(&tmp, path).map_err(err)
    }

    /// Add a key named `name`; returns the key itself, which is stored
    /// nowhere (only its hash is).
    pub fn add(&mut self, name: &str, limits: KeyLimits) -> Result<String, KeyError> {
        if !valid_name(name) {
            return Err(KeyError::InvalidName(name.chars().take(80).collect()));
        }
        if self.keys.iter().any(|k| k.name == name) {
            return Err(KeyError::Exists(name.to_string()));
        }
        let mut secret = [0u8; 32];
        rand::rng().fill_bytes(&mut secret);
        let key = format!("{KEY_PREFIX}{}", hex::encode(secret));
        let created = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
        self.keys.push(StoredKey { name: name.to_string(), sha256: KeyHash::of(&key).hex(), created, limits });
        Ok(key)
    }

    pub fn remove(&mut self, name: &str) -> Result<(), KeyError> {
        let before = self.keys.len();
        self.keys.retain(|k| k.name != name);
        if self.keys.len() == before {
            return Err(KeyError::NoSuchKey(name.to_string()));
        }
        Ok(())
    }
}

/// A key as the server knows it: its name (what owns sandboxes) and limits.
#[derive(Debug)]
pub struct Tenant {
    pub name: String,
    pub limits: KeyLimits,
}

/// Who is calling. Handlers get it from the auth layer and pass it to
/// every `Service` call that reaches a sandbox, checkpoint or Space, which
/// answers 404 for one the caller does not own.
#[derive(Debug, Clone)]
pub struct Caller(Access);

#[derive(Debug, Clone)]
enum Access {
    /// The server has no keys (or it is the server itself): everything.
    All,
    Key(Arc<Tenant>),
}

impl Caller {
    /// The caller of a server without keys.
    pub fn anonymous() -> Caller {
        Caller(Access::All)
    }

    /// The server itself (timers, shutdown): sees every sandbox.
    pub(crate) fn server() -> Caller {
        Caller(Access::All)
    }

    pub fn key(tenant: Arc<Tenant>) -> Caller {
        Caller(Access::Key(tenant))
    }

    /// The owner of what this caller creates (`None` without keys).
    pub fn owner(&self) -> Option<String> {
        match &self.0 {
            Access::All => None,
            Access::Key(t) => Some(t.name.clone()),
        }
    }

    /// The key's limits (`None`: no limits apply).
    pub fn limits(&self) -> Option<KeyLimits> {
        match &self.0 {
            Access::All => None,
            Access::Key(t) => Some(t.limits),
        }
    }

    /// Whether this caller may see and touch something owned by `owner`.
    /// Something without an owner (made by a server without keys) is
    /// reachable only without keys.
    pub fn may_use(&self, owner: Option<&str>) -> bool {
        match &self.0 {
            Access::All => true,
            Access::Key(t) => owner == Some(t.name.as_str()),
        }
    }
}

/// The size, mtime and inode of the keys file when last read.
type Stamp = Option<(u64, SystemTime, u64)>;

fn stamp(path: &Path) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.len(), m.modified().ok()?, m.ino()))
}

/// Accepted keys: each hash with the tenant it stands for.
type Known = Vec<(KeyHash, Arc<Tenant>)>;

/// `keys` as accepted keys; one with an invalid hash (from `source`) is
/// left out, and logged.
fn known(keys: Vec<StoredKey>, source: &str) -> Known {
    keys.into_iter()
        .filter_map(|k| {
            let hash = KeyHash::parse(&k.sha256);
            if hash.is_none() {
                tracing::error!(key = %k.name, "{source} has a key with an invalid hash; ignoring it");
            }
            Some((hash?, Arc::new(Tenant { name: k.name, limits: k.limits })))
        })
        .collect()
}

/// The keys a server accepts.
pub struct KeyRing {
    /// Whether a key is required by this server's own keys (settled at
    /// start); a cluster node's also while its cluster has keys.
    required: bool,
    flags: Known,
    path: PathBuf,
    /// The keys file's keys, and its stamp when they were read.
    file: Mutex<(Stamp, Known)>,
    /// A cluster's keys (a node follows them in etcd; docs/cluster.md).
    cluster: Mutex<Known>,
}

impl KeyRing {
    /// `flags`: hashes of the `--api-key` keys, with `defaults` as their
    /// limits; `path`: the keys file.
    pub fn new(flags: &[KeyHash], defaults: KeyLimits, path: PathBuf) -> KeyRing {
        let flags: Known = flags.iter().map(|h| (*h, Arc::new(Tenant { name: h.flag_name(), limits: defaults }))).collect();
        let ring = KeyRing { required: false, flags, path, file: Mutex::new((None, Vec::new())), cluster: Mutex::new(Vec::new()) };
        ring.refresh();
        let required = !ring.flags.is_empty() || !ring.file.lock().map(|f| f.1.is_empty()).unwrap_or(true);
        KeyRing { required, ..ring }
    }

    pub fn required(&self) -> bool {
        self.required || self.cluster.lock().map(|c| !c.is_empty()).unwrap_or(true)
    }

    /// The cluster's keys now (replacing the last set): while it has any,
    /// every call needs one (docs/cluster.md#keys).
    pub fn set_cluster_keys(&self, keys: Vec<StoredKey>) {
        let known = known(keys, "the cluster");
        if let Ok(mut c) = self.cluster.lock() {
            *c = known;
        }
    }

    /// Read the keys file again if it changed since the last look. A file
    /// that cannot be read or parsed counts as having no keys (logged).
    fn refresh(&self) {
        let now = stamp(&self.path);
        let Ok(mut file) = self.file.lock() else { return };
        if file.0 == now {
            return;
        }
        let keys = match KeyFile::load(&self.path) {
            Ok(f) => known(f.keys, "the keys file"),
            Err(e) => {
                tracing::error!(err = %e, "could not read the keys file; its keys are refused until it is fixed");
                Vec::new()
            }
        };
        *file = (now, keys);
    }

    /// Whether a key of this name is accepted now (one removed with
    /// `forkbox key remove` is not).
    pub fn has_name(&self, name: &str) -> bool {
        if self.flags.iter().any(|(_, t)| t.name == name) {
            return true;
        }
        if self.cluster.lock().map(|c| c.iter().any(|(_, t)| t.name == name)).unwrap_or(false) {
            return true;
        }
        self.refresh();
        self.file.lock().map(|f| f.1.iter().any(|(_, t)| t.name == name)).unwrap_or(false)
    }

    /// The caller presenting `key` (the bearer token), if it is accepted.
    pub fn resolve(&self, key: Option<&str>) -> Option<Caller> {
        if !self.required() {
            return Some(Caller::anonymous());
        }
        let hash = KeyHash::of(key?);
        if let Some((_, t)) = self.flags.iter().find(|(h, _)| h.matches(&hash)) {
            return Some(Caller::key(Arc::clone(t)));
        }
        if let Some(t) = self.cluster.lock().ok().and_then(|c| c.iter().find(|(h, _)| h.matches(&hash)).map(|(_, t)| Arc::clone(t))) {
            return Some(Caller::key(t));
        }
        self.refresh();
        let file = self.file.lock().ok()?;
        file.1.iter().find(|(h, _)| h.matches(&hash)).map(|(_, t)| Caller::key(Arc::clone(t)))
    }
}

/// Which limit refused a request (the `limit` label of
/// `forkbox_quota_refusals_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Sandboxes,
    ForksPerMinute,
    Memory,
}

impl Limit {
    pub fn label(self) -> &'static str {
        match self {
            Limit::Sandboxes => "max_sandboxes",
            Limit::ForksPerMinute => "forks_per_minute",
            Limit::Memory => "max_memory_mib",
        }
    }
}

/// A refused reservation: which limit, a message with the key's usage,
/// and when to try again.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub limit: Limit,
    pub message: String,
    pub retry_after_s: u64,
}

/// What one key uses now (reservations included).
#[derive(Debug, Default)]
struct Usage {
    sandboxes: u64,
    memory_mib: u64,
    /// Fork children made in the last minute: (when, how many, ticket).
    forks: VecDeque<(Instant, u64, u64)>,
}

impl Usage {
    fn prune(&mut self, now: Instant) {
        while self.forks.front().is_some_and(|(at, _, _)| now.saturating_duration_since(*at) >= FORK_WINDOW) {
            self.forks.pop_front();
        }
    }

    fn forks_in_window(&self) -> u64 {
        self.forks.iter().map(|(_, n, _)| n).sum()
    }

    /// Seconds until enough of the window's forks expire for `n` more
    /// under `limit` (a whole minute when `n` alone is over it).
    fn fork_retry_after(&self, limit: u64, n: u64, now: Instant) -> u64 {
        if n > limit {
            return FORK_WINDOW.as_secs();
        }
        let mut used = self.forks_in_window();
        for (at, k, _) in &self.forks {
            used -= k;
            if used + n <= limit {
                let free_at = *at + FORK_WINDOW;
                return free_at.saturating_duration_since(now).as_secs_f64().ceil().max(1.0) as u64;
            }
        }
        FORK_WINDOW.as_secs()
    }
}

/// What a reservation charged, to hand back if it is not used.
#[derive(Debug)]
struct Charge {
    owner: String,
    sandboxes: u64,
    memory_mib: u64,
    fork_ticket: Option<u64>,
}

/// Usage per key name.
#[derive(Default)]
pub struct Quotas {
    usage: Mutex<HashMap<String, Usage>>,
    tickets: std::sync::atomic::AtomicU64,
}

impl Quotas {
    fn usage(&self) -> std::sync::MutexGuard<'_, HashMap<String, Usage>> {
        self.usage.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reserve `n` sandboxes of `ram_mib` each for `owner`, made by a fork
    /// when `fork`, checking `limits` (`None`: only count). All or nothing.
    pub fn reserve(&self, owner: Option<&str>, limits: Option<KeyLimits>, n: u64, ram_mib: u64, fork: bool, now: Instant) -> Result<Reservation<'_>, Refusal> {
        let Some(owner) = owner else { return Ok(Reservation { quotas: self, charge: None }) };
        let mut all = self.usage();
        let u = all.entry(owner.to_string()).or_default();
        u.prune(now);
        let limits = limits.unwrap_or_default();
        if let Some(max) = limits.max_sandboxes {
            if u.sandboxes + n > max {
                return Err(Refusal {
                    limit: Limit::Sandboxes,
                    message: format!("key `{owner}` may have {max} live sandboxes (max_sandboxes); it has {}, and this asks for {n} more", u.sandboxes),
                    retry_after_s: RETRY_AFTER_LIVE,
                });
            }
        }
        let memory = n * ram_mib;
        if let Some(max) = limits.max_memory_mib {
            if u.memory_mib + memory > max {
                return Err(Refusal {
                    limit: Limit::Memory,
                    message: format!(
                        "key `{owner}` may have {max} MiB of sandbox memory limits (max_memory_mib); its sandboxes have {} MiB, and this asks for {memory} MiB more",
                        u.memory_mib
                    ),
                    retry_after_s: RETRY_AFTER_LIVE,
                });
            }
        }
        if let (true, Some(max)) = (fork, limits.forks_per_minute) {
            let used = u.forks_in_window();
            if used + n > max {
                return Err(Refusal {
                    limit: Limit::ForksPerMinute,
                    message: format!(
                        "key `{owner}` may fork {max} children per minute (forks_per_minute); it forked {used} in the last minute, and this asks for {n}"
                    ),
                    retry_after_s: u.fork_retry_after(max, n, now),
                });
            }
        }
        let fork_ticket = fork.then(|| {
            let t = self.tickets.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            u.forks.push_back((now, n, t));
            t
        });
        u.sandboxes += n;
        u.memory_mib += memory;
        Ok(Reservation { quotas: self, charge: Some(Charge { owner: owner.to_string(), sandboxes: n, memory_mib: memory, fork_ticket }) })
    }

    /// Count a sandbox that exists already (one adopted after a restart).
    pub fn charge(&self, owner: &str, ram_mib: u64) {
        let mut all = self.usage();
        let u = all.entry(owner.to_string()).or_default();
        u.sandboxes += 1;
        u.memory_mib += ram_mib;
    }

    /// A sandbox of `owner` with `ram_mib` left the registry.
    pub fn release(&self, owner: &str, ram_mib: u64) {
        let mut all = self.usage();
        if let Some(u) = all.get_mut(owner) {
            u.sandboxes = u.sandboxes.saturating_sub(1);
            u.memory_mib = u.memory_mib.saturating_sub(ram_mib);
        }
    }

    /// `owner`'s live sandboxes and their memory limits (for tests and logs).
    pub fn used(&self, owner: &str) -> (u64, u64) {
        self.usage().get(owner).map_or((0, 0), |u| (u.sandboxes, u.memory_mib))
    }

    fn undo(&self, c: &Charge) {
        let mut all = self.usage();
        if let Some(u) = all.get_mut(&c.owner) {
            u.sandboxes = u.sandboxes.saturating_sub(c.sandboxes);
            u.memory_mib = u.memory_mib.saturating_sub(c.memory_mib);
            if let Some(t) = c.fork_ticket {
                u.forks.retain(|(_, _, ticket)| *ticket != t);
            }
        }
    }
}

/// Sandboxes reserved against a key's quotas: handed back when dropped,
/// unless `commit`ted (they went live, and are released one by one as
/// they leave the registry).
#[must_use]
pub struct Reservation<'a> {
    quotas: &'a Quotas,
    charge: Option<Charge>,
}

impl Reservation<'_> {
    pub fn commit(mut self) {
        self.charge = None;
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.charge.take() {
            self.quotas.undo(&c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(s: Option<u64>, f: Option<u64>, m: Option<u64>) -> Option<KeyLimits> {
        Some(KeyLimits { max_sandboxes: s, forks_per_minute: f, max_memory_mib: m })
    }

    #[test]
    fn hashes_are_sha256_and_names_stable() {
        let h = KeyHash::of("abc");
        assert_eq!(h.hex(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(KeyHash::parse(&h.hex()), Some(h));
        assert_eq!(h.flag_name(), "api-key-ba7816bf8f01");
        assert!(!format!("{h:?}").contains("abc"));
    }

    #[test]
    fn the_file_holds_hashes_only_with_mode_0600() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("forkbox-keys-test-{}", std::process::id()));
        let path = key_file_path(&dir);
        let mut f = KeyFile::load(&path).unwrap();
        assert!(f.keys.is_empty());
        let key = f.add("alice", KeyLimits { max_sandboxes: Some(2), ..Default::default() }).unwrap();
        assert!(key.starts_with(KEY_PREFIX) && key.len() == KEY_PREFIX.len() + 64);
        assert!(matches!(f.add("alice", KeyLimits::default()), Err(KeyError::Exists(_))));
        assert!(matches!(f.add("api-key-x", KeyLimits::default()), Err(KeyError::InvalidName(_))));
        assert!(matches!(f.add("a/b", KeyLimits::default()), Err(KeyError::InvalidName(_))));
        f.save(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(&key) && !text.contains(&key[KEY_PREFIX.len()..]));
        assert!(text.contains(&KeyHash::of(&key).hex()));
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);

        let ring = KeyRing::new(&[KeyHash::of("flag")], KeyLimits::default(), path.clone());
        assert!(ring.required());
        assert_eq!(ring.resolve(Some(&key)).and_then(|c| c.owner()).as_deref(), Some("alice"));
        assert_eq!(ring.resolve(Some("flag")).and_then(|c| c.owner()), Some(KeyHash::of("flag").flag_name()));
        assert!(ring.resolve(Some("wrong")).is_none() && ring.resolve(None).is_none());
        // Removing the key takes effect without a restart.
        let mut f = KeyFile::load(&path).unwrap();
        f.remove("alice").unwrap();
        assert!(matches!(f.remove("alice"), Err(KeyError::NoSuchKey(_))));
        f.save(&path).unwrap();
        assert!(ring.resolve(Some(&key)).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_server_without_keys_stays_open() {
        let ring = KeyRing::new(&[], KeyLimits::default(), PathBuf::from("/nonexistent/keys.json"));
        assert!(!ring.required());
        let c = ring.resolve(None).unwrap();
        assert!(c.owner().is_none() && c.may_use(None) && c.may_use(Some("x")));
    }

    #[test]
    fn a_key_uses_only_its_own() {
        let c = Caller::key(Arc::new(Tenant { name: "a".into(), limits: KeyLimits::default() }));
        assert!(c.may_use(Some("a")));
        assert!(!c.may_use(Some("b")) && !c.may_use(None));
    }

    #[test]
    fn sandboxes_and_memory_at_the_edge() {
        let q = Quotas::default();
        let now = Instant::now();
        let l = limits(Some(2), None, Some(3000));
        let a = q.reserve(Some("k"), l, 1, 1000, false, now).unwrap();
        let b = q.reserve(Some("k"), l, 1, 1000, false, now).unwrap();
        let e = q.reserve(Some("k"), l, 1, 1000, false, now).err().unwrap();
        assert_eq!((e.limit, e.retry_after_s), (Limit::Sandboxes, RETRY_AFTER_LIVE));
        assert!(e.message.contains("has 2"), "{}", e.message);
        // Another key is counted apart; no owner is never counted.
        assert!(q.reserve(Some("other"), l, 2, 1000, false, now).is_ok());
        assert!(q.reserve(None, l, 100, 1000, false, now).is_ok());
        a.commit();
        drop(b); // a failed create hands its reservation back
        assert_eq!(q.used("k"), (1, 1000));
        let e = q.reserve(Some("k"), l, 1, 2001, false, now).err().unwrap();
        assert_eq!(e.limit, Limit::Memory);
        q.reserve(Some("k"), l, 1, 2000, false, now).unwrap().commit();
        assert_eq!(q.used("k"), (2, 3000));
        q.release("k", 1000);
        assert_eq!(q.used("k"), (1, 2000));
        q.charge("k", 10);
        assert_eq!(q.used("k"), (2, 2010));
    }

    #[test]
    fn forks_per_minute_slide_and_refuse_whole() {
        let q = Quotas::default();
        let t0 = Instant::now();
        let l = limits(None, Some(5), None);
        q.reserve(Some("k"), l, 3, 1, true, t0).unwrap().commit();
        let t1 = t0 + Duration::from_secs(20);
        q.reserve(Some("k"), l, 2, 1, true, t1).unwrap().commit();
        // Full: a fork of 2 waits for the first 3 to leave the window (40 s on).
        let e = q.reserve(Some("k"), l, 2, 1, true, t1).err().unwrap();
        assert_eq!((e.limit, e.retry_after_s), (Limit::ForksPerMinute, 40));
        // ... and nothing of it was charged.
        assert_eq!(q.used("k").0, 5);
        // A fork of 4 needs both marks gone: 60 s after t1, 30 s after t1 + 30 s.
        let e = q.reserve(Some("k"), l, 4, 1, true, t1 + Duration::from_secs(30)).err().unwrap();
        assert_eq!(e.retry_after_s, 30);
        // More than the limit can never fit.
        assert_eq!(q.reserve(Some("k"), l, 6, 1, true, t1).err().unwrap().retry_after_s, 60);
        // Creates are not forks.
        assert!(q.reserve(Some("k"), l, 1, 1, false, t1).is_ok());
        // Once the first mark slides out, 3 fit.
        let r = q.reserve(Some("k"), l, 3, 1, true, t0 + FORK_WINDOW).unwrap();
        // A failed fork leaves the window as it was.
        drop(r);
        q.reserve(Some("k"), l, 3, 1, true, t0 + FORK_WINDOW).unwrap().commit();
    }
}
