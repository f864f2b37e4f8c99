//! The host's CAs: read from a directory the way `update-ca-certificates`
//! reads `/usr/local/share/ca-certificates` (every `*.crt` below it), or
//! from one PEM bundle the operator names. Only `CERTIFICATE` blocks that
//! parse as X.509 are taken: a private key or anything else in those files
//! never reaches a sandbox.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Most bytes read of one source file (a bundle of every public CA is
/// about 200 KiB).
const MAX_FILE_BYTES: u64 = 8 << 20;
/// Most files read below a directory, and most CAs taken in all.
const MAX_FILES: usize = 1024;
const MAX_CAS: usize = 1024;

/// One CA the sandboxes are to trust.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostCa {
    /// Its subject, as the log shows it (`CN=Example Proxy CA`).
    pub subject: String,
    /// The file it came from.
    pub file: PathBuf,
    /// Its DER, to write back out as PEM.
    pub der: Vec<u8>,
}

impl HostCa {
    /// The certificate in PEM, with a comment line naming it.
    pub fn pem(&self) -> String {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode(&self.der);
        let mut out = format!("# {}\n-----BEGIN CERTIFICATE-----\n", self.subject.replace('\n', " "));
        for line in b64.as_bytes().chunks(64) {
            out.push_str(std::str::from_utf8(line).unwrap_or_default());
            out.push('\n');
        }
        out.push_str("-----END CERTIFICATE-----\n");
        out
    }
}

/// Each source file's path, size, modification time (s, ns) and inode.
pub type Fingerprint = Vec<(PathBuf, u64, i64, i64, u64)>;

/// Where the CAs come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaSource {
    /// Every `*.crt` below this directory.
    Dir(PathBuf),
    /// One PEM bundle.
    Bundle(PathBuf),
}

impl CaSource {
    /// A directory is read as a directory, anything else as a bundle.
    pub fn at(path: &Path) -> CaSource {
        if path.is_dir() {
            CaSource::Dir(path.to_path_buf())
        } else {
            CaSource::Bundle(path.to_path_buf())
        }
    }

    pub fn path(&self) -> &Path {
        match self {
            CaSource::Dir(p) | CaSource::Bundle(p) => p,
        }
    }

    /// The files to read, in a stable order (missing source: none).
    pub fn files(&self) -> Vec<PathBuf> {
        match self {
            CaSource::Bundle(p) => vec![p.clone()],
            CaSource::Dir(dir) => {
                let mut out = Vec::new();
                walk(dir, &mut out, 0);
                out.sort();
                out
            }
        }
    }

    /// What changes when the source changes: each file's path, size,
    /// modification time and inode (a cheap check before every create).
    pub fn fingerprint(&self) -> Fingerprint {
        self.files().into_iter().filter_map(|f| fs::metadata(&f).ok().map(|m| (f, m.len(), m.mtime(), m.mtime_nsec(), m.ino()))).collect()
    }

    /// Read every CA (duplicates once); a file that cannot be read or holds
    /// no certificate is skipped and reported in the second list.
    pub fn load(&self) -> (Vec<HostCa>, Vec<String>) {
        let (mut cas, mut problems): (Vec<HostCa>, Vec<String>) = (Vec::new(), Vec::new());
        for file in self.files() {
            match read_file(&file) {
                Ok(found) if found.is_empty() => problems.push(format!("{}: no certificate in it", file.display())),
                Ok(found) => {
                    for ca in found {
                        if cas.len() < MAX_CAS && !cas.iter().any(|c| c.der == ca.der) {
                            cas.push(ca);
                        }
                    }
                }
                Err(e) => problems.push(format!("{}: {e}", file.display())),
            }
        }
        (cas, problems)
    }
}

/// `*.crt` files below `dir` (as `update-ca-certificates` finds them:
/// following links, any depth).
fn walk(dir: &Path, out: &mut Vec<PathBuf>, depth: usize) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        if out.len() >= MAX_FILES || depth > 16 {
            return;
        }
        let path = e.path();
        match fs::metadata(&path) {
            Ok(m) if m.is_dir() => walk(&path, out, depth + 1),
            Ok(m) if m.is_file() && path.extension().is_some_and(|x| x == "crt") => out.push(path),
            _ => {}
        }
    }
}

fn read_file(file: &Path) -> Result<Vec<HostCa>, String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    fs::File::open(file).and_then(|f| f.take(MAX_FILE_BYTES).read_to_end(&mut bytes)).map_err(|e| e.to_string())?;
    Ok(parse_pem(&bytes, file))
}

/// The X.509 certificates among the PEM blocks of `bytes`; other blocks
/// (keys, CRLs), blocks that are not base64 and certificates that do not
/// parse are left out, and the search goes on after them.
pub fn parse_pem(bytes: &[u8], file: &Path) -> Vec<HostCa> {
    use base64::Engine as _;
    let text = String::from_utf8_lossy(bytes);
    let mut out = Vec::new();
    let mut body: Option<String> = None;
    for line in text.lines().map(str::trim) {
        match &mut body {
            None if line == "-----BEGIN CERTIFICATE-----" => body = Some(String::new()),
            None => {}
            Some(_) if line.starts_with("-----END ") => {
                let b64 = body.take().unwrap_or_default();
                let Ok(der) = base64::engine::general_purpose::STANDARD.decode(b64) else { continue };
                // Exactly one certificate: trailing bytes would be written back.
                let Ok(([], cert)) = x509_parser::parse_x509_certificate(&der) else { continue };
                out.push(HostCa { subject: cert.subject().to_string(), file: file.to_path_buf(), der });
            }
            // A BEGIN inside a block: that block was broken; start anew.
            Some(b) if line.starts_with("-----BEGIN ") => {
                b.clear();
                if line != "-----BEGIN CERTIFICATE-----" {
                    body = None;
                }
            }
            Some(b) => b.push_str(line),
        }
    }
    out
}
