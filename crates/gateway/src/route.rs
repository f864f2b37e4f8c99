//! Where a request goes, from its method, path and headers alone: to the
//! node holding the sandbox it names, to a node chosen for a new sandbox,
//! to every node (lists), to any node (what every node answers alike from
//! the cluster's state), or to the gateway itself.

use axum::http::{HeaderMap, Method};

/// The API a request speaks, for answering its errors in its own shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// podflare / forkbox: status + `{"error": ...}`.
    Forkbox,
    /// E2B's control plane and envd REST: `{"code": status, "message"}`.
    E2b,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The node holding sandbox `id`.
    Sandbox {
        id: String,
    },
    /// A node chosen for a new sandbox (a create, a Space's resume).
    Place,
    /// Every node, the answers merged (lists of sandboxes).
    Every,
    /// Any node: they all answer it alike from the cluster's state.
    Any,
    /// The one node that answers: an E2B signed `/files` link that names
    /// no sandbox (only the node whose sandbox signed it accepts it).
    Whichever,
    /// The gateway's own routes.
    Nodes,
    /// Move every sandbox off a node (an operator's: the cluster secret).
    Drain {
        node: String,
    },
    Undrain {
        node: String,
    },
    Health,
    /// Nothing here.
    Unknown,
}

/// Where `method path` with `headers` goes, and in which dialect.
pub fn route(method: &Method, path: &str, headers: &HeaderMap) -> (Target, Dialect) {
    // E2B sandbox traffic (envd, the interpreter, ports) names its sandbox
    // in headers or the Host.
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(r) = protocol::e2b_routing::routed(header) {
        return (Target::Sandbox { id: r.sandbox }, Dialect::E2b);
    }
    if protocol::e2b_routing::is_control_path(path) {
        return (e2b_control(method, path), Dialect::E2b);
    }
    if path == "/files" {
        return (Target::Whichever, Dialect::E2b);
    }
    (forkbox(method, path), Dialect::Forkbox)
}

fn segments(path: &str) -> Vec<&str> {
    path.trim_start_matches('/').split('/').collect()
}

fn forkbox(method: &Method, path: &str) -> Target {
    let s = segments(path);
    match (method, s.as_slice()) {
        (_, ["v1", "healthz"]) => Target::Health,
        (&Method::GET, ["v1", "cluster", "nodes"]) => Target::Nodes,
        (&Method::POST, ["v1", "cluster", "nodes", node, "drain"]) => Target::Drain { node: node.to_string() },
        (&Method::DELETE, ["v1", "cluster", "nodes", node, "drain"]) => Target::Undrain { node: node.to_string() },
        (&Method::POST, ["v1", "sandboxes"]) => Target::Place,
        (&Method::GET, ["v1", "sandboxes"]) => Target::Every,
        (_, ["v1", "sandboxes", id, ..]) if !id.is_empty() => Target::Sandbox { id: id.to_string() },
        (&Method::POST, ["v1", "spaces", _, "resume"]) => Target::Place,
        (_, ["v1", "spaces", ..]) | (_, ["v1", "templates", ..]) | (_, ["v1", "pool"]) | (_, ["v1", "openapi.json"]) => Target::Any,
        _ => Target::Unknown,
    }
}

fn e2b_control(method: &Method, path: &str) -> Target {
    let s = segments(path);
    match (method, s.as_slice()) {
        (&Method::POST, ["sandboxes"]) | (&Method::POST, ["v2", "sandboxes"]) => Target::Place,
        (&Method::GET, ["sandboxes"]) | (&Method::GET, ["v2", "sandboxes"]) => Target::Every,
        (_, ["sandboxes", id, ..]) | (_, ["v2", "sandboxes", id, ..]) if !id.is_empty() => Target::Sandbox { id: id.to_string() },
        _ => Target::Any,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(method: Method, path: &str) -> Target {
        route(&method, path, &HeaderMap::new()).0
    }

    #[test]
    fn forkbox_routes() {
        let sb = |id: &str| Target::Sandbox { id: id.into() };
        assert_eq!(r(Method::POST, "/v1/sandboxes"), Target::Place);
        assert_eq!(r(Method::GET, "/v1/sandboxes"), Target::Every);
        assert_eq!(r(Method::GET, "/v1/sandboxes/sb-a"), sb("sb-a"));
        assert_eq!(r(Method::POST, "/v1/sandboxes/sb-a/exec"), sb("sb-a"));
        assert_eq!(r(Method::POST, "/v1/sandboxes/sb-a/fork"), sb("sb-a"));
        assert_eq!(r(Method::GET, "/v1/sandboxes/sb-a/ports/8000/x/y"), sb("sb-a"));
        assert_eq!(r(Method::POST, "/v1/spaces/sp-a/resume"), Target::Place);
        assert_eq!(r(Method::GET, "/v1/spaces"), Target::Any);
        assert_eq!(r(Method::DELETE, "/v1/spaces/sp-a"), Target::Any);
        assert_eq!(r(Method::GET, "/v1/cluster/nodes"), Target::Nodes);
        assert_eq!(r(Method::POST, "/v1/cluster/nodes/n1/drain"), Target::Drain { node: "n1".into() });
        assert_eq!(r(Method::GET, "/v1/healthz"), Target::Health);
        assert_eq!(r(Method::GET, "/nope"), Target::Unknown);
        assert_eq!(r(Method::GET, "/v1/sandboxes/"), Target::Unknown);
    }

    #[test]
    fn e2b_routes_by_path_header_and_host() {
        assert_eq!(route(&Method::POST, "/sandboxes", &HeaderMap::new()), (Target::Place, Dialect::E2b));
        assert_eq!(r(Method::GET, "/v2/sandboxes"), Target::Every);
        assert_eq!(r(Method::POST, "/sandboxes/sb-a/pause"), Target::Sandbox { id: "sb-a".into() });
        assert_eq!(r(Method::GET, "/templates"), Target::Any);
        let mut h = HeaderMap::new();
        h.insert("e2b-sandbox-id", "sb-b".parse().unwrap());
        assert_eq!(route(&Method::POST, "/process.Process/Start", &h), (Target::Sandbox { id: "sb-b".into() }, Dialect::E2b));
        let mut h = HeaderMap::new();
        h.insert("host", "49999-sb-c.localhost:7070".parse().unwrap());
        assert_eq!(route(&Method::POST, "/execute", &h).0, Target::Sandbox { id: "sb-c".into() });
        // A signed link with no sandbox in it.
        assert_eq!(route(&Method::GET, "/files", &HeaderMap::new()), (Target::Whichever, Dialect::E2b));
    }
}
