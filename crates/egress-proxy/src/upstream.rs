//! The operator's proxy, as `--egress-proxy http://[user:password@]host:port`
//! names it. Its credentials are kept here, as the `Proxy-Authorization`
//! value sent upstream, and never shown: `Display` leaves them out.

use std::time::Duration;

use base64::Engine as _;
use hyper::header::HeaderValue;
use tokio::net::TcpStream;

/// What is wrong with an upstream proxy's URL.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UpstreamError {
    #[error("the egress proxy must be a URL like http://proxy.example:3128: {0}")]
    NotAUrl(String),
    #[error("the egress proxy must be an http:// URL (TLS to the proxy itself is not supported; HTTPS through it is), not {0}://")]
    Scheme(String),
    #[error("name the egress proxy's port: http://host:PORT")]
    NoPort,
    #[error("the egress proxy's URL has a path, query or fragment; give only http://[user:password@]host:port")]
    Extra,
    #[error("the egress proxy's user or password is not valid in a header")]
    Credentials,
}

#[derive(Clone)]
pub struct Upstream {
    host: String,
    port: u16,
    /// `Basic …`, when the URL had a user.
    authorization: Option<HeaderValue>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")
    }
}

/// Shown without the credentials, so logs and errors never carry them.
impl std::fmt::Display for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let host = if self.host.contains(':') { format!("[{}]", self.host) } else { self.host.clone() };
        write!(f, "http://{host}:{}", self.port)?;
        if self.authorization.is_some() {
            write!(f, " (with credentials)")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for Upstream {
    type Err = UpstreamError;

    fn from_str(raw: &str) -> Result<Upstream, UpstreamError> {
        let url = url::Url::parse(raw.trim()).map_err(|e| UpstreamError::NotAUrl(e.to_string()))?;
        if url.scheme() != "http" {
            return Err(UpstreamError::Scheme(url.scheme().to_string()));
        }
        if !matches!(url.path(), "" | "/") || url.query().is_some() || url.fragment().is_some() {
            return Err(UpstreamError::Extra);
        }
        let host = match url.host() {
            Some(url::Host::Ipv6(ip)) => ip.to_string(),
            Some(h) => h.to_string(),
            None => return Err(UpstreamError::NotAUrl("no host".into())),
        };
        let port = url.port().ok_or(UpstreamError::NoPort)?;
        let authorization = if url.username().is_empty() && url.password().is_none() {
            None
        } else {
            let decode = |s: &str| percent_encoding::percent_decode_str(s).decode_utf8().map(|c| c.into_owned()).map_err(|_| UpstreamError::Credentials);
            let pair = format!("{}:{}", decode(url.username())?, decode(url.password().unwrap_or(""))?);
            let value = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair));
            let mut value = HeaderValue::from_str(&value).map_err(|_| UpstreamError::Credentials)?;
            value.set_sensitive(true);
            Some(value)
        };
        Ok(Upstream { host, port, authorization })
    }
}

impl Upstream {
    /// The `Proxy-Authorization` to send, if any.
    pub(crate) fn authorization(&self) -> Option<&HeaderValue> {
        self.authorization.as_ref()
    }

    /// A new connection to the proxy, within `timeout`.
    pub(crate) async fn connect(&self, timeout: Duration) -> std::io::Result<TcpStream> {
        let stream = tokio::time::timeout(timeout, TcpStream::connect((self.host.as_str(), self.port)))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "the upstream proxy did not answer the connect in time"))??;
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_credentials_kept_out_of_sight() {
        let up: Upstream = "http://alice:s%3Acret@proxy.example:3128".parse().unwrap();
        assert_eq!(up.to_string(), "http://proxy.example:3128 (with credentials)");
        assert!(!format!("{up:?}").contains("cret"));
        // alice:s:cret
        assert_eq!(up.authorization().unwrap().to_str().unwrap(), "Basic YWxpY2U6czpjcmV0");
        assert!(up.authorization().unwrap().is_sensitive());
        let plain: Upstream = "http://[::1]:8080/".parse().unwrap();
        assert_eq!(plain.to_string(), "http://[::1]:8080");
        assert!(plain.authorization().is_none());
        assert_eq!("https://p:3128".parse::<Upstream>().unwrap_err(), UpstreamError::Scheme("https".into()));
        assert_eq!("http://p".parse::<Upstream>().unwrap_err(), UpstreamError::NoPort);
        assert_eq!("http://p:3128/x".parse::<Upstream>().unwrap_err(), UpstreamError::Extra);
        assert!(matches!("p:3128".parse::<Upstream>(), Err(UpstreamError::NotAUrl(_) | UpstreamError::Scheme(_))));
    }
}
