//! Destroying sandboxes: one member (`Jail::destroy`), or whatever a predecessor left behind (`Jail::clean_stale`).

use std::os::fd::AsFd;

use super::*;

impl Jail {
    /// Destroy a sandbox and free everything it used. The family's shim
    /// (and its id range) goes with its last member.
    pub async fn destroy(&self, sandbox: &Sandbox) -> Result<()> {
        kill_patiently_off_runtime(&sandbox.cgroup, &sandbox.id).await?;
        let shim = sandbox.shim();
        let _ = shim.call(Request::DestroyMember { member: sandbox.id.clone() }, &[]).await;
        shim.network_wanted.lock().await.remove(&sandbox.id);
        let family = &sandbox.family;
        let family_gone =
            !sandbox.released.swap(true, std::sync::atomic::Ordering::SeqCst) && family.members.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) == 1;
        if family_gone {
            shim.shutdown().await;
            // The shim's mounts died with it; its mount points are plain dirs here.
            let _ = std::fs::remove_dir_all(&family.config.run_dir);
            if let Ok(mut ids) = self.ids.lock() {
                ids.release(shim.range);
            }
        }
        // Off the runtime's workers, as the rest of this tail: rmdir retries
        // with sleeps while the last process exits, and a subvolume's
        // deletion is a btrfs transaction (bench/churn.py: these and a
        // pasta's exit, waited for on workers, stalled the server).
        let cgroup = sandbox.cgroup.clone();
        tokio::task::spawn_blocking(move || cgroup.remove()).await.map_err(|e| Error::Thread(format!("join: {e}")))??;
        // A family whose other members are gone does not keep its spares.
        if !family_gone {
            self.release_idle_hollows(family).await;
        }
        // The member's mount namespace is released asynchronously after its
        // last process exits; retry while the subvolume is still busy. A
        // hollow spare never had one.
        let mut tries = 0;
        loop {
            if !sandbox.subvolume.exists() {
                break;
            }
            let (volume, subvolume) = (sandbox.volume.clone(), sandbox.subvolume.clone());
            let deleted = tokio::task::spawn_blocking(move || volume.delete_subvolume(&subvolume)).await.map_err(|e| Error::Thread(format!("join: {e}")))?;
            match deleted {
                Ok(()) => break,
                Err(Error::Sys { source: nix::errno::Errno::EBUSY, .. }) if tries < 500 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// End the families, and kill the sandbox processes, remove the cgroups,
    /// subvolumes and run directories a predecessor left, but for the
    /// `kept` members and families (adopted). Called at start, after
    /// adoption and before anything is created.
    pub fn clean_stale(&self, kept: &Kept) -> Result<()> {
        let run = self.config.state_dir.join("run");
        if let Ok(entries) = std::fs::read_dir(&run) {
            for e in entries.flatten() {
                let family = e.file_name().to_string_lossy().into_owned();
                if !kept.families.contains(&family) {
                    end_orphan(&e.path());
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        kill_stray_shims(&run, kept);
        for name in self.cgroups.existing() {
            if kept.members.contains(&name) {
                continue;
            }
            let cg = self.cgroups.open(&name);
            kill_patiently(&cg, &name)?;
            cg.remove()?;
            tracing::info!(sandbox = %name, "removed a stale sandbox cgroup");
        }
        let dir = self.volume.root().join(SANDBOXES_DIR);
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                let path = e.path();
                if kept.members.contains(&*e.file_name().to_string_lossy()) {
                    continue;
                }
                if let Err(err) = self.volume.delete_subvolume(&path) {
                    tracing::warn!(path = %path.display(), %err, "could not delete a stale sandbox volume");
                }
            }
        }
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("create sandboxes dir", e))?;
        self.sweep_quota_groups();
        Ok(())
    }

    /// Remove the quota groups left by subvolumes that are gone, once
    /// nothing is charged to them (see `Volume::sweep_quota_groups`; the
    /// server calls this now and then). Blocking.
    pub fn sweep_quota_groups(&self) {
        let removed = self.volume.sweep_quota_groups();
        if removed > 0 {
            tracing::debug!(removed, "removed the quota groups of deleted subvolumes");
        }
    }

    /// Kill every pasta a predecessor started (the adopted sandboxes get
    /// new ones: a pasta's parent was the server that died).
    pub fn kill_stale_pastas(&self) {
        crate::net::kill_stale(&self.config.state_dir.join("run"));
    }
}

/// Kill the supervisors of this state directory's families that are not
/// `kept` and that `end_orphan` could not reach: one started by a server
/// killed before the shim was listening, say, would otherwise wait out its
/// orphan grace holding its family (found by tests/e2e/test_faults.py).
/// Its reaper goes with it, and the family's processes with the reaper.
fn kill_stray_shims(run: &Path, kept: &Kept) {
    let Ok(procs) = std::fs::read_dir("/proc") else { return };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        let Ok(pidfd) = crate::sys::pidfd_open(nix::unistd::Pid::from_raw(pid)) else { continue };
        // Read after the pidfd is open: the pid cannot be reused under us.
        let Ok(cmdline) = std::fs::read(p.path().join("cmdline")) else { continue };
        let mut args = cmdline.split(|b| *b == 0);
        if args.nth(1) != Some(b"__shim".as_slice()) {
            continue;
        }
        let Some(config) = args.next().and_then(|a| serde_json::from_slice::<ShimConfig>(a).ok()) else { continue };
        if config.run_dir.starts_with(run) && !kept.families.contains(&config.family) {
            tracing::warn!(family = %config.family, pid, "killing the supervisor of a family nobody adopted");
            let _ = crate::sys::pidfd_send_signal(pidfd.as_fd(), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// Tell an orphaned family's shim (waiting in `run_dir` for a server) to
/// end; it takes its family's processes with it.
fn end_orphan(run_dir: &Path) {
    let socket = run_dir.join(SHIM_SOCKET_NAME);
    if let Ok(sock) = crate::channel::connect(&socket) {
        let bye = Envelope { req: 0, request: Request::Shutdown };
        let _ = crate::channel::send(sock.as_fd(), &bye, &[]);
        // Wait (briefly) for it to go: it closes its end as it exits. One
        // that does not (still busy, not listening yet) is killed next, by
        // `kill_stray_shims`.
        let mut fds = [nix::poll::PollFd::new(sock.as_fd(), nix::poll::PollFlags::POLLIN)];
        let _ = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(2000u16));
    }
}
