//! Every etcd key the cluster uses, in one place (docs/cluster.md#state).
//!
//! ```text
//! <prefix>/nodes/<node>                  NodeRecord             the node's lease
//! <prefix>/sandboxes/<id>                SandboxRecord          none: says where it was if the node goes
//! <prefix>/lost/<id>                     LostRecord             a day-long lease
//! <prefix>/owned/<owner>/<id>            ram_mib                the node's lease: a key's live sandboxes
//! <prefix>/tickets/<owner>/<ticket>      TicketRecord           the node's lease: reservations in flight
//! <prefix>/forks/<owner>/<ticket>        children               a minute-long lease: forks_per_minute
//! <prefix>/guard/<owner>                 counter                none: each reservation moves it
//! <prefix>/keys/<name>                   ClusterKey             none
//! <prefix>/spaces/<space>                SpaceRecord            none
//! <prefix>/reaped/<node>/<lease>         ""                     a day-long lease: one survivor reaps a lost node
//! <prefix>/templates/<name>             TemplateRecord         none: a custom template's record and layers
//! <prefix>/drain/<node>                  DrainRequest           none: a gateway asks a node to drain
//! <prefix>/drained/<node>                DrainReport            a day-long lease: what the drain did
//! <prefix>/moving/<id>                   Moving                 ten minutes: gateways hold its calls
//! <prefix>/resume/<node>/<space>         ResumeRequest          ten minutes: a draining node asks a peer
//! <prefix>/resumed/<ticket>              ResumeAnswer           ten minutes: the peer's answer
//! ```
//!
//! Names are ids and key names the service already checked
//! (`[a-z0-9-]`, `[A-Za-z0-9._-]`): none holds a `/`.

#[derive(Debug, Clone)]
pub struct Layout {
    prefix: String,
}

impl Layout {
    pub fn new(prefix: &str) -> Layout {
        let prefix = prefix.trim_end_matches('/');
        Layout { prefix: if prefix.is_empty() { "/forkbox".into() } else { prefix.to_string() } }
    }

    fn key(&self, parts: &[&str]) -> String {
        let mut k = self.prefix.clone();
        for p in parts {
            k.push('/');
            k.push_str(p);
        }
        k
    }

    /// A prefix: the key of `parts` and a trailing `/`.
    fn dir(&self, parts: &[&str]) -> String {
        self.key(parts) + "/"
    }

    pub fn nodes(&self) -> String {
        self.dir(&["nodes"])
    }
    pub fn node(&self, name: &str) -> String {
        self.key(&["nodes", name])
    }
    pub fn sandboxes(&self) -> String {
        self.dir(&["sandboxes"])
    }
    pub fn sandbox(&self, id: &str) -> String {
        self.key(&["sandboxes", id])
    }
    pub fn lost(&self, id: &str) -> String {
        self.key(&["lost", id])
    }
    pub fn owned_by(&self, owner: &str) -> String {
        self.dir(&["owned", owner])
    }
    pub fn owned(&self, owner: &str, id: &str) -> String {
        self.key(&["owned", owner, id])
    }
    pub fn tickets_of(&self, owner: &str) -> String {
        self.dir(&["tickets", owner])
    }
    pub fn ticket(&self, owner: &str, ticket: &str) -> String {
        self.key(&["tickets", owner, ticket])
    }
    pub fn forks_of(&self, owner: &str) -> String {
        self.dir(&["forks", owner])
    }
    pub fn fork(&self, owner: &str, ticket: &str) -> String {
        self.key(&["forks", owner, ticket])
    }
    pub fn guard(&self, owner: &str) -> String {
        self.key(&["guard", owner])
    }
    pub fn keys(&self) -> String {
        self.dir(&["keys"])
    }
    pub fn api_key(&self, name: &str) -> String {
        self.key(&["keys", name])
    }
    pub fn spaces(&self) -> String {
        self.dir(&["spaces"])
    }
    pub fn space(&self, id: &str) -> String {
        self.key(&["spaces", id])
    }
    pub fn frozen(&self, sandbox_id: &str) -> String {
        self.key(&["frozen", sandbox_id])
    }
    pub fn reaped(&self, node: &str, lease: i64) -> String {
        self.key(&["reaped", node, &format!("{lease:x}")])
    }

    pub fn templates(&self) -> String {
        self.dir(&["templates"])
    }
    pub fn template(&self, name: &str) -> String {
        self.key(&["templates", name])
    }
    pub fn drain(&self, node: &str) -> String {
        self.key(&["drain", node])
    }
    pub fn drains(&self) -> String {
        self.dir(&["drain"])
    }
    pub fn drained(&self, node: &str) -> String {
        self.key(&["drained", node])
    }
    pub fn moving(&self, id: &str) -> String {
        self.key(&["moving", id])
    }
    pub fn resumes_for(&self, node: &str) -> String {
        self.dir(&["resume", node])
    }
    pub fn resume(&self, node: &str, space: &str) -> String {
        self.key(&["resume", node, space])
    }
    pub fn resumed(&self, ticket: &str) -> String {
        self.key(&["resumed", ticket])
    }

    /// The last part of a key under `dir` (an id, a node's name).
    pub fn name_in<'a>(&self, dir: &str, key: &'a [u8]) -> Option<&'a str> {
        std::str::from_utf8(key).ok()?.strip_prefix(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_nest_under_the_prefix_and_directories_end_in_a_slash() {
        let l = Layout::new("/fb/");
        assert_eq!(l.node("n1"), "/fb/nodes/n1");
        assert_eq!(l.nodes(), "/fb/nodes/");
        assert_eq!(l.owned("alice", "sb-1"), "/fb/owned/alice/sb-1");
        assert!(l.owned("alice", "sb-1").starts_with(&l.owned_by("alice")));
        // One owner's prefix is never another's.
        assert!(!l.owned("alice2", "sb-1").starts_with(&l.owned_by("alice")));
        assert_eq!(l.name_in(&l.nodes(), l.node("n1").as_bytes()), Some("n1"));
        assert_eq!(Layout::new("").node("a"), "/forkbox/nodes/a");
    }
}
