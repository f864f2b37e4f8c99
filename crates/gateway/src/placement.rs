//! Which node a new sandbox goes to: one with room that is not draining,
//! with a warm pool of the template if any has one (the create is then a
//! fork), and of those the one holding the fewest sandboxes: creates
//! spread over the cluster.

use cluster::NodeRecord;

/// The node for a new sandbox of `template` (None: a Space's resume, whose
/// template is not known here), among `nodes` but `tried`.
pub fn choose<'a>(nodes: &'a [NodeRecord], template: Option<&str>, tried: &[String]) -> Option<&'a NodeRecord> {
    let open: Vec<&NodeRecord> = nodes.iter().filter(|n| !n.draining && n.load.has_room() && !tried.contains(&n.name)).collect();
    let warm = |n: &&NodeRecord| template.is_some_and(|t| n.load.warm.iter().any(|w| w == t));
    let pool: Vec<&NodeRecord> = if open.iter().any(warm) { open.iter().copied().filter(warm).collect() } else { open };
    let fewest = pool.iter().map(|n| n.load.sandboxes).min()?;
    let least: Vec<&NodeRecord> = pool.into_iter().filter(|n| n.load.sandboxes == fewest).collect();
    // Ties are broken at random: gateways deciding at once do not all
    // pick the same node.
    least.get(rand::random::<u32>() as usize % least.len()).copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cluster::Load;

    fn node(name: &str, sandboxes: u64, warm: &[&str], draining: bool) -> NodeRecord {
        NodeRecord {
            name: name.into(),
            api: format!("http://{name}"),
            incarnation: "i".into(),
            started_ms: 0,
            draining,
            load: Load { sandboxes, max_sandboxes: 10, memory_mib: 0, max_memory_mib: 1000, warm: warm.iter().map(|s| s.to_string()).collect() },
        }
    }

    #[test]
    fn spread_warm_first_never_draining_or_full() {
        let nodes = vec![node("a", 3, &["default"], false), node("b", 1, &["default"], false), node("c", 0, &[], false), node("d", 0, &["default"], true)];
        // The warm node with the fewest sandboxes, not the empty cold one or the draining one.
        assert_eq!(choose(&nodes, Some("default"), &[]).unwrap().name, "b");
        // A template nobody has warm: the emptiest node that takes work.
        assert_eq!(choose(&nodes, Some("ml"), &[]).unwrap().name, "c");
        assert_eq!(choose(&nodes, Some("default"), &["b".into()]).unwrap().name, "a");
        let full = vec![node("a", 10, &[], false)];
        assert!(choose(&full, None, &[]).is_none());
        assert!(choose(&[], None, &[]).is_none());
    }
}
