//! Draining (docs/cluster.md#drain): a node asked to drain takes no new
//! work and moves each of its sandboxes to a peer under the same id, by
//! freezing it into a Space and having the peer resume that Space
//! (`cluster::moves` coordinates it in etcd). A sandbox no peer could take
//! is resumed here again, as it was.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster::membership::Membership;
use cluster::moves::{DrainReport, Moved, NotMoved};
use cluster::Cluster;
use service::keys::Caller;

/// How often requests are looked for without a change seen.
const LOOK_EVERY: Duration = Duration::from_secs(5);
/// Longest a peer may take to resume one sandbox.
const RESUME_WAIT: Duration = Duration::from_secs(120);
/// Sandboxes moved at once.
const AT_ONCE: usize = 4;
/// How long a sandbox marked moving waits before it is frozen: a call a
/// gateway routed just before the mark reaches this node, and queues ahead
/// of the freeze, within it.
const IN_FLIGHT: Duration = Duration::from_millis(100);

/// Resume the Spaces peers ask this node to (as the ids they name).
pub(super) async fn answer_resumes(cluster: Cluster, me: String, state: server::AppState) {
    let mut wake = cluster.changes_under(&cluster.layout.resumes_for(&me), LOOK_EVERY).await;
    while wake.recv().await.is_some() {
        let Ok(requests) = cluster.resume_requests(&me).await else { continue };
        for request in requests {
            let made = state.resume_space_as(&Caller::anonymous(), &request.space, Default::default(), Some(request.keep_id.clone())).await;
            let error = made.err().map(|e| e.to_string());
            match &error {
                None => tracing::info!(sandbox = %request.keep_id, space = %request.space, "took a sandbox from a draining node"),
                Some(e) => tracing::warn!(sandbox = %request.keep_id, error = %e, "could not take a sandbox from a draining node"),
            }
            if let Err(e) = cluster.answer_resume(&me, &request, error).await {
                tracing::error!(error = %e, "could not answer a draining node");
            }
        }
    }
}

/// Drain when asked (at start too: a drained node stays drained until
/// its drain is cancelled).
pub(super) async fn follow_drains(cluster: Cluster, membership: Arc<Membership>, state: server::AppState) {
    let me = membership.name();
    let mut wake = cluster.changes_under(&cluster.layout.drain(&me), LOOK_EVERY).await;
    let mut done = None;
    while wake.recv().await.is_some() {
        let request = match cluster.drain_requested(&me).await {
            Ok(Some(r)) => r,
            Ok(None) => {
                if done.take().is_some() {
                    tracing::info!(node = %me, "drain cancelled: taking work again");
                    if let Err(e) = membership.update(|r| r.draining = false).await {
                        tracing::error!(error = %e, "could not mark this node as taking work");
                    }
                }
                continue;
            }
            Err(_) => continue,
        };
        if done.as_ref() == Some(&request.ticket) {
            continue;
        }
        let report = drain(&cluster, &membership, &state, &request.ticket).await;
        tracing::info!(node = %me, moved = report.moved.len(), failed = report.failed.len(), took_ms = report.took_ms, "drained");
        if let Err(e) = cluster.report_drain(&report).await {
            tracing::error!(error = %e, "could not report the drain");
        }
        done = Some(request.ticket);
    }
}

async fn drain(cluster: &Cluster, membership: &Membership, state: &server::AppState, ticket: &str) -> DrainReport {
    let started = Instant::now();
    let me = membership.name();
    // No new work from now on (placement skips a draining node).
    if let Err(e) = membership.update(|r| r.draining = true).await {
        tracing::error!(error = %e, "could not mark this node draining");
    }
    let ids: Vec<String> = state.list(&Caller::anonymous()).await.into_iter().map(|e| e.id.clone()).collect();
    use futures::StreamExt;
    let outcomes: Vec<Result<Moved, NotMoved>> =
        futures::stream::iter(ids).map(|id| move_one(cluster, &me, state, id)).buffer_unordered(AT_ONCE).collect().await;
    let (mut moved, mut failed) = (Vec::new(), Vec::new());
    for o in outcomes {
        match o {
            Ok(m) => moved.push(m),
            Err(f) => failed.push(f),
        }
    }
    DrainReport { ticket: ticket.to_string(), node: me, moved, failed, took_ms: started.elapsed().as_millis() as u64 }
}

/// Move sandbox `id` to a peer: calls with its id wait meanwhile.
async fn move_one(cluster: &Cluster, me: &str, state: &server::AppState, id: String) -> Result<Moved, NotMoved> {
    let failed = |error: String| NotMoved { id: id.clone(), error };
    cluster.mark_moving(&id, me).await.map_err(|e| failed(e.to_string()))?;
    tokio::time::sleep(IN_FLIGHT).await;
    let result = move_marked(cluster, me, state, &id).await;
    if let Err(e) = cluster.moved(&id).await {
        tracing::warn!(sandbox = %id, error = %e, "could not clear a moving mark (it expires by itself)");
    }
    result.map_err(failed)
}

async fn move_marked(cluster: &Cluster, me: &str, state: &server::AppState, id: &str) -> Result<Moved, String> {
    let anyone = Caller::anonymous();
    let space = state.freeze(&anyone, id).await.map_err(|e| format!("could not freeze it: {e}"))?.info.space_id;
    let nodes = cluster.nodes().await.unwrap_or_default();
    let mut peers: Vec<&cluster::NodeRecord> = nodes.iter().filter(|n| n.name != me && !n.draining && n.load.has_room()).collect();
    peers.sort_by_key(|n| n.load.sandboxes);
    for peer in peers {
        match cluster.resume_on(&peer.name, &space, id, RESUME_WAIT).await {
            Ok(answer) if answer.error.is_none() => return Ok(Moved { id: id.to_string(), to: peer.name.clone() }),
            Ok(answer) => tracing::warn!(sandbox = %id, peer = %peer.name, error = ?answer.error, "a peer could not take a sandbox; trying another"),
            Err(e) => tracing::warn!(sandbox = %id, peer = %peer.name, error = %e, "could not ask a peer to take a sandbox"),
        }
    }
    // Nobody could: it stays here, as it was.
    match state.resume_space_as(&anyone, &space, Default::default(), Some(id.to_string())).await {
        Ok(_) => Err("no other node could take it; it runs here again".into()),
        Err(e) => Err(format!("no other node could take it, and it could not be resumed here ({e}); it is kept as space {space}")),
    }
}
