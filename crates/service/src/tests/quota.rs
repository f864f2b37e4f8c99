//! Keys' quotas and the server's caps (429s), over whole creates and forks.

use super::Harness;
use crate::keys::{Caller, KeyHash, KeyLimits};
use crate::Error;

/// A server with keys `a` and `b`, each allowed `max` sandboxes.
fn two_keys(max: u64) -> Harness {
    Harness::with(|c| {
        c.api_keys = vec![KeyHash::of("key-a"), KeyHash::of("key-b")];
        c.key_limits = KeyLimits { max_sandboxes: Some(max), ..Default::default() };
    })
}

fn caller(h: &Harness, key: &str) -> Caller {
    h.service.inner.keys.resolve(Some(key)).expect("a known key")
}

#[tokio::test]
async fn a_key_past_its_sandboxes_is_refused_and_another_key_is_not() {
    let h = two_keys(1);
    let (a, b) = (caller(&h, "key-a"), caller(&h, "key-b"));
    let first = h.create_as(&a).await.expect("a's first");
    let refused = h.create_as(&a).await.expect_err("a's second");
    assert!(matches!(&refused, Error::Quota(r) if r.limit.label() == "max_sandboxes"), "{refused:?}");
    assert_eq!(h.live(), vec![first.clone()], "a refused create made nothing");
    h.create_as(&b).await.expect("b has its own quota");
    assert!(h.service.metrics_text().await.expect("metrics").contains("limit=\"max_sandboxes\""), "the refusal is counted");
    // Destroying frees the quota.
    h.service.destroy(&a, &first).await.expect("destroy");
    h.create_as(&a).await.expect("a's quota is free again");
}

#[tokio::test]
async fn a_fork_past_a_keys_quota_is_refused_whole() {
    let h = two_keys(2);
    let a = caller(&h, "key-a");
    let parent = h.create_as(&a).await.expect("create");
    assert!(matches!(h.service.fork(&a, &parent, 2).await, Err(Error::Quota(_))), "parent + 2 is past 2");
    assert_eq!(h.live(), vec![parent.clone()], "no child was made");
    assert_eq!(h.service.fork(&a, &parent, 1).await.expect("one fits").len(), 1);
}

#[tokio::test]
async fn another_keys_sandbox_answers_as_an_unknown_id() {
    let h = two_keys(1);
    let (a, b) = (caller(&h, "key-a"), caller(&h, "key-b"));
    let id = h.create_as(&a).await.expect("create");
    for err in [h.service.get(&b, &id).await.err(), h.service.destroy(&b, &id).await.err(), h.service.fork(&b, &id, 1).await.err()] {
        assert!(matches!(err, Some(Error::NotFound(_))), "{err:?}");
    }
    assert_eq!(h.live(), vec![id], "b could not touch a's sandbox");
}

#[tokio::test]
async fn the_server_cap_refuses_past_it_and_frees_on_destroy() {
    let h = Harness::with(|c| c.limits.max_sandboxes = 2);
    let first = h.create().await;
    h.create().await;
    assert!(matches!(h.create_as(&Caller::anonymous()).await, Err(Error::Capacity(_))));
    assert_eq!(h.live().len(), 2);
    h.service.destroy(&Caller::anonymous(), &first).await.expect("destroy");
    h.create().await;
}
