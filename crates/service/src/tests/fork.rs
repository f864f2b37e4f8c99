//! Fork and merge: all children or none, whichever step fails.

use super::Harness;
use crate::engine::fake::Fault;
use crate::keys::Caller;
use crate::lifecycle::Lifecycle;
use crate::Error;

#[tokio::test]
async fn a_fork_makes_children_that_run_code_and_know_their_parent() {
    let h = Harness::new();
    let parent = h.create().await;
    let children = h.service.fork(&Caller::anonymous(), &parent, 3).await.expect("fork");
    assert_eq!(children.len(), 3);
    let mut all = children.clone();
    all.push(parent.clone());
    all.sort();
    assert_eq!(h.registered().await, all);
    assert_eq!(h.live(), all);
    for child in &children {
        assert_eq!(h.run(child, "y").await, ("ran y".to_string(), 0), "child {child} answers with its own REPL");
        let entry = h.service.get(&Caller::anonymous(), child).await.expect("get");
        assert_eq!(*entry.lineage.lock().unwrap(), vec![parent.clone()]);
    }
    assert_eq!(h.run(&parent, "z").await.1, 0, "the parent goes on");
}

/// Fork with `fault` armed: it fails, and nothing is left of it.
async fn fork_fails_cleanly(fault: Fault) {
    let h = Harness::new();
    let parent = h.create().await;
    h.fake.fail(fault, 1);
    let err = h.service.fork(&Caller::anonymous(), &parent, 2).await.expect_err("the fork fails");
    assert!(!matches!(err, Error::Invalid(_) | Error::NotFound(_)), "{fault:?}: {err:?}");
    assert_eq!(h.live(), vec![parent.clone()], "{fault:?} left members behind");
    assert_eq!(h.registered().await, vec![parent.clone()]);
    assert_eq!(h.service.inner.capacity.live(), 1, "{fault:?}: the children's slots were not given back");
    let entry = h.service.get(&Caller::anonymous(), &parent).await.expect("get");
    assert_eq!(entry.lifecycle(), Lifecycle::Ready, "{fault:?}");
    assert_eq!(h.run(&parent, "after").await.1, 0, "{fault:?}: the parent still runs code");
    // And the next fork works.
    assert_eq!(h.service.fork(&Caller::anonymous(), &parent, 2).await.expect("the next fork").len(), 2);
}

#[tokio::test]
async fn a_fork_whose_snapshot_fails_leaves_nothing() {
    fork_fails_cleanly(Fault::ForkMembers).await;
}

#[tokio::test]
async fn a_fork_whose_hand_over_fails_leaves_nothing() {
    fork_fails_cleanly(Fault::ExpectFork).await;
}

#[tokio::test]
async fn a_fork_the_repl_refuses_leaves_nothing() {
    fork_fails_cleanly(Fault::ForkRefused).await;
}

#[tokio::test]
async fn a_fork_that_makes_too_few_children_leaves_nothing() {
    fork_fails_cleanly(Fault::ForkShort).await;
}

#[tokio::test]
async fn a_fork_whose_child_never_says_ready_leaves_nothing() {
    fork_fails_cleanly(Fault::ChildReady).await;
}

#[tokio::test]
async fn a_fork_whose_children_cannot_be_adopted_leaves_nothing() {
    fork_fails_cleanly(Fault::AdoptForks).await;
}

#[tokio::test]
async fn a_fork_asks_for_one_to_32_children() {
    let h = Harness::new();
    let parent = h.create().await;
    for n in [0, 33] {
        assert!(matches!(h.service.fork(&Caller::anonymous(), &parent, n).await, Err(Error::Invalid(_))), "n = {n}");
    }
    assert_eq!(h.live(), vec![parent]);
}

#[tokio::test]
async fn a_fork_past_the_server_cap_is_refused_whole() {
    let h = Harness::with(|c| c.limits.max_sandboxes = 3);
    let parent = h.create().await;
    assert!(matches!(h.service.fork(&Caller::anonymous(), &parent, 3).await, Err(Error::Capacity(_))));
    assert_eq!(h.live(), vec![parent.clone()]);
    assert_eq!(h.service.fork(&Caller::anonymous(), &parent, 2).await.expect("two fit").len(), 2);
}

#[tokio::test]
async fn a_paused_parent_forks_and_is_paused_again() {
    let h = Harness::new();
    let parent = h.create().await;
    h.service.pause(&Caller::anonymous(), &parent).await.expect("pause");
    let children = h.service.fork(&Caller::anonymous(), &parent, 1).await.expect("fork");
    let entry = h.service.get(&Caller::anonymous(), &parent).await.expect("get");
    assert_eq!(entry.lifecycle(), Lifecycle::Paused);
    let child = h.service.get(&Caller::anonymous(), &children[0]).await.expect("get");
    assert_eq!(child.lifecycle(), Lifecycle::Ready, "children run");
}

#[tokio::test]
async fn a_merge_hands_the_winner_to_the_parents_id_and_frees_the_rest() {
    let h = Harness::new();
    let parent = h.create().await;
    let children = h.service.fork(&Caller::anonymous(), &parent, 2).await.expect("fork");
    let (winner, loser) = (&children[0], &children[1]);
    h.service.merge_into(&Caller::anonymous(), &parent, winner).await.expect("merge");
    let mut left = vec![parent.clone(), loser.clone()];
    left.sort();
    assert_eq!(h.registered().await, left);
    // The parent's old member is gone; the winner's member serves the parent's id.
    let mut members = vec![winner.clone(), loser.clone()];
    members.sort();
    assert_eq!(h.live(), members);
    let merged = h.service.get(&Caller::anonymous(), &parent).await.expect("get");
    assert_eq!(merged.engine.id(), winner.as_str());
    assert!(matches!(h.service.get(&Caller::anonymous(), winner).await, Err(Error::NotFound(m)) if m.contains("merged into")));
    assert!(matches!(h.service.merge_into(&Caller::anonymous(), loser, &parent).await, Err(Error::Conflict(_))), "only a descendant merges up");
}
