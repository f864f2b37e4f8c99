//! Which node a new sandbox goes to: one with room that is not draining,
//! and of those one holding the fewest sandboxes, so creates spread over
//! the cluster. A node with a warm pool of the template (the create is
//! then a fork) is preferred while it holds at most `WARM_SLACK` more than
//! the emptiest: the spread stays within that, and a cold node warms its
//! own pool with the first create it takes.

use cluster::NodeRecord;

/// How many more sandboxes than the emptiest node a warm node may hold
/// and still be preferred.
const WARM_SLACK: u64 = 1;

/// The node for a new sandbox of `template` (None: a Space's resume, whose
/// template is not known here), among `nodes` but `tried`.
pub fn choose<'a>(nodes: &'a [NodeRecord], template: Option<&str>, tried: &[String]) -> Option<&'a NodeRecord> {
    let open: Vec<&NodeRecord> = nodes.iter().filter(|n| !n.draining && n.load.has_room() && !tried.contains(&n.name)).collect();
    let fewest = open.iter().map(|n| n.load.sandboxes).min()?;
    let warm = |n: &&NodeRecord| n.load.sandboxes <= fewest + WARM_SLACK && template.is_some_and(|t| n.load.warm.iter().any(|w| w == t));
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
        // The warm node with the fewest sandboxes, one more than the empty
        // cold one; never the draining one.
        assert_eq!(choose(&nodes, Some("default"), &[]).unwrap().name, "b");
        // A template nobody has warm: the emptiest node that takes work.
        assert_eq!(choose(&nodes, Some("ml"), &[]).unwrap().name, "c");
        // A warm node too far ahead of the emptiest is passed over: creates spread.
        assert_eq!(choose(&nodes, Some("default"), &["b".into()]).unwrap().name, "c");
        let full = vec![node("a", 10, &[], false)];
        assert!(choose(&full, None, &[]).is_none());
        assert!(choose(&[], None, &[]).is_none());
    }
}
