//! Creating members: a new family (`Jail::create`), or new members of an existing one over fresh or no layers.

use crate::cgroup::Cgroup;

use super::*;

impl Jail {
    /// Create a sandbox: subvolume, cgroup, family shim, member.
    pub async fn create(&self, spec: SandboxSpec) -> Result<Sandbox> {
        let (sandbox, _, _, _) = self.build(spec, create_member_request).await?;
        Ok(sandbox)
    }

    /// A sandbox whose member the shim makes with `first(id, cgroup,
    /// subvolume)`; with the reply, the descriptors after init's pidfd,
    /// and for a restore, the waiter of the restored REPL's end
    /// (registered before the restore, so no end is missed).
    pub(super) async fn build(
        &self,
        spec: SandboxSpec,
        first: impl FnOnce(&str, &Cgroup, &Path) -> Request,
    ) -> Result<(Sandbox, Reply, Vec<OwnedFd>, Option<oneshot::Receiver<ExitStatus>>)> {
        let range = self.ids.lock().map_err(|_| Error::Thread("id allocator poisoned".into()))?.allocate()?;
        let release = |ids: &StdMutex<IdAllocator>| {
            if let Ok(mut ids) = ids.lock() {
                ids.release(range);
            }
        };
        let subvolume = self.volume.root().join(SANDBOXES_DIR).join(&spec.id);
        if let Err(e) = self.make_layers(&subvolume, &spec.template_rootfs, range, spec.initial_upper.as_deref(), spec.limits.disk_bytes) {
            let _ = self.volume.delete_subvolume(&subvolume);
            release(&self.ids);
            return Err(e);
        }
        let cgroup = match self.cgroups.create(&spec.id, &spec.limits) {
            Ok(c) => c,
            Err(e) => {
                let _ = self.volume.delete_subvolume(&subvolume);
                release(&self.ids);
                return Err(e);
            }
        };
        let made = self.create_member(&spec, first(&spec.id, &cgroup, &subvolume), range).await;
        match made {
            Ok((shim, reply, mut fds, config, repl_exited)) => {
                let init_pidfd = (!fds.is_empty()).then(|| fds.remove(0));
                let family = Arc::new(FamilyHandle {
                    shim: StdMutex::new(shim),
                    launcher: self.launcher.clone(),
                    config,
                    members: std::sync::atomic::AtomicUsize::new(1),
                    hollows: tokio::sync::Mutex::new(Vec::new()),
                    restart: tokio::sync::Mutex::new(()),
                });
                Ok((
                    Sandbox::new(spec.id, family, spec.template_rootfs, spec.limits, cgroup, subvolume, self.volume.clone(), init_pidfd),
                    reply,
                    fds,
                    repl_exited,
                ))
            }
            Err(e) => {
                let _ = kill_patiently(&cgroup, &spec.id);
                let _ = cgroup.remove();
                let _ = self.volume.delete_subvolume(&subvolume);
                let _ = std::fs::remove_dir_all(self.run_dir(&spec.id));
                release(&self.ids);
                Err(e)
            }
        }
    }

    /// The sandbox's writable layers on a fresh subvolume that may hold
    /// `disk_bytes` (0: no limit). The upper layer's root must belong to
    /// the sandbox's root (and carry the template root's mode), or root
    /// inside could not create anything in `/`.
    fn make_layers(&self, subvolume: &Path, template_rootfs: &Path, range: crate::ids::IdRange, initial: Option<&Path>, disk_bytes: u64) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        // Saved files go in before the limit: a Space of a fork child may
        // hold more than its own quota (what it inherited was its parent's).
        self.volume.create_subvolume(subvolume, if initial.is_some() { 0 } else { disk_bytes })?;
        for d in ["upper", "work"] {
            std::fs::create_dir(subvolume.join(d)).map_err(|e| Error::io("create layer dir", e))?;
        }
        let upper = subvolume.join("upper");
        let mode = std::fs::metadata(template_rootfs).map(|m| m.permissions().mode() & 0o7777).unwrap_or(0o755);
        std::fs::set_permissions(&upper, std::fs::Permissions::from_mode(mode)).map_err(|e| Error::io("chmod upper", e))?;
        std::os::unix::fs::chown(&upper, Some(range.base), Some(range.base)).map_err(|e| Error::io("chown upper", e))?;
        if let Some(saved) = initial {
            let into_range = crate::layer_copy::Shift { from: 0, to: range.base, count: range.count };
            crate::layer_copy::copy_tree(saved, &upper, &into_range)?;
            self.volume.set_limit(subvolume, disk_bytes)?;
        }
        Ok(())
    }

    async fn create_member(
        &self,
        spec: &SandboxSpec,
        request: Request,
        range: crate::ids::IdRange,
    ) -> Result<(Arc<ShimHandle>, Reply, Vec<OwnedFd>, ShimConfig, Option<oneshot::Receiver<ExitStatus>>)> {
        let config = ShimConfig {
            family: spec.id.clone(),
            id_base: range.base,
            id_count: range.count,
            template_rootfs: spec.template_rootfs.clone(),
            template_layers: spec.template_layers.clone(),
            trust_layer: spec.trust_layer.clone(),
            run_dir: self.run_dir(&spec.id),
            orphan_grace_ms: self.config.orphan_grace.as_millis() as u64,
            solo: spec.solo,
        };
        let shim = ShimHandle::start(&self.launcher, &config, range).await?;
        let repl_exited = match request {
            Request::RestoreMember { .. } => {
                let (tx, rx) = oneshot::channel();
                shim.repl_exits.lock().await.insert(spec.id.clone(), tx);
                Some(rx)
            }
            _ => None,
        };
        match shim.call(request, &[]).await {
            Ok((reply, fds)) => Ok((shim, reply, fds, config, repl_exited)),
            Err(e) => {
                shim.shutdown().await;
                Err(e)
            }
        }
    }

    /// Keep every member that was made (so the caller can clean up) and
    /// fail if any could not be.
    #[allow(clippy::type_complexity)]
    fn collect_members(
        built: Vec<Result<(Sandbox, Result<(Vec<OwnedFd>, oneshot::Receiver<ExitStatus>)>)>>,
        made: &mut Vec<Sandbox>,
    ) -> Result<Vec<(Vec<OwnedFd>, oneshot::Receiver<ExitStatus>)>> {
        let mut out = Vec::with_capacity(built.len());
        let mut first_error = None;
        for b in built {
            match b {
                Ok((sandbox, parts)) => {
                    made.push(sandbox);
                    match parts {
                        Ok(p) => out.push(p),
                        Err(e) => first_error = first_error.or(Some(e)),
                    }
                }
                Err(e) => first_error = first_error.or(Some(e)),
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// New members of `sibling`'s family, built concurrently: over fresh
    /// (template-only) layers, or `hollow` (no layers yet). All or none.
    pub(super) async fn new_members(&self, sibling: &Sandbox, ids: &[String], limits: &Limits, hollow: bool) -> Result<Vec<ForkChild>> {
        let range = crate::ids::IdRange { base: sibling.family.config.id_base, count: sibling.family.config.id_count };
        let builds = ids.iter().map(|id| async move {
            let subvolume = self.volume.root().join(SANDBOXES_DIR).join(id);
            if !hollow {
                // A btrfs subvolume and its quota: not on a runtime worker
                // as it is (under churn every worker-blocking step stalled
                // the server's other requests; docs/fork.md).
                let made = tokio::task::block_in_place(|| {
                    self.make_layers(&subvolume, &sibling.template_rootfs, range, None, limits.disk_bytes).inspect_err(|_| {
                        let _ = self.volume.delete_subvolume(&subvolume);
                    })
                });
                made?;
            }
            self.add_member(sibling, id, subvolume, limits, hollow).await
        });
        let mut made: Vec<Sandbox> = Vec::with_capacity(ids.len());
        match Self::collect_members(futures::future::join_all(builds).await, &mut made) {
            Ok(parts) => Ok(made.into_iter().zip(parts).map(|(sandbox, (ns, exited))| ForkChild { sandbox, ns, exited }).collect()),
            Err(e) => {
                for child in &made {
                    let _ = Box::pin(self.destroy(child)).await;
                }
                Err(e)
            }
        }
    }

    /// Build one member in `sibling`'s family over `subvolume`. The outer
    /// error: nothing was made; otherwise the member exists (to destroy on
    /// failure) and the inner result has its namespaces and REPL exit receiver.
    #[allow(clippy::type_complexity)]
    async fn add_member(
        &self,
        sibling: &Sandbox,
        id: &str,
        subvolume: PathBuf,
        limits: &Limits,
        hollow: bool,
    ) -> Result<(Sandbox, Result<(Vec<OwnedFd>, oneshot::Receiver<ExitStatus>)>)> {
        let shim = sibling.shim();
        // Its init sets the member up (mounts, namespaces) in its cgroup,
        // at the most weight until it is ready (`MEMBER_SETUP_CPU_WEIGHT`).
        // Nothing but init runs in it until the reply.
        let setting_up = Limits { cpu_weight: crate::cgroup::MEMBER_SETUP_CPU_WEIGHT, ..*limits };
        let cgroup = match tokio::task::block_in_place(|| self.cgroups.create(id, &setting_up)) {
            Ok(c) => c,
            Err(e) => {
                let _ = self.volume.delete_subvolume(&subvolume);
                return Err(e);
            }
        };
        let (exited_tx, exited_rx) = oneshot::channel();
        shim.repl_exits.lock().await.insert(id.to_string(), exited_tx);
        sibling.family.members.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let request = if hollow { hollow_member_request(id, &cgroup) } else { create_member_request(id, &cgroup, &subvolume) };
        let built = shim.call(request, &[]).await;
        // Back to its own weight before anything else runs in it.
        let built = built.and_then(|answer| cgroup.set_cpu_weight(limits.cpu_weight).map(|()| answer));
        let (init_pidfd, ns) = match built {
            Ok((_, fds)) => {
                let mut fds = fds.into_iter();
                (fds.next(), fds.collect::<Vec<_>>())
            }
            Err(e) => {
                tracing::warn!(sandbox = %id, err = %e, "creating a family member failed");
                (None, Vec::new())
            }
        };
        let ok = ns.len() == 5;
        let sandbox = Sandbox::new(
            id.to_string(),
            Arc::clone(&sibling.family),
            sibling.template_rootfs.clone(),
            *limits,
            cgroup,
            subvolume,
            self.volume.clone(),
            init_pidfd,
        );
        if !ok {
            return Ok((sandbox, Err(Error::Died(format!("could not build the namespaces of sandbox {id}")))));
        }
        Ok((sandbox, Ok((ns, exited_rx))))
    }
}

pub(super) fn create_member_request(id: &str, cgroup: &Cgroup, subvolume: &Path) -> Request {
    Request::CreateMember {
        member: id.to_string(),
        hostname: id.to_string(),
        upper: Some(subvolume.join("upper")),
        work: Some(subvolume.join("work")),
        cgroup_procs: cgroup.join_files(),
    }
}

/// A member without a root yet (a fork's spare; see `Jail::fork_members`).
fn hollow_member_request(id: &str, cgroup: &Cgroup) -> Request {
    Request::CreateMember { member: id.to_string(), hostname: id.to_string(), upper: None, work: None, cgroup_procs: cgroup.join_files() }
}
