//! Taking sandboxes back after a server restart (docs/state.md#restarts).
//!
//! A family's shim outlives a server that goes away without saying
//! `Shutdown` (a crash, an upgrade): it keeps the family running, queues
//! the events no one is there to hear, and waits on `run/<family>/shim.sock`
//! for `ShimConfig::orphan_grace_ms`. The next server reads its records
//! (`MemberRecord`, kept by the server), connects, takes back the members it
//! has records of — their REPLs included, whose server-side descriptors the
//! shim kept (`Sandbox::keep_repl_ends`) — and ends the others (the warm
//! pool's zygotes and spares, hollow fork spares, checkpoints).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use super::*;

/// What a server keeps about one member to find it again after a restart.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberRecord {
    /// The member's name in its family.
    pub member: String,
    pub family: ShimConfig,
    pub limits: Limits,
}

/// Names `clean_stale` spares. A family is named after its first member,
/// which may be gone (a warm pool's zygote), so the two are kept apart.
#[derive(Debug, Default, Clone)]
pub struct Kept {
    pub members: HashSet<String>,
    pub families: HashSet<String>,
}

impl Kept {
    pub fn extend(&mut self, other: Kept) {
        self.members.extend(other.members);
        self.families.extend(other.families);
    }
}

/// A member taken back by a new server.
pub struct Adopted {
    pub sandbox: Sandbox,
    /// The server's ends of its REPL, when one was running.
    pub repl: Option<ReplProcess>,
}

/// Command ids a restarted server hands out start here, far above any its
/// predecessor used, so an old command's late events cannot be taken for
/// a new one's.
const ADOPTED_COMMAND_IDS: u64 = 1 << 40;

impl Sandbox {
    /// What to persist so a restarted server can adopt this member.
    pub fn record(&self) -> MemberRecord {
        MemberRecord { member: self.id.clone(), family: self.family.config.clone(), limits: self.limits() }
    }

    /// Have the family's shim keep duplicates of the server's ends of this
    /// member's REPL ([control, stdout, stderr]), so the REPL never sees
    /// them close when the server dies. Needed once per REPL; a no-op when
    /// families do not outlive the server.
    pub async fn keep_repl_ends(&self, repl_host_pid: i32, ends: [OwnedFd; 3]) -> Result<()> {
        if self.family.config.orphan_grace_ms == 0 {
            return Ok(());
        }
        let raw = ends.each_ref().map(|fd| fd.as_raw_fd());
        self.shim().call(Request::Deposit { member: self.id.clone(), repl: repl_host_pid }, &raw).await.map(|_| ())
    }
}

impl Jail {
    /// Take back the members of `records` whose families still run. One
    /// result per record, in order; an error says why that one is lost.
    /// Call `clean_stale` afterwards with the names `adopted_names` gives.
    pub async fn adopt(&self, records: &[MemberRecord]) -> Vec<Result<Adopted>> {
        let mut by_family: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, r) in records.iter().enumerate() {
            by_family.entry(r.family.family.as_str()).or_default().push(i);
        }
        let mut out: Vec<Option<Result<Adopted>>> = records.iter().map(|_| None).collect();
        for indices in by_family.into_values() {
            let members: Vec<&MemberRecord> = indices.iter().map(|&i| &records[i]).collect();
            match self.adopt_family(&members).await {
                Ok(results) => {
                    for (i, r) in indices.into_iter().zip(results) {
                        out[i] = Some(r);
                    }
                }
                Err(e) => {
                    let why = e.to_string();
                    for i in indices {
                        out[i] = Some(Err(Error::NotAdopted(why.clone())));
                    }
                }
            }
        }
        out.into_iter().map(|r| r.unwrap_or_else(|| Err(Error::NotAdopted("not adopted".into())))).collect()
    }

    /// What `clean_stale` must leave alone: the adopted members, and their
    /// families' run directories.
    pub fn adopted_names<'a>(adopted: impl IntoIterator<Item = &'a Sandbox>) -> Kept {
        let mut kept = Kept::default();
        for s in adopted {
            kept.members.insert(s.id.clone());
            kept.families.insert(s.family.config.family.clone());
        }
        kept
    }

    async fn adopt_family(&self, records: &[&MemberRecord]) -> Result<Vec<Result<Adopted>>> {
        let config = records[0].family.clone();
        let range = crate::ids::IdRange { base: config.id_base, count: config.id_count };
        if !self.ids.lock().map(|mut ids| ids.take(range)).unwrap_or(false) {
            return Err(Error::Invalid("its host uid range is not this server's to use".into()));
        }
        let release = || {
            if let Ok(mut ids) = self.ids.lock() {
                ids.release(range);
            }
        };
        let shim = match ShimHandle::connect(&config.run_dir.join(SHIM_SOCKET_NAME), range).await {
            Ok(s) => s,
            Err(e) => {
                release();
                return Err(Error::NotAdopted(format!("its supervisor is gone ({e})")));
            }
        };
        // An older server may have left it where that server ran.
        if let Some(pid) = shim.adopted_pid().and_then(|p| u32::try_from(p).ok()) {
            self.launcher.place(pid);
        }
        let present = match shim.call(Request::ListMembers, &[]).await {
            Ok((Reply::Members { members, protocol }, _)) => {
                shim.set_protocol(protocol);
                members
            }
            other => {
                shim.shutdown().await;
                release();
                return Err(Error::NotAdopted(format!("its supervisor did not list its members: {:?}", other.map(|r| r.0))));
            }
        };
        let family = Arc::new(FamilyHandle {
            shim: StdMutex::new(Arc::clone(&shim)),
            launcher: self.launcher.clone(),
            config: config.clone(),
            members: std::sync::atomic::AtomicUsize::new(0),
            hollows: tokio::sync::Mutex::new(Vec::new()),
            restart: tokio::sync::Mutex::new(()),
        });
        let mut results = Vec::with_capacity(records.len());
        for record in records {
            let state = present.iter().find(|m| m.member == record.member);
            results.push(self.adopt_member(&family, &shim, record, state).await);
        }
        // Members no record names end now.
        let kept: HashSet<&str> = results.iter().filter_map(|r| r.as_ref().ok()).map(|a| a.sandbox.id.as_str()).collect();
        for m in present.iter().filter(|m| !kept.contains(m.member.as_str())) {
            let _ = shim.call(Request::DestroyMember { member: m.member.clone() }, &[]).await;
        }
        if family.members.load(Ordering::SeqCst) == 0 {
            shim.shutdown().await;
            let _ = std::fs::remove_dir_all(&config.run_dir);
            release();
        } else {
            // Every waiter is in place: now the events that happened while
            // no server was there (a REPL that died, a command that ended).
            shim.call(Request::Attached, &[]).await?;
        }
        Ok(results)
    }

    async fn adopt_member(&self, family: &Arc<FamilyHandle>, shim: &Arc<ShimHandle>, record: &MemberRecord, state: Option<&MemberState>) -> Result<Adopted> {
        let state = state.ok_or_else(|| Error::NotAdopted("its supervisor no longer has it".into()))?;
        if !state.init_alive {
            return Err(Error::NotAdopted("its init died".into()));
        }
        let cgroup = self.cgroups.open(&record.member);
        if !cgroup.exists() {
            return Err(Error::NotAdopted("its cgroup is gone".into()));
        }
        let (exited_tx, exited_rx) = oneshot::channel();
        shim.repl_exits.lock().await.insert(record.member.clone(), exited_tx);
        let reattached = shim.call(Request::Reattach { member: record.member.clone() }, &[]).await;
        let (repl_host_pid, fds) = match reattached {
            Ok((Reply::Reattached { repl_host_pid }, fds)) => (repl_host_pid, fds),
            other => {
                shim.repl_exits.lock().await.remove(&record.member);
                return Err(Error::NotAdopted(format!("its supervisor would not hand it back: {:?}", other.map(|r| r.0))));
            }
        };
        let mut fds = fds.into_iter();
        let subvolume = self.volume.root().join(SANDBOXES_DIR).join(&record.member);
        family.members.fetch_add(1, Ordering::SeqCst);
        let sandbox = Sandbox::new(
            record.member.clone(),
            Arc::clone(family),
            record.family.template_rootfs.clone(),
            record.limits,
            cgroup,
            subvolume,
            self.volume.clone(),
            fds.next(),
        );
        sandbox.next_command.store(ADOPTED_COMMAND_IDS, Ordering::Relaxed);
        // Kept on the volume across restarts; set again for a sandbox that
        // lived before its volume had quotas.
        if let Err(err) = self.volume.set_limit(&sandbox.subvolume, record.limits.disk_bytes) {
            tracing::warn!(sandbox = %record.member, %err, "could not set an adopted sandbox's disk limit");
        }
        if sandbox.cgroup.is_frozen() {
            *sandbox.paused.lock().unwrap_or_else(|e| e.into_inner()) = true;
            sandbox.paused_now.store(true, Ordering::SeqCst);
        }
        let ends: Vec<OwnedFd> = fds.collect();
        let repl = match (repl_host_pid, <[OwnedFd; 4]>::try_from(ends)) {
            (Some(host_pid), Ok([pidfd, control, stdout, stderr])) => Some(repl_process(host_pid, pidfd, control, stdout, stderr, exited_rx)?),
            _ => {
                shim.repl_exits.lock().await.remove(&record.member);
                None
            }
        };
        Ok(Adopted { sandbox, repl })
    }
}

/// The server's ends of a REPL, registered with tokio again.
fn repl_process(
    host_pid: i32,
    pidfd: OwnedFd,
    control: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
    exited: oneshot::Receiver<ExitStatus>,
) -> Result<ReplProcess> {
    let io = |e: std::io::Error| Error::io("register an adopted REPL's descriptors", e);
    let control = std::os::unix::net::UnixStream::from(control);
    control.set_nonblocking(true).map_err(io)?;
    Ok(ReplProcess {
        control: tokio::net::UnixStream::from_std(control).map_err(io)?,
        stdout: tokio::net::unix::pipe::Receiver::from_owned_fd(stdout).map_err(io)?,
        stderr: tokio::net::unix::pipe::Receiver::from_owned_fd(stderr).map_err(io)?,
        pidfd,
        host_pid,
        exited,
    })
}
