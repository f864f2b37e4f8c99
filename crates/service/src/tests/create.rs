//! Create, exec and destroy, and what each leaves when the engine fails.

use std::sync::Arc;
use std::time::Duration;

use repl_host::fake::Reply;

use super::Harness;
use crate::engine::fake::Fault;
use crate::keys::Caller;
use crate::lifecycle::Lifecycle;
use crate::Error;

#[tokio::test]
async fn a_created_sandbox_is_registered_ready_and_its_repl_answers() {
    let h = Harness::new();
    let id = h.create().await;
    assert_eq!(h.registered().await, vec![id.clone()]);
    assert_eq!(h.live(), vec![id.clone()]);
    let entry = h.service.get(&Caller::anonymous(), &id).await.expect("get");
    assert_eq!(entry.lifecycle(), Lifecycle::Ready);
    assert_eq!(h.run(&id, "x = 1").await, ("ran x = 1".to_string(), 0));
    assert_eq!(entry.lifecycle(), Lifecycle::Ready, "back to ready after the exec");
}

#[tokio::test]
async fn an_exec_holds_the_sandbox_running_until_it_ends() {
    let h = Harness::new();
    h.fake.on_exec(Arc::new(|_| Reply::After(Duration::from_millis(300), Box::new(Reply::Ok { stdout: b"done\n".to_vec(), exit_code: 0 }))));
    let id = h.create().await;
    let entry = h.service.get(&Caller::anonymous(), &id).await.expect("get");
    let mut events = h.start(&id, "slow()").await.expect("exec");
    let run = tokio::spawn(async move { while events.recv().await.is_some() {} });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(entry.lifecycle(), Lifecycle::Running);
    run.await.expect("the exec");
    assert_eq!(entry.lifecycle(), Lifecycle::Ready);
}

#[tokio::test]
async fn destroy_frees_the_member_and_the_id_answers_not_found() {
    let h = Harness::new();
    let id = h.create().await;
    h.service.destroy(&Caller::anonymous(), &id).await.expect("destroy");
    assert!(h.live().is_empty(), "the engine still holds {:?}", h.live());
    assert!(h.registered().await.is_empty());
    assert!(matches!(h.service.get(&Caller::anonymous(), &id).await, Err(Error::NotFound(_))));
    assert!(matches!(h.service.destroy(&Caller::anonymous(), &id).await, Err(Error::NotFound(_))), "a second destroy is a 404");
    assert_eq!(h.service.inner.capacity.live(), 0);
}

#[tokio::test]
async fn destroy_while_an_exec_runs_ends_the_exec_and_frees_everything() {
    let h = Harness::new();
    h.fake.on_exec(Arc::new(|_| Reply::After(Duration::from_secs(30), Box::new(Reply::Ok { stdout: vec![], exit_code: 0 }))));
    let id = h.create().await;
    let mut events = h.start(&id, "forever()").await.expect("exec");
    tokio::time::sleep(Duration::from_millis(100)).await;
    h.service.destroy(&Caller::anonymous(), &id).await.expect("destroy");
    // The exec's stream ends (with an error or an exit), well before its 30 s.
    let drained = tokio::time::timeout(Duration::from_secs(10), async { while events.recv().await.is_some() {} }).await;
    assert!(drained.is_ok(), "the exec's stream did not end after its sandbox was destroyed");
    assert!(h.live().is_empty());
}

#[tokio::test]
async fn a_create_the_engine_refuses_leaves_nothing_and_frees_its_slot() {
    let h = Harness::with(|c| c.limits.max_sandboxes = 1);
    h.fake.fail(Fault::Create, 1);
    assert!(matches!(h.create_as(&Caller::anonymous()).await, Err(Error::Internal(_))));
    assert!(h.live().is_empty() && h.registered().await.is_empty());
    assert_eq!(h.service.inner.capacity.live(), 0);
    // The slot it held is free again: the one sandbox allowed can be made.
    h.create().await;
}

#[tokio::test]
async fn a_create_whose_repl_does_not_start_destroys_its_member() {
    let h = Harness::new();
    h.fake.fail(Fault::StartRepl, 1);
    assert!(matches!(h.create_as(&Caller::anonymous()).await, Err(Error::Internal(_))));
    assert!(h.live().is_empty(), "the member without a REPL was left: {:?}", h.live());
    assert!(h.registered().await.is_empty());
}

#[tokio::test]
async fn a_repl_that_dies_is_started_again_and_the_next_call_is_told() {
    let h = Harness::new();
    h.fake.on_exec(Arc::new(|code| match code {
        "die()" => Reply::Die(jail::ExitStatus::Signal(9)),
        _ => Reply::Ok { stdout: b"ok\n".to_vec(), exit_code: 0 },
    }));
    let id = h.create().await;
    let died = h.exec(&id, "die()").await.expect("exec");
    assert!(died.iter().any(|e| e.kind == protocol::EventKind::Error), "the dying exec reports an error: {died:?}");
    let next = h.exec(&id, "x").await.expect("exec");
    assert!(next.iter().any(|e| e.kind == protocol::EventKind::Warning), "the next exec is told the state was lost: {next:?}");
    assert_eq!(h.fake.calls().iter().filter(|c| c.starts_with("start_repl")).count(), 2, "{:?}", h.fake.calls());
}

#[tokio::test]
async fn an_engine_that_cannot_destroy_still_loses_the_sandbox_from_the_registry() {
    let h = Harness::new();
    let id = h.create().await;
    h.fake.fail(Fault::Destroy, 1);
    h.service.destroy(&Caller::anonymous(), &id).await.expect("destroy answers");
    assert!(h.registered().await.is_empty());
    assert_eq!(h.service.inner.capacity.live(), 0, "it no longer counts against the cap");
}

#[tokio::test]
async fn destroy_all_ends_every_sandbox() {
    let h = Harness::new();
    for _ in 0..3 {
        h.create().await;
    }
    h.service.destroy_all().await;
    assert!(h.live().is_empty() && h.registered().await.is_empty());
}

#[tokio::test]
async fn an_idle_sandbox_times_out_and_is_destroyed() {
    let h = Harness::new();
    let req = protocol::CreateSandbox { idle_timeout_seconds: Some(1), ..Default::default() };
    let id = h.service.create(&Caller::anonymous(), req).await.expect("create").id.clone();
    tokio::spawn(h.service.clone().expire_loop());
    let gone = tokio::time::timeout(Duration::from_secs(10), async {
        while !h.registered().await.is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(gone.is_ok(), "{id} did not time out");
    assert!(h.live().is_empty());
}
