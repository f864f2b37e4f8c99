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

/// The node a hibernating sandbox wakes on: the one that froze it
/// (`home`) while it takes work, else one with room picked by the id
/// alone, so gateways that get calls for it at once send them all to one
/// node (whose wake serves them all) and different ids spread.
pub fn wake_on<'a>(nodes: &'a [NodeRecord], home: &str, id: &str) -> Option<&'a NodeRecord> {
    let mut open: Vec<&NodeRecord> = nodes.iter().filter(|n| !n.draining && n.load.has_room()).collect();
    if let Some(home) = open.iter().find(|n| n.name == home) {
        return Some(home);
    }
    open.sort_by(|a, b| a.name.cmp(&b.name));
    // FNV-1a: the same on every gateway, unlike std's seeded hasher.
    let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    open.get((hash % open.len().max(1) as u64) as usize).copied()
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

    #[test]
    fn a_hibernating_sandbox_wakes_at_home_else_where_its_id_says() {
        let nodes = vec![node("a", 9, &[], false), node("b", 0, &[], false), node("c", 0, &[], true), node("d", 10, &[], false)];
        // Home takes work (however loaded): home.
        assert_eq!(wake_on(&nodes, "a", "sb-x").unwrap().name, "a");
        // Home draining, full or gone: an open node, the same every time.
        for home in ["c", "d", "gone"] {
            let first = wake_on(&nodes, home, "sb-x").unwrap().name.clone();
            assert!(first == "a" || first == "b", "{first}");
            assert!((0..20).all(|_| wake_on(&nodes, home, "sb-x").unwrap().name == first));
        }
        // Different ids spread over the open nodes.
        let picked: std::collections::BTreeSet<String> = (0..32).map(|i| wake_on(&nodes, "gone", &format!("sb-{i}")).unwrap().name.clone()).collect();
        assert_eq!(picked.into_iter().collect::<Vec<_>>(), ["a", "b"]);
        assert!(wake_on(&[node("d", 10, &[], false)], "gone", "sb-x").is_none());
    }
}
