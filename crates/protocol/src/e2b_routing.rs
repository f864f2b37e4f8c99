//! How E2B traffic names its sandbox (docs/e2b.md): shared by the E2B
//! front end, which serves it, and a cluster's gateway, which routes it to
//! the node holding that sandbox (docs/cluster.md).

/// envd's port: E2B sandbox traffic that names no port is for it.
pub const ENVD_PORT: u16 = 49983;
/// The code interpreter's port.
pub const INTERPRETER_PORT: u16 = 49999;

/// Where a sandbox request goes: its sandbox and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routed {
    pub sandbox: String,
    pub port: u16,
}

/// The sandbox and port a request is for, from E2B's routing headers
/// (`header(name)` gives a header's value by its lower-case name) or a
/// `{port}-{id}.{domain}` Host; None: not sandbox traffic.
pub fn routed<'a>(header: impl Fn(&str) -> Option<&'a str>) -> Option<Routed> {
    if let Some(id) = header("e2b-sandbox-id") {
        let port = header("e2b-sandbox-port").and_then(|p| p.trim().parse().ok()).unwrap_or(ENVD_PORT);
        return Some(Routed { sandbox: id.trim().to_string(), port });
    }
    from_host(header("host")?)
}

/// `8000-sb-abc.localhost:7070` → sandbox `sb-abc`, port 8000.
pub fn from_host(host: &str) -> Option<Routed> {
    let label = host.split('.').next()?;
    if label.len() == host.len() {
        return None; // no domain after it: a plain host name
    }
    let (port, id) = label.split_once('-')?;
    let port: u16 = port.parse().ok().filter(|p| *p > 0)?;
    (!id.is_empty()).then(|| Routed { sandbox: id.to_string(), port })
}

/// Whether `path` is E2B's control plane's.
pub fn is_control_path(path: &str) -> bool {
    ["/sandboxes", "/v2/sandboxes", "/snapshots", "/templates"].iter().any(|p| path == *p || path.strip_prefix(p).is_some_and(|rest| rest.starts_with('/')))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<&'a str> {
        move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
    }

    #[test]
    fn routing_by_header_and_host() {
        assert_eq!(routed(headers(&[("host", "127.0.0.1:7070")])), None);
        assert_eq!(routed(headers(&[("host", "8000-sb-abc.localhost:7070")])), Some(Routed { sandbox: "sb-abc".into(), port: 8000 }));
        let both = [("host", "8000-sb-abc.localhost:7070"), ("e2b-sandbox-id", "sb-x"), ("e2b-sandbox-port", "49999")];
        assert_eq!(routed(headers(&both)), Some(Routed { sandbox: "sb-x".into(), port: 49999 }));
        for host in ["localhost:7070", "x-y", "0-sb.localhost", "99999-sb.localhost", "80-.localhost", "abc-sb.localhost"] {
            assert_eq!(from_host(host), None, "{host}");
        }
    }

    #[test]
    fn control_paths() {
        for p in ["/sandboxes", "/sandboxes/sb-1/pause", "/v2/sandboxes", "/snapshots", "/templates/x"] {
            assert!(is_control_path(p), "{p}");
        }
        for p in ["/v1/sandboxes", "/sandboxesx", "/", "/files", "/v2"] {
            assert!(!is_control_path(p), "{p}");
        }
    }
}
