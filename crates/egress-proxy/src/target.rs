//! Where a sandbox asks to go: the authority of a `CONNECT` or of an
//! absolute-form request, checked and normalised before the policy sees it.

use std::net::IpAddr;

use hyper::http::uri::Authority;

/// A host by name or by address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// Lower-case, without a trailing dot.
    Name(String),
    Ip(IpAddr),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub host: Host,
    pub port: u16,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.host {
            Host::Name(n) => write!(f, "{n}:{}", self.port),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}", self.port),
            Host::Ip(ip) => write!(f, "{ip}:{}", self.port),
        }
    }
}

/// A DNS name as a resolver would take it: labels of letters, digits,
/// `-` and `_`, 1 to 63 bytes each, 253 in all.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'))
}

impl Target {
    /// From a request's authority; `default_port` when it names none (an
    /// absolute-form `http://` request), else a port is required (`CONNECT`).
    pub fn from_authority(authority: &Authority, default_port: Option<u16>) -> Result<Target, String> {
        if authority.as_str().contains('@') {
            return Err("a target with credentials in it".into());
        }
        let port = match (authority.port_u16(), default_port) {
            (Some(0), _) => return Err("port 0".into()),
            (Some(p), _) | (None, Some(p)) => p,
            (None, None) => return Err(format!("`{authority}` names no port")),
        };
        let raw = authority.host();
        let host = match raw.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            Some(v6) => Host::Ip(IpAddr::V6(v6.parse().map_err(|_| format!("`{raw}` is not an IPv6 address"))?)),
            None => match raw.parse::<IpAddr>() {
                Ok(ip) => Host::Ip(ip),
                Err(_) => {
                    let name = raw.trim_end_matches('.').to_ascii_lowercase();
                    if !valid_name(&name) {
                        return Err(format!("`{raw}` is not a host name"));
                    }
                    Host::Name(name)
                }
            },
        };
        Ok(Target { host, port })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str, default: Option<u16>) -> Result<Target, String> {
        Target::from_authority(&s.parse().unwrap(), default)
    }

    #[test]
    fn authorities_are_normalised_or_refused() {
        assert_eq!(parse("PyPI.org.:443", None).unwrap(), Target { host: Host::Name("pypi.org".into()), port: 443 });
        assert_eq!(parse("10.0.0.1:8080", None).unwrap().to_string(), "10.0.0.1:8080");
        assert_eq!(parse("[::1]:443", None).unwrap().to_string(), "[::1]:443");
        assert_eq!(parse("deb.debian.org", Some(80)).unwrap().port, 80);
        assert!(parse("pypi.org", None).is_err(), "CONNECT needs a port");
        assert!(parse("pypi.org:0", None).is_err());
        assert!(parse("user@pypi.org:443", None).is_err());
        assert!(parse("a..b:443", None).is_err());
        assert!(parse("[zz]:443", None).is_err());
    }
}
