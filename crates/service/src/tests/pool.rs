//! The warm pool: creates take sandboxes forked ahead of demand or fork a
//! zygote's spares, the pool refills, and a
//! pool that fails falls back to a cold create without leaking members.

use std::time::Duration;

use super::Harness;
use crate::engine::fake::Fault;
use crate::keys::Caller;
use crate::pool::PoolKey;

fn default_key() -> PoolKey {
    PoolKey { owner: None, template: "default".into() }
}

async fn warm() -> Harness {
    let h = Harness::with(|c| c.warm_pool = true);
    h.service.warm_up(&default_key()).await.expect("warm up");
    h
}

async fn spares(h: &Harness) -> Vec<String> {
    let info = h.service.pool_info(&Caller::anonymous()).await;
    info.templates.get("default").map(|t| t.spares.clone()).unwrap_or_default()
}

async fn ready(h: &Harness) -> Vec<String> {
    let info = h.service.pool_info(&Caller::anonymous()).await;
    info.templates.get("default").map(|t| t.ready.clone()).unwrap_or_default()
}

/// Wait until the pool holds `n` sandboxes forked ahead of demand again.
async fn until_ready(h: &Harness, n: usize) {
    let filled = tokio::time::timeout(Duration::from_secs(10), async {
        while ready(h).await.len() != n {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(filled.is_ok(), "the pool has {:?} ready, not {n}", ready(h).await);
}

/// Wait until the pool holds `n` spares again.
async fn until_spares(h: &Harness, n: usize) {
    let filled = tokio::time::timeout(Duration::from_secs(10), async {
        while spares(h).await.len() != n {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(filled.is_ok(), "the pool has {:?}, not {n} spares", spares(h).await);
}

// Multi-threaded: the pool starts spares' networks with `block_in_place`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_takes_a_sandbox_forked_ahead_and_the_pool_refills() {
    let h = warm().await;
    until_ready(&h, 2).await;
    until_spares(&h, 2).await;
    let before = ready(&h).await;
    let forks = |h: &Harness| h.fake.calls().iter().filter(|c| c.starts_with("adopt_forks")).count();
    let forked = forks(&h);
    let id = h.create().await;
    assert!(before.contains(&id), "{id} is not one of the ready sandboxes {before:?}");
    assert_eq!(forks(&h), forked, "the create waited for a fork: {:?}", h.fake.calls());
    assert_eq!(h.fake.calls().iter().filter(|c| c.starts_with("create")).count(), 1, "only the zygote was made cold: {:?}", h.fake.calls());
    assert_eq!(h.run(&id, "x").await.1, 0);
    until_ready(&h, 2).await;
    until_spares(&h, 2).await;
    assert!(!ready(&h).await.contains(&id));
}

// Multi-threaded: the pool starts spares' networks with `block_in_place`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_sandbox_ready_a_create_forks_a_spare() {
    let h = warm().await;
    until_ready(&h, 2).await;
    until_spares(&h, 2).await;
    let (a, b) = (h.create().await, h.create().await);
    let before = spares(&h).await;
    // Within the refill's delay: nothing forked ahead is left.
    let id = h.create().await;
    assert!(before.contains(&id), "{id} is not one of the spares {before:?} ({a}, {b} were ready)");
    assert_eq!(h.run(&id, "x").await.1, 0);
}

// Multi-threaded: the pool starts spares' networks with `block_in_place`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_create_that_fails_is_made_cold_and_leaks_nothing() {
    let h = warm().await;
    until_ready(&h, 2).await;
    until_spares(&h, 2).await;
    // The ready ones first: the third create forks (within the refill's delay).
    h.create().await;
    h.create().await;
    h.fake.fail(Fault::AdoptForks, 1);
    let id = h.create().await;
    assert_eq!(h.run(&id, "x").await.1, 0);
    assert!(h.fake.calls().iter().any(|c| c == &format!("create {id}")), "made cold: {:?}", h.fake.calls());
    // The pool's zygote was retired and replaced; whatever is live is
    // the sandbox or the pool's.
    h.service.destroy_all().await;
    assert!(h.live().is_empty(), "left: {:?}", h.live());
}

// Multi-threaded: the pool starts spares' networks with `block_in_place`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_fails_in_a_batch_fails_its_own_create_alone() {
    let h = warm().await;
    until_ready(&h, 2).await;
    until_spares(&h, 2).await;
    // Held here, the zygote forks nothing: the next two creates queue,
    // and so do the refills of the two taken below; let go, all fork in
    // one batch, in which one child's adoption fails.
    let warm = h.service.inner.pool.current(&default_key()).expect("a warm pool");
    let held = warm.zygote.slot.lock().await;
    h.create().await;
    h.create().await;
    h.fake.fail(Fault::AdoptForks, 1);
    let queued = || warm.fork_queue.lock().map(|q| q.waiting.len()).unwrap_or(0);
    let release = async {
        // Until the queue holds both creates and has not grown for 300 ms.
        let (mut seen, mut still) = (0, 0);
        for _ in 0..200 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            (seen, still) = if queued() == seen { (seen, still + 1) } else { (queued(), 0) };
            if seen >= 2 && still >= 6 {
                break;
            }
        }
        assert!(seen >= 2, "{seen} forks queued");
        drop(held);
    };
    let (a, b, ()) = tokio::join!(h.create(), h.create(), release);
    // Only the create whose child failed, if either did, was made cold;
    // the batch's other children were handed out as forked.
    let cold: Vec<&String> = [&a, &b].into_iter().filter(|id| h.fake.calls().contains(&format!("create {id}"))).collect();
    assert!(cold.len() <= 1, "made cold: {cold:?} of {a}, {b}: {:?}", h.fake.calls());
    for id in [&a, &b] {
        assert_eq!(h.run(id, "x").await.1, 0);
    }
    h.service.destroy_all().await;
    assert!(h.live().is_empty(), "left: {:?}", h.live());
}

// Multi-threaded: the pool starts spares' networks with `block_in_place`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_that_cannot_make_spares_still_serves_creates() {
    let h = Harness::with(|c| c.warm_pool = true);
    h.fake.fail(Fault::SpareMembers, 100);
    h.service.warm_up(&default_key()).await.expect("the zygote warms without spares");
    let id = h.create().await;
    assert_eq!(h.run(&id, "x").await.1, 0);
    h.service.destroy_all().await;
    assert!(h.live().is_empty(), "left: {:?}", h.live());
}

// Multi-threaded: the pool starts spares' networks with `block_in_place`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutting_down_destroys_the_pool_with_the_sandboxes() {
    let h = warm().await;
    until_spares(&h, 2).await;
    h.create().await;
    h.service.destroy_all().await;
    assert!(h.live().is_empty(), "left: {:?}", h.live());
}

async fn zygote(h: &Harness) -> String {
    let info = h.service.pool_info(&Caller::anonymous()).await;
    info.templates.get("default").map(|t| t.zygote.clone()).unwrap_or_default()
}

// Multi-threaded: the pool starts spares' networks with `block_in_place`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zygote_serves_on_under_churn_and_retires_when_its_family_fills() {
    let h = warm().await;
    let first = zygote(&h).await;
    // Creates that come and go: the family never holds many, so no
    // fresh zygote has to import its modules again.
    for _ in 0..(crate::pool::RETIRE_AT_LIVE + 6) {
        let id = h.create().await;
        h.service.destroy(&Caller::anonymous(), &id).await.expect("destroy");
    }
    assert_eq!(zygote(&h).await, first, "a zygote was retired under churn");
    // Sandboxes that stay: at the bound a fresh family takes over.
    let mut kept = Vec::new();
    for _ in 0..crate::pool::RETIRE_AT_LIVE {
        kept.push(h.create().await);
    }
    let replaced = tokio::time::timeout(Duration::from_secs(10), async {
        while zygote(&h).await == first || zygote(&h).await.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(replaced.is_ok(), "the zygote was not replaced with {} live sandboxes in its family", kept.len());
    // Let the retirement finish (the old zygote torn down) and the
    // successor's pool fill, as the other tests here let the pool settle.
    let retired = tokio::time::timeout(Duration::from_secs(10), async {
        while h.live().contains(&first) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(retired.is_ok(), "the retired zygote {first} is still live");
    until_ready(&h, 2).await;
    until_spares(&h, 2).await;
    let id = h.create().await;
    until_ready(&h, 2).await;
    until_spares(&h, 2).await;
    assert!(!h
        .service
        .get(&Caller::anonymous(), &id)
        .await
        .expect("get")
        .engine
        .same_family(h.service.get(&Caller::anonymous(), &kept[0]).await.expect("get").engine.as_ref()));
    h.service.destroy_all().await;
    assert!(h.live().is_empty(), "left: {:?}", h.live());
}
