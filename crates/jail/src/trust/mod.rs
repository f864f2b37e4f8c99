//! Sandboxes trust what the host trusts (docs/network.md#host-cas): the CAs
//! an operator added to the host (`/usr/local/share/ca-certificates`, or a
//! bundle named with `--host-cas`), and only those, are trusted inside
//! every sandbox and every template build, through a read-only *trust
//! layer* the overlay puts above the template (layer.rs). Nothing else of
//! the host's store is copied.
//!
//! The source is looked at again before each new sandbox (a few `stat`s):
//! a CA added or removed on the host reaches the next sandbox without a
//! template rebuild. Live sandboxes keep the layer they started with.

mod certs;
mod layer;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub use certs::{CaSource, HostCa};

use crate::error::Result;

/// Where a sandbox finds the bundle, and the host's CAs alone.
pub const BUNDLE_IN_SANDBOX: &str = "/etc/ssl/certs/ca-certificates.crt";
pub const HOST_CAS_IN_SANDBOX: &str = "/etc/ssl/certs/forkbox-host-cas.pem";

/// The environment sandboxes get when they trust the host's CAs, for tools
/// that keep stores of their own: Node's, and a pip-installed `certifi`
/// (in a venv) behind requests and httpx.
pub fn env() -> Vec<String> {
    vec![format!("SSL_CERT_FILE={BUNDLE_IN_SANDBOX}"), format!("REQUESTS_CA_BUNDLE={BUNDLE_IN_SANDBOX}"), format!("NODE_EXTRA_CA_CERTS={HOST_CAS_IN_SANDBOX}")]
}

/// What sandboxes trust, and the layers that say it.
pub struct TrustStore {
    source: Option<CaSource>,
    /// `<state>/trust`: one directory per layer.
    dir: PathBuf,
    state: Mutex<Loaded>,
}

#[derive(Default)]
struct Loaded {
    fingerprint: Option<certs::Fingerprint>,
    cas: Vec<HostCa>,
    /// Layer per template (its lower layers, top first), for these CAs.
    layers: HashMap<Vec<PathBuf>, PathBuf>,
}

impl TrustStore {
    /// Trust `source`'s CAs (None: only each template's own) with layers
    /// under `state_dir/trust`.
    pub fn new(state_dir: &Path, source: Option<CaSource>) -> TrustStore {
        TrustStore { source, dir: state_dir.join("trust"), state: Mutex::new(Loaded::default()) }
    }

    pub fn enabled(&self) -> bool {
        self.source.is_some()
    }

    /// Read the source if it changed since the last look, and log what
    /// is trusted now. Answers the CAs.
    pub fn refresh(&self) -> Vec<HostCa> {
        let Some(source) = &self.source else { return Vec::new() };
        let fingerprint = source.fingerprint();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.fingerprint.as_ref() == Some(&fingerprint) {
            return state.cas.clone();
        }
        let first = state.fingerprint.is_none();
        let (cas, problems) = source.load();
        for p in &problems {
            tracing::warn!(source = %source.path().display(), problem = %p, "a host CA file was skipped");
        }
        if first || cas != state.cas {
            if cas.is_empty() {
                tracing::info!(source = %source.path().display(), "no host CAs to add: sandboxes trust their template's CAs");
            }
            for ca in &cas {
                tracing::info!(ca = %ca.subject, file = %ca.file.display(), "sandboxes trust this host CA");
            }
            if !first {
                tracing::info!(cas = cas.len(), "the host's CAs changed: new sandboxes trust the new set");
            }
            state.layers.clear();
        }
        state.fingerprint = Some(fingerprint);
        state.cas = cas.clone();
        cas
    }

    /// The trust layer for a template whose lower layers are `lowers` (top
    /// first); None when host CAs are off. Made on first use (blocking:
    /// reads the template's bundle and writes a few files).
    pub fn layer_for(&self, lowers: &[PathBuf]) -> Result<Option<PathBuf>> {
        if self.source.is_none() {
            return Ok(None);
        }
        let cas = self.refresh();
        if let Some(l) = self.state.lock().unwrap_or_else(|e| e.into_inner()).layers.get(lowers) {
            return Ok(Some(l.clone()));
        }
        let bundle = layer::template_bundle(lowers);
        let made = layer::write(&self.dir, &layer::files(bundle.as_deref(), &cas))?;
        self.state.lock().unwrap_or_else(|e| e.into_inner()).layers.insert(lowers.to_vec(), made.clone());
        Ok(Some(made))
    }

    /// Remove the layers no sandbox stands on: all but `keep` (the
    /// families a restarted server took back) and this run's.
    pub fn sweep(&self, keep: &[PathBuf]) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return };
        let current: Vec<PathBuf> = self.state.lock().unwrap_or_else(|e| e.into_inner()).layers.values().cloned().collect();
        for e in entries.flatten() {
            let path = e.path();
            if !keep.contains(&path) && !current.contains(&path) {
                let _ = std::fs::remove_dir_all(&path);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate (made with `openssl req -x509 -newkey ec
    /// -pkeyopt ec_paramgen_curve:P-256 -subj /CN=forkbox-test-ca`; its key was thrown away).
    const CA_PEM: &str = "-----BEGIN CERTIFICATE-----
MIIBijCCAS+gAwIBAgIUbDvI5rTgaLrle0jo5d+Q1YaTzg0wCgYIKoZIzj0EAwIw
GjEYMBYGA1UEAwwPZm9ya2JveC10ZXN0LWNhMB4XDTI2MTIwMTIwMzgzM1oXDTM2
MTEyODIwMzgzM1owGjEYMBYGA1UEAwwPZm9ya2JveC10ZXN0LWNhMFkwEwYHKoZI
zj0CAQYIKoZIzj0DAQcDQgAEqEUH6CWF5kVknY8eDhthwImdml7RImQyqMDEPVVs
p6DWNQOlO8YDdFLOdihQeMpgVL7DKZaJgvHuM68H+KhVn6NTMFEwHQYDVR0OBBYE
FDN2vkJqCpbv6MAjKb9CI99/A6PxMB8GA1UdIwQYMBaAFDN2vkJqCpbv6MAjKb9C
I99/A6PxMA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDSQAwRgIhALG0yNsX
+fHBANmxV+E/TUYdPCUyEAl9203tQwgAHewcAiEA9xyB7SulPmA7i/gC/A7N5pJo
jbNTkbNHxWrZ8Ue/s1s=
-----END CERTIFICATE-----
";

    const KEY_PEM: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgSECRETSECRETSECRE
-----END PRIVATE KEY-----
";

    #[test]
    fn only_certificates_are_taken_from_a_bundle() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("bundle.pem");
        let broken = "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n";
        let cut = &CA_PEM[..CA_PEM.len() / 2];
        std::fs::write(&bundle, format!("junk\n{KEY_PEM}{broken}{cut}\n{CA_PEM}# comment\n{CA_PEM}")).unwrap();
        let (cas, problems) = CaSource::at(&bundle).load();
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(cas.len(), 1, "the duplicate is taken once");
        assert_eq!(cas[0].subject, "CN=forkbox-test-ca");
        let pem = cas[0].pem();
        assert!(pem.contains("-----BEGIN CERTIFICATE-----") && !pem.contains("PRIVATE") && !pem.contains("SECRET"));
        // What we write back parses to the same certificate.
        assert_eq!(certs::parse_pem(pem.as_bytes(), &bundle)[0].der, cas[0].der);
    }

    #[test]
    fn a_directory_gives_its_crt_files_at_any_depth() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("sub/deeper")).unwrap();
        std::fs::write(dir.path().join("sub/deeper/a.crt"), CA_PEM).unwrap();
        std::fs::write(dir.path().join("b.pem"), CA_PEM).unwrap(); // not *.crt: not read
        std::fs::write(dir.path().join("empty.crt"), "").unwrap();
        let (cas, problems) = CaSource::at(dir.path()).load();
        assert_eq!(cas.len(), 1);
        assert!(cas[0].file.ends_with("sub/deeper/a.crt"));
        assert_eq!(problems.len(), 1, "{problems:?}");
    }

    #[test]
    fn a_directory_gives_at_most_1024_files() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..1030 {
            std::fs::write(dir.path().join(format!("{i:04}.crt")), "").unwrap();
        }
        assert_eq!(CaSource::at(dir.path()).files().len(), 1024);
    }

    #[test]
    fn a_change_of_the_source_gives_a_new_layer() {
        let state = tempfile::tempdir().unwrap();
        let cas = state.path().join("cas");
        std::fs::create_dir(&cas).unwrap();
        let template = state.path().join("rootfs");
        std::fs::create_dir_all(template.join("etc/ssl/certs")).unwrap();
        std::fs::write(template.join(layer::BUNDLE), "TEMPLATE\n").unwrap();
        let store = TrustStore::new(state.path(), Some(CaSource::at(&cas)));
        let lowers = vec![template];
        let empty = store.layer_for(&lowers).unwrap().unwrap();
        assert_eq!(std::fs::read(empty.join(layer::BUNDLE)).unwrap(), b"TEMPLATE\n");
        std::fs::write(cas.join("proxy.crt"), CA_PEM).unwrap();
        let with = store.layer_for(&lowers).unwrap().unwrap();
        assert_ne!(empty, with);
        let bundle = std::fs::read_to_string(with.join(layer::BUNDLE)).unwrap();
        assert!(bundle.starts_with("TEMPLATE\n") && bundle.contains("CN=forkbox-test-ca"), "{bundle}");
        assert!(with.join(layer::LOCAL_DIR).join("000-proxy.crt").is_file());
        // Unchanged: the same layer; sweep keeps it and removes the old one.
        assert_eq!(store.layer_for(&lowers).unwrap().unwrap(), with);
        store.sweep(&[]);
        assert!(with.is_dir() && !empty.exists());
        // Off: no layer, no environment.
        let off = TrustStore::new(state.path(), None);
        assert_eq!(off.layer_for(&lowers).unwrap(), None);
        assert!(!off.enabled() && store.enabled());
    }
}
