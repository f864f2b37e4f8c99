//! Who may reach a sandbox's envd and code interpreter. Those calls carry
//! no API key: the control plane hands out a per-sandbox access token at
//! create and connect (`envdAccessToken`), and every envd call must bring
//! it back (`X-Access-Token`, or E2B's signed `/files` links made from it).
//! A token is an HMAC of the sandbox id under a secret the server keeps in
//! its state directory, so tokens survive restarts as sandboxes do and
//! need no table.

use std::path::Path;

use axum::http::HeaderMap;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

/// The server's token secret.
#[derive(Clone)]
pub struct Tokens {
    secret: [u8; 32],
}

impl Tokens {
    /// The secret in `state_dir` (made, mode 0600, on first use).
    pub fn load(state_dir: &Path) -> std::io::Result<Tokens> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = state_dir.join("e2b-token-secret");
        if let Ok(bytes) = std::fs::read(&path) {
            if let Ok(secret) = <[u8; 32]>::try_from(bytes.as_slice()) {
                return Ok(Tokens { secret });
            }
        }
        let secret: [u8; 32] = rand::random();
        let tmp = path.with_extension("tmp");
        let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
        f.write_all(&secret)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        Ok(Tokens { secret })
    }

    pub fn from_secret(secret: [u8; 32]) -> Tokens {
        Tokens { secret }
    }

    /// Sandbox `id`'s access token.
    pub fn token(&self, id: &str) -> String {
        let mut mac = HmacSha256::new_from_slice(&self.secret).expect("HMAC takes any key length");
        mac.update(b"envd:");
        mac.update(id.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }

    /// Whether `presented` is sandbox `id`'s token (in constant time).
    pub fn check(&self, id: &str, presented: &str) -> bool {
        let mut mac = HmacSha256::new_from_slice(&self.secret).expect("HMAC takes any key length");
        mac.update(b"envd:");
        mac.update(id.as_bytes());
        match hex::decode(presented) {
            Ok(bytes) => mac.verify_slice(&bytes).is_ok(),
            Err(_) => false,
        }
    }
}

/// The token a request presents: `X-Access-Token`, or the code
/// interpreter's `E2B-Traffic-Access-Token`.
pub fn presented(headers: &HeaderMap) -> Option<&str> {
    headers.get("x-access-token").or_else(|| headers.get("e2b-traffic-access-token")).and_then(|v| v.to_str().ok())
}

/// The signature E2B's SDKs put on a `/files` link (`download_url`,
/// `upload_url`): `v1_` + unpadded base64 of
/// sha256(`path:operation:user:token[:expiration]`).
pub fn file_signature(path: &str, operation: &str, user: &str, token: &str, expiration: Option<i64>) -> String {
    let mut text = format!("{path}:{operation}:{user}:{token}");
    if let Some(exp) = expiration {
        text.push_str(&format!(":{exp}"));
    }
    let digest = Sha256::digest(text.as_bytes());
    format!("v1_{}", base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest))
}

/// The user an envd RPC asks for: `Authorization: Basic base64(user:)`.
pub fn rpc_user(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(axum::http::header::AUTHORIZATION)?.to_str().ok()?;
    let encoded = v.strip_prefix("Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD.decode(encoded.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let user = text.split(':').next().unwrap_or("");
    (!user.is_empty()).then(|| user.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_per_sandbox_and_checked() {
        let t = Tokens::from_secret([7; 32]);
        let a = t.token("sb-a");
        assert!(t.check("sb-a", &a));
        assert!(!t.check("sb-b", &a));
        assert!(!t.check("sb-a", "not-hex"));
        assert!(!t.check("sb-a", &a[..10]));
        assert!(!Tokens::from_secret([8; 32]).check("sb-a", &a));
    }

    #[test]
    fn the_secret_persists() {
        let dir = std::env::temp_dir().join(format!("e2b-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = Tokens::load(&dir).unwrap().token("x");
        assert_eq!(Tokens::load(&dir).unwrap().token("x"), a);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn signatures_match_the_sdks() {
        // e2b's Python SDK: get_signature("/home/user/a.txt", "read", "user", "tok", None).
        let sig = file_signature("/home/user/a.txt", "read", "user", "tok", None);
        let digest = Sha256::digest(b"/home/user/a.txt:read:user:tok");
        assert_eq!(sig, format!("v1_{}", base64::engine::general_purpose::STANDARD.encode(digest).trim_end_matches('=')));
        assert_ne!(file_signature("/a", "read", "", "tok", Some(5)), file_signature("/a", "read", "", "tok", None));
    }

    #[test]
    fn users_from_basic_auth() {
        let mut h = HeaderMap::new();
        assert_eq!(rpc_user(&h), None);
        h.insert(axum::http::header::AUTHORIZATION, format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("root:")).parse().unwrap());
        assert_eq!(rpc_user(&h).as_deref(), Some("root"));
    }
}
