//! Cluster-wide quotas of a key: live sandboxes, their memory limits and
//! fork children per minute, counted across every node.
//!
//! What a key uses is the keys under its name: `owned/<owner>/<id>` (one
//! per live sandbox), `tickets/<owner>/*` (reservations not yet
//! registered) and `forks/<owner>/*` (forks of the last minute, each under
//! a minute-long lease). The first two are under their node's lease, so a
//! node that dies releases what it held without anyone's help.
//!
//! A reservation reads them all and the key's `guard` in one transaction,
//! checks the limits, and writes its ticket only if the guard has not
//! moved since (moving it in the same transaction): two nodes reserving at
//! once both read, one writes, the other reads again. Releases only delete
//! keys, so a reservation that read them first saw more in use, never less.

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use serde::{Deserialize, Serialize};

pub use crate::error::Refusal;
use crate::error::{json, parse};
use crate::{now_ms, Cluster, ClusterError, Result};

/// How long a fork counts against `forks_per_minute`.
const FORK_WINDOW_S: i64 = 60;
/// Reservations that lose the race this many times in a row give up (503).
const ATTEMPTS: usize = 50;

/// A key's limits (`None`: unlimited), as a single server keeps them.
pub use protocol::keys::KeyLimits as Limits;

/// Sandboxes reserved and not yet registered (`Cluster::register`) or
/// given back (`Cluster::release`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    pub owner: String,
    pub id: String,
}

#[derive(Serialize, Deserialize)]
struct TicketRecord {
    n: u64,
    ram_mib: u64,
}

#[derive(Serialize, Deserialize)]
struct ForkRecord {
    n: u64,
    at_ms: u64,
}

/// What a key uses now.
#[derive(Debug, Default, PartialEq)]
pub struct Usage {
    pub sandboxes: u64,
    pub memory_mib: u64,
    /// Fork children of the last minute: (when, how many).
    pub forks: Vec<(u64, u64)>,
}

impl Usage {
    /// Why `n` more of `ram_mib` (a fork's when `fork`) would break
    /// `limits` for `owner`, if they would.
    pub fn refuse(&self, owner: &str, limits: &Limits, n: u64, ram_mib: u64, fork: bool, now: u64) -> Option<Refusal> {
        if let Some(max) = limits.max_sandboxes {
            if self.sandboxes + n > max {
                return Some(Refusal {
                    limit: "max_sandboxes",
                    message: format!(
                        "key `{owner}` may have {max} live sandboxes across the cluster (max_sandboxes); it has {}, and this asks for {n} more",
                        self.sandboxes
                    ),
                    retry_after_s: 5,
                });
            }
        }
        if let Some(max) = limits.max_memory_mib {
            let more = n * ram_mib;
            if self.memory_mib + more > max {
                return Some(Refusal {
                    limit: "max_memory_mib",
                    message: format!(
                        "key `{owner}` may have {max} MiB of sandbox memory limits across the cluster (max_memory_mib); its sandboxes have {} MiB, and this asks for {more} MiB more",
                        self.memory_mib
                    ),
                    retry_after_s: 5,
                });
            }
        }
        if let (true, Some(max)) = (fork, limits.forks_per_minute) {
            let window = (FORK_WINDOW_S as u64) * 1000;
            let mut recent: Vec<(u64, u64)> = self.forks.iter().copied().filter(|(at, _)| now.saturating_sub(*at) < window).collect();
            let used: u64 = recent.iter().map(|(_, k)| k).sum();
            if used + n > max {
                recent.sort();
                // When enough of them age out for `n` more.
                let mut left = used;
                let mut retry = FORK_WINDOW_S as u64;
                if n <= max {
                    for (at, k) in &recent {
                        left -= k;
                        if left + n <= max {
                            retry = ((at + window).saturating_sub(now)).div_ceil(1000).max(1);
                            break;
                        }
                    }
                }
                return Some(Refusal {
                    limit: "forks_per_minute",
                    message: format!(
                        "key `{owner}` may fork {max} children per minute across the cluster (forks_per_minute); it forked {used} in the last minute, and this asks for {n}"
                    ),
                    retry_after_s: retry,
                });
            }
        }
        None
    }
}

impl Cluster {
    /// Reserve `n` sandboxes of `ram_mib` for `owner` within `limits`,
    /// under `lease` (this node's). All or nothing.
    pub async fn reserve(&self, lease: i64, owner: &str, limits: &Limits, n: u64, ram_mib: u64, fork: bool) -> Result<Ticket> {
        let l = &self.layout;
        let ticket = Ticket { owner: owner.to_string(), id: crate::random_hex(8) };
        let ours = l.ticket(owner, &ticket.id);
        let attempt = self.reserve_attempts(lease, owner, limits, n, ram_mib, fork, &ticket).await;
        if matches!(&attempt, Err(e) if e.is_unavailable()) {
            // Its ticket may yet be written (forget_later).
            self.forget_later(vec![ours, l.fork(owner, &ticket.id)]);
        }
        attempt
    }

    #[allow(clippy::too_many_arguments)]
    async fn reserve_attempts(&self, lease: i64, owner: &str, limits: &Limits, n: u64, ram_mib: u64, fork: bool, ticket: &Ticket) -> Result<Ticket> {
        let l = &self.layout;
        let guard = l.guard(owner);
        let mut fork_lease = None;
        let ours = l.ticket(owner, &ticket.id);
        for _ in 0..ATTEMPTS {
            let read = Txn::new().and_then([
                TxnOp::get(guard.clone(), None),
                TxnOp::get(l.owned_by(owner), Some(GetOptions::new().with_prefix())),
                TxnOp::get(l.tickets_of(owner), Some(GetOptions::new().with_prefix())),
                TxnOp::get(l.forks_of(owner), Some(GetOptions::new().with_prefix())),
            ]);
            let ops = self.txn(read).await?.op_responses();
            let gets: Vec<&etcd_client::GetResponse> = ops.iter().filter_map(|o| if let TxnOpResponse::Get(g) = o { Some(g) } else { None }).collect();
            let [g, owned, tickets, forks] = gets[..] else {
                return Err(ClusterError::Corrupt("a quota read answered the wrong shape".into()));
            };
            if tickets.kvs().iter().any(|k| k.key() == ours.as_bytes()) {
                // Written by the last attempt, whose answer was lost on the way.
                return Ok(ticket.clone());
            }
            let guard_rev = g.kvs().first().map(|k| k.mod_revision()).unwrap_or(0);
            let mut usage = Usage::default();
            for k in owned.kvs() {
                usage.sandboxes += 1;
                usage.memory_mib += std::str::from_utf8(k.value()).ok().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            }
            for k in tickets.kvs() {
                let t: TicketRecord = parse(k.key(), k.value())?;
                usage.sandboxes += t.n;
                usage.memory_mib += t.n * t.ram_mib;
            }
            for k in forks.kvs() {
                let f: ForkRecord = parse(k.key(), k.value())?;
                usage.forks.push((f.at_ms, f.n));
            }
            if let Some(refusal) = usage.refuse(owner, limits, n, ram_mib, fork, now_ms()) {
                return Err(ClusterError::Quota(refusal));
            }
            let mut writes = vec![
                TxnOp::put(guard.clone(), ticket.id.clone(), None),
                TxnOp::put(l.ticket(owner, &ticket.id), json(&TicketRecord { n, ram_mib }), Some(PutOptions::new().with_lease(lease))),
            ];
            if fork && limits.forks_per_minute.is_some() {
                let fl = match fork_lease {
                    Some(fl) => fl,
                    None => *fork_lease.insert(self.grant(FORK_WINDOW_S).await?),
                };
                writes.push(TxnOp::put(l.fork(owner, &ticket.id), json(&ForkRecord { n, at_ms: now_ms() }), Some(PutOptions::new().with_lease(fl))));
            }
            let unmoved = if guard_rev == 0 {
                Compare::create_revision(guard.clone(), CompareOp::Equal, 0)
            } else {
                Compare::mod_revision(guard.clone(), CompareOp::Equal, guard_rev)
            };
            if self.txn(Txn::new().when([unmoved]).and_then(writes)).await?.succeeded() {
                return Ok(ticket.clone());
            }
            // Another reservation of this key went first: read again.
            tokio::time::sleep(std::time::Duration::from_millis(rand::random::<u64>() % 5)).await;
        }
        Err(ClusterError::Unavailable(format!("too many concurrent reservations for key `{owner}`; try again")))
    }

    /// Give back a reservation that did not become sandboxes (its fork
    /// still counts against the minute: the fork was tried).
    pub async fn release(&self, ticket: &Ticket) -> Result<()> {
        self.txn(Txn::new().and_then([TxnOp::delete(self.layout.ticket(&ticket.owner, &ticket.id), None)])).await.map(|_| ())
    }

    /// What `owner` uses across the cluster now (tests, `forkbox key list`).
    pub async fn usage(&self, owner: &str) -> Result<(u64, u64)> {
        let r = self.get_prefix(self.layout.owned_by(owner)).await?;
        let mem = r.kvs().iter().filter_map(|k| std::str::from_utf8(k.value()).ok()?.parse::<u64>().ok()).sum();
        Ok((r.kvs().len() as u64, mem))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_limit_refuses_at_its_edge() {
        let l = Limits { max_sandboxes: Some(3), forks_per_minute: Some(4), max_memory_mib: Some(1000) };
        let u = Usage { sandboxes: 2, memory_mib: 500, forks: vec![(10_000, 1), (20_000, 2)] };
        assert!(u.refuse("k", &l, 1, 500, false, 30_000).is_none(), "the last slot and the last MiB are given");
        assert_eq!(u.refuse("k", &l, 2, 100, false, 30_000).unwrap().limit, "max_sandboxes");
        assert_eq!(u.refuse("k", &l, 1, 501, false, 30_000).unwrap().limit, "max_memory_mib");
        assert!(u.refuse("k", &Limits { max_sandboxes: None, ..l }, 1, 100, true, 30_000).is_none(), "3 forked + 1 = 4");
        let r = u.refuse("k", &Limits { max_sandboxes: None, ..l }, 2, 100, true, 30_000).unwrap();
        assert_eq!(r.limit, "forks_per_minute");
        // The first fork (1 child at 10 s) ages out at 70 s: 40 s from now.
        assert_eq!(r.retry_after_s, 40);
        // Old forks no longer count.
        assert!(u.refuse("k", &Limits { max_sandboxes: None, ..l }, 4, 100, true, 80_001).is_none());
        assert!(Usage::default().refuse("k", &Limits::default(), 100, 100, true, 0).is_none(), "no limits, no refusal");
    }
}
