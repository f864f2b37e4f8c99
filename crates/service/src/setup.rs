//! What the server's own configuration gives every sandbox it makes, beside
//! what each create asks for: more environment variables (for the host's
//! CAs, for an upstream proxy) and the way out of the network.

use std::sync::Arc;

/// The address inside every sandbox where its egress proxy listens (when
/// the server has `--egress-proxy`; docs/network.md#upstream-proxies).
pub use jail::egress::PROXY_ADDR;

#[derive(Debug, Default)]
pub struct SandboxSetup {
    /// Added to every process's environment, after the defaults.
    pub env: Vec<String>,
    /// The operator's proxy, when sandboxes may only leave through it.
    pub egress_proxy: Option<Arc<jail::egress::Upstream>>,
}

impl SandboxSetup {
    /// The environment for the host's CAs (`trust_env`) and, with an
    /// upstream proxy, the variables that send HTTP and HTTPS through the
    /// sandbox's own proxy (without credentials: they stay in the server).
    pub fn new(trust_env: Vec<String>, egress_proxy: Option<Arc<jail::egress::Upstream>>) -> SandboxSetup {
        let mut env = trust_env;
        if egress_proxy.is_some() {
            let url = format!("http://{}:{}", PROXY_ADDR.0, PROXY_ADDR.1);
            for name in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
                env.push(format!("{name}={url}"));
            }
            for name in ["NO_PROXY", "no_proxy"] {
                env.push(format!("{name}=localhost,127.0.0.1,::1"));
            }
        }
        SandboxSetup { env, egress_proxy }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proxy_is_named_without_its_credentials() {
        let up: jail::egress::Upstream = "http://u:secret@proxy.example:3128".parse().unwrap();
        let s = SandboxSetup::new(vec!["SSL_CERT_FILE=/x".into()], Some(Arc::new(up)));
        assert!(s.env.contains(&"HTTPS_PROXY=http://127.0.0.53:3128".to_string()));
        assert!(s.env.contains(&"SSL_CERT_FILE=/x".to_string()));
        assert!(!s.env.iter().any(|e| e.contains("secret") || e.contains("proxy.example")));
        assert!(SandboxSetup::new(Vec::new(), None).env.is_empty());
    }
}
