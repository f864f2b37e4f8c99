//! Pause, resume, freeze and destroy, and those racing each other.

use std::sync::Arc;
use std::time::Duration;

use repl_host::fake::Reply;

use super::Harness;
use crate::engine::fake::Fault;
use crate::keys::Caller;
use crate::lifecycle::Lifecycle;
use crate::Error;

/// A REPL that answers the state script a freeze and a resume run
/// (repl/space.py) as a REPL with nothing to save would.
fn space_aware() -> repl_host::fake::OnExec {
    Arc::new(|code| {
        let answer = if code.contains("'_mode': \"freeze\"") {
            r#"{"saved": [], "unsaved": []}"#
        } else if code.contains("'_mode': \"thaw\"") {
            r#"{"restored": [], "unsaved": [], "failed": []}"#
        } else {
            ""
        };
        Reply::Ok { stdout: format!("{answer}\n").into_bytes(), exit_code: 0 }
    })
}

fn anyone() -> Caller {
    Caller::anonymous()
}

#[tokio::test]
async fn pause_then_resume_goes_paused_then_ready() {
    let h = Harness::new();
    let id = h.create().await;
    let entry = h.service.pause(&anyone(), &id).await.expect("pause");
    assert_eq!(entry.lifecycle(), Lifecycle::Paused);
    assert!(entry.engine.is_paused());
    h.service.pause(&anyone(), &id).await.expect("pausing twice is harmless");
    h.service.resume(&anyone(), &id).await.expect("resume");
    assert_eq!(entry.lifecycle(), Lifecycle::Ready);
}

#[tokio::test]
async fn an_exec_on_a_paused_sandbox_resumes_it() {
    let h = Harness::new();
    let id = h.create().await;
    let entry = h.service.pause(&anyone(), &id).await.expect("pause");
    assert_eq!(h.run(&id, "x").await.1, 0);
    assert_eq!(entry.lifecycle(), Lifecycle::Ready);
}

#[tokio::test]
async fn pause_is_refused_while_an_exec_runs() {
    let h = Harness::new();
    h.fake.on_exec(Arc::new(|_| Reply::After(Duration::from_millis(500), Box::new(Reply::Ok { stdout: vec![], exit_code: 0 }))));
    let id = h.create().await;
    let mut events = h.start(&id, "slow()").await.expect("exec");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(matches!(h.service.pause(&anyone(), &id).await, Err(Error::Conflict(_))));
    while events.recv().await.is_some() {}
    h.service.pause(&anyone(), &id).await.expect("pause once it is idle");
}

#[tokio::test]
async fn a_pause_the_engine_refuses_leaves_it_ready() {
    let h = Harness::new();
    let id = h.create().await;
    h.fake.fail(Fault::Pause, 1);
    assert!(matches!(h.service.pause(&anyone(), &id).await, Err(Error::Internal(_))));
    let entry = h.service.get(&anyone(), &id).await.expect("get");
    assert_eq!(entry.lifecycle(), Lifecycle::Ready);
    assert_eq!(h.run(&id, "x").await.1, 0);
}

#[tokio::test]
async fn a_paused_sandbox_is_destroyed_like_any_other() {
    let h = Harness::new();
    let id = h.create().await;
    h.service.pause(&anyone(), &id).await.expect("pause");
    h.service.destroy(&anyone(), &id).await.expect("destroy");
    assert!(h.live().is_empty() && h.registered().await.is_empty());
}

#[tokio::test]
async fn a_destroyed_sandbox_can_be_neither_paused_nor_resumed() {
    let h = Harness::new();
    let id = h.create().await;
    let entry = h.service.get(&anyone(), &id).await.expect("get");
    h.service.destroy(&anyone(), &id).await.expect("destroy");
    assert_eq!(entry.lifecycle(), Lifecycle::Destroyed);
    assert!(matches!(crate::pause::pause_idle(&entry).await, Err(Error::NotFound(_))));
    assert!(matches!(h.service.resume(&anyone(), &id).await, Err(Error::NotFound(_))));
}

#[tokio::test]
async fn freeze_keeps_the_files_and_frees_the_member_and_resume_brings_them_back() {
    let h = Harness::new();
    h.fake.on_exec(space_aware());
    let id = h.create().await;
    let entry = h.service.get(&anyone(), &id).await.expect("get");
    std::fs::write(entry.engine.layers().0.join("kept.txt"), b"state").expect("a file in the sandbox");
    let space = h.service.freeze(&anyone(), &id).await.expect("freeze");
    assert_eq!(entry.lifecycle(), Lifecycle::Destroyed);
    assert!(h.live().is_empty(), "the frozen sandbox's member was left: {:?}", h.live());
    assert!(matches!(h.service.get(&anyone(), &id).await, Err(Error::Conflict(m)) if m.contains("frozen")));
    let resumed = h.service.resume_space(&anyone(), &space.info.space_id, Default::default()).await.expect("resume the space");
    let kept = std::fs::read(resumed.engine.layers().0.join("kept.txt")).expect("the file came back");
    assert_eq!(kept, b"state");
    assert_eq!(h.live(), vec![resumed.engine.id().to_string()]);
}

#[tokio::test]
async fn pause_resume_exec_freeze_and_destroy_racing_leave_nothing_behind() {
    for round in 0..10 {
        let h = Harness::new();
        h.fake.on_exec(space_aware());
        let id = h.create().await;
        let (s, c) = (&h.service, anyone());
        let (paused, resumed, ran, frozen, destroyed) = tokio::join!(s.pause(&c, &id), s.resume(&c, &id), h.exec(&id, "x"), s.freeze(&c, &id), async {
            tokio::time::sleep(Duration::from_millis(round)).await;
            s.destroy(&c, &id).await
        },);
        // Each either did its work or found the sandbox gone or busy; none hangs or panics.
        let fine = |r: Result<(), &Error>| matches!(r, Ok(()) | Err(Error::NotFound(_) | Error::Conflict(_)));
        assert!(fine(paused.as_ref().map(drop)), "round {round}: pause {paused:?}", paused = paused.err());
        assert!(fine(resumed.as_ref().map(drop)), "round {round}: resume {:?}", resumed.err());
        assert!(fine(ran.as_ref().map(drop)), "round {round}: exec {:?}", ran.err());
        assert!(fine(frozen.as_ref().map(drop)), "round {round}: freeze {:?}", frozen.err());
        assert!(fine(destroyed.as_ref().map(drop)), "round {round}: destroy {:?}", destroyed.err());
        // Whatever won, no member outlives its sandbox.
        let _ = s.destroy(&c, &id).await;
        assert!(h.registered().await.is_empty(), "round {round}");
        assert!(h.live().is_empty(), "round {round}: left {:?}", h.live());
    }
}
