//! A stand-in REPL that speaks the control protocol (docs/repl-protocol.md)
//! from a task: a ready frame, then an answer to every exec and fork frame.
//! With it, a `ReplSession` (and, through a fake engine, the service's
//! lifecycle) is tested without Python, a sandbox or root.

use std::sync::{Arc, Mutex};

use jail::ExitStatus;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::oneshot;

/// What the fake does with one exec's code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Print `stdout` (on the raw pipe) and finish with `exit_code`.
    Ok { stdout: Vec<u8>, exit_code: i32 },
    /// Raise `ename: evalue` (exit code 1).
    Raise { ename: String, evalue: String },
    /// Die before answering, with this status.
    Die(ExitStatus),
    /// Wait this long, then answer so (an exec that takes a while).
    After(std::time::Duration, Box<Reply>),
}

/// The fake's behaviour: how it answers each exec (by its code).
pub type OnExec = Arc<dyn Fn(&str) -> Reply + Send + Sync>;

/// How it answers a fork into `n` children: the children's pids, or why not.
pub type OnFork = Arc<dyn Fn(usize) -> Result<Vec<i64>, String> + Send + Sync>;

/// Fork into as many children as asked (pids from 100).
pub fn forks_all() -> OnFork {
    Arc::new(|n| Ok((0..n as i64).map(|i| 100 + i).collect()))
}

/// Answer every fork with `pids` (None: refuse it).
pub fn forks_as(pids: Option<Vec<i64>>) -> OnFork {
    Arc::new(move |_| pids.clone().ok_or_else(|| "fork refused".to_string()))
}

/// The server's ends of a fake REPL, as an engine hands a real one over.
pub struct FakeEnds {
    pub control: tokio::net::UnixStream,
    pub stdout: pipe::Receiver,
    pub stderr: pipe::Receiver,
    pub exited: oneshot::Receiver<ExitStatus>,
    /// The codes it was given, in order.
    pub seen: Arc<Mutex<Vec<String>>>,
    /// Kills it (as SIGKILL would) when used or dropped.
    pub kill: Kill,
}

/// Kills a fake REPL when dropped: it stops answering, hangs up, and its
/// exit says signal 9 (what destroying a sandbox does to a real one).
pub struct Kill(#[allow(dead_code)] oneshot::Sender<()>);

/// Start a fake REPL that answers execs with `on_exec` and forks with `on_fork`.
pub fn spawn(on_exec: OnExec, on_fork: OnFork) -> std::io::Result<FakeEnds> {
    let (ours, theirs) = tokio::net::UnixStream::pair()?;
    let (out_w, out_r) = pipe::pipe()?;
    let (err_w, err_r) = pipe::pipe()?;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (exited, kill) = serve_on(theirs, out_w, err_w, on_exec, on_fork, Arc::clone(&seen));
    Ok(FakeEnds { control: ours, stdout: out_r, stderr: err_r, exited, seen, kill })
}

/// Run a fake REPL on the REPL's ends of its channels (a forked child's,
/// which an engine was handed); resolves with its exit status, once the
/// server hangs up, a reply says die or `Kill` is dropped. Codes it runs
/// go to `seen`.
pub fn serve_on(
    control: tokio::net::UnixStream,
    stdout: pipe::Sender,
    stderr: pipe::Sender,
    on_exec: OnExec,
    on_fork: OnFork,
    seen: Arc<Mutex<Vec<String>>>,
) -> (oneshot::Receiver<ExitStatus>, Kill) {
    let (exit_tx, exited) = oneshot::channel();
    let (kill, killed) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let (mut control, mut stdout, _stderr) = (control, stdout, stderr);
        let status = tokio::select! {
            status = serve(&mut control, &mut stdout, on_exec, on_fork, seen) => status,
            _ = killed => ExitStatus::Signal(9),
        };
        drop(control);
        let _ = exit_tx.send(status);
    });
    (exited, Kill(kill))
}

fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = ((payload.len() + 1) as u32).to_be_bytes().to_vec();
    f.push(kind);
    f.extend_from_slice(payload);
    f
}

/// Answer frames until the server hangs up or a reply says die.
async fn serve(control: &mut tokio::net::UnixStream, stdout: &mut pipe::Sender, on_exec: OnExec, on_fork: OnFork, seen: Arc<Mutex<Vec<String>>>) -> ExitStatus {
    let ready = serde_json::json!({"pid": 1, "python": "fake", "pidns": true, "forked": false});
    if control.write_all(&frame(b'R', ready.to_string().as_bytes())).await.is_err() {
        return ExitStatus::Code(1);
    }
    loop {
        let mut len = [0u8; 4];
        if control.read_exact(&mut len).await.is_err() {
            return ExitStatus::Code(0);
        }
        let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
        if control.read_exact(&mut body).await.is_err() || body.is_empty() {
            return ExitStatus::Code(0);
        }
        let (kind, payload) = (body[0], &body[1..]);
        let msg: serde_json::Value = serde_json::from_slice(payload).unwrap_or_default();
        let id = msg["id"].as_u64().unwrap_or(0);
        let answer = match kind {
            b'X' => {
                let code = msg["code"].as_str().unwrap_or_default().to_string();
                seen.lock().unwrap_or_else(|e| e.into_inner()).push(code.clone());
                let mut reply = on_exec(&code);
                while let Reply::After(wait, then) = reply {
                    tokio::time::sleep(wait).await;
                    reply = *then;
                }
                match reply {
                    Reply::Ok { stdout: out, exit_code } => {
                        if stdout.write_all(&out).await.is_err() {
                            return ExitStatus::Code(1);
                        }
                        frame(b'D', serde_json::json!({"id": id, "exit_code": exit_code, "error": null}).to_string().as_bytes())
                    }
                    Reply::Raise { ename, evalue } => {
                        let error = serde_json::json!({"ename": ename, "evalue": evalue, "traceback": []});
                        frame(b'D', serde_json::json!({"id": id, "exit_code": 1, "error": error}).to_string().as_bytes())
                    }
                    Reply::Die(status) => return status,
                    Reply::After(..) => unreachable!("unwrapped above"),
                }
            }
            // One answer per fork, after its last child's frame.
            b'F' if msg["index"].as_u64().map(|i| i + 1) == msg["count"].as_u64() => {
                let answer = match on_fork(msg["count"].as_u64().unwrap_or(0) as usize) {
                    Ok(pids) => serde_json::json!({"id": id, "pids": pids, "error": null}),
                    Err(why) => serde_json::json!({"id": id, "pids": [], "error": why}),
                };
                frame(b'f', answer.to_string().as_bytes())
            }
            _ => continue,
        };
        if control.write_all(&answer).await.is_err() {
            return ExitStatus::Code(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{ReplItem, ReplSession, SessionError};

    /// A session on a fake REPL, and what the REPL was given. The REPL
    /// lives as long as the test (its `Kill` is leaked on purpose).
    async fn session(on_exec: OnExec, fork_pids: Option<Vec<i64>>) -> (ReplSession, Arc<Mutex<Vec<String>>>) {
        let ends = spawn(on_exec, forks_as(fork_pids)).expect("fake REPL");
        let seen = Arc::clone(&ends.seen);
        std::mem::forget(ends.kill);
        let s = ReplSession::start_forked(ends.control, ends.stdout, ends.stderr, ends.exited).await.expect("ready");
        (s, seen)
    }

    #[tokio::test]
    async fn a_killed_repl_dies_of_signal_9() {
        let ends = spawn(Arc::new(|_| Reply::Ok { stdout: vec![], exit_code: 0 }), forks_all()).expect("fake REPL");
        let mut s = ReplSession::start_forked(ends.control, ends.stdout, ends.stderr, ends.exited).await.expect("ready");
        drop(ends.kill);
        let mut last = None;
        while let Some(item) = s.next().await {
            last = Some(item);
        }
        assert!(matches!(last, Some(ReplItem::Died(Some(ExitStatus::Signal(9))))), "{last:?}");
    }

    /// Items until the exec's `Done` (or the REPL's death).
    async fn run(s: &mut ReplSession, code: &str) -> Vec<ReplItem> {
        let id = s.send_exec(code).await.expect("send");
        let mut items = Vec::new();
        while let Some(item) = s.next().await {
            let end = matches!(&item, ReplItem::Done(d) if d.id == id) || matches!(item, ReplItem::Died(_));
            items.push(item);
            if end {
                break;
            }
        }
        items
    }

    #[tokio::test]
    async fn an_exec_gets_its_output_then_its_end() {
        let (mut s, seen) = session(Arc::new(|code| Reply::Ok { stdout: format!("ran {code}\n").into_bytes(), exit_code: 0 }), None).await;
        let items = run(&mut s, "print(1)").await;
        let out: Vec<u8> = items.iter().filter_map(|i| if let ReplItem::Stdout(b) = i { Some(b.clone()) } else { None }).flatten().collect();
        assert_eq!(out, b"ran print(1)\n", "output comes before the end (the pipes are drained first)");
        assert!(matches!(items.last(), Some(ReplItem::Done(d)) if d.exit_code == 0 && d.error.is_none()));
        assert_eq!(*seen.lock().unwrap(), vec!["print(1)".to_string()]);
    }

    #[tokio::test]
    async fn an_exception_is_the_exec_s_error() {
        let (mut s, _) = session(Arc::new(|_| Reply::Raise { ename: "ZeroDivisionError".into(), evalue: "division by zero".into() }), None).await;
        let items = run(&mut s, "1/0").await;
        match items.last() {
            Some(ReplItem::Done(d)) => {
                let e = d.error.as_ref().expect("an error");
                assert_eq!((e.ename.as_str(), e.evalue.as_str(), d.exit_code), ("ZeroDivisionError", "division by zero", 1));
            }
            other => panic!("not an end: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_repl_that_dies_mid_exec_is_reported_with_its_status() {
        let (mut s, _) = session(Arc::new(|_| Reply::Die(ExitStatus::Signal(9))), None).await;
        let items = run(&mut s, "import os; os._exit(0)").await;
        assert!(matches!(items.last(), Some(ReplItem::Died(Some(ExitStatus::Signal(9))))), "{items:?}");
    }

    #[tokio::test]
    async fn a_fork_is_answered_with_the_children_s_pids_or_refused() {
        let ok = |_: &str| Reply::Ok { stdout: Vec::new(), exit_code: 0 };
        let (mut s, _) = session(Arc::new(ok), Some(vec![7, 8])).await;
        let id = s.send_fork(&serde_json::json!({}), &[5, 5], 0).await.expect("send");
        let f = s.wait_forked(id).await.expect("an answer");
        assert_eq!((f.pids, f.error), (vec![7, 8], None));

        let (mut s, _) = session(Arc::new(ok), None).await;
        let id = s.send_fork(&serde_json::json!({}), &[5], 0).await.expect("send");
        assert_eq!(s.wait_forked(id).await.expect("an answer").error.as_deref(), Some("fork refused"));
    }

    #[tokio::test]
    async fn a_fork_that_the_repl_dies_in_says_so() {
        let (mut s, _) = session(Arc::new(|_| Reply::Die(ExitStatus::Code(1))), Some(vec![1])).await;
        // The exec kills it; the fork sent after finds it gone.
        let _ = s.send_exec("die").await;
        let id = s.send_fork(&serde_json::json!({}), &[5], 0).await.unwrap_or(0);
        assert!(matches!(s.wait_forked(id).await, Err(SessionError::DiedWhileForking)));
    }
}
