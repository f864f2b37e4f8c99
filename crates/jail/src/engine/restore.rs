//! A dumped solo sandbox brought back as a new sandbox (docs/state.md):
//! its files from the Space, its processes from criu's images, in a family
//! of its own with a fresh uid range, cgroup and network namespace.

use super::*;

impl Jail {
    /// A new solo sandbox (`spec.solo`) whose files are `spec.initial_upper`
    /// (saved by `Sandbox::export_upper` from the dumped one) and whose
    /// processes come back from criu's `images` (`edges` from `dump`).
    /// With the REPL, with new ends, when one was dumped. `lazily`: the
    /// tree runs before its memory is all in, where criu can
    /// (docs/state.md#lazy-resume).
    pub async fn restore(&self, spec: SandboxSpec, images: &Path, edges: &Edges, criu: &criu::Criu, lazily: bool) -> Result<(Sandbox, Option<ReplProcess>)> {
        if !spec.solo {
            return Err(Error::Invalid("only a solo sandbox is restored from a dump".into()));
        }
        let criu_root = match &criu.source {
            criu::Source::ToolsRoot(root) => Some(root.clone()),
            criu::Source::Host(_) => None,
        };
        let request = |id: &str, cgroup: &crate::cgroup::Cgroup, subvolume: &Path| Request::RestoreMember {
            member: id.to_string(),
            upper: subvolume.join("upper"),
            work: subvolume.join("work"),
            cgroup_procs: cgroup.join_files(),
            images: images.to_path_buf(),
            edges: edges.clone(),
            criu_root,
            lazily,
        };
        let (sandbox, reply, fds, exited) = self.build(spec, request).await?;
        let checked = sandbox.init_pid().and_then(|init| {
            let allowed = crate::policy::capabilities().map_err(|e| Error::Setup(e.to_string()))?;
            super::tree_creds::check_no_more_capabilities(init, &allowed)
        });
        let repl = match checked.and_then(|()| repl_of(reply, fds, exited)) {
            Ok(repl) => repl,
            Err(e) => {
                let _ = self.destroy(&sandbox).await;
                return Err(e);
            }
        };
        Ok((sandbox, repl))
    }
}

/// The restored REPL from the shim's reply: fds after init's pidfd are its
/// five namespaces, then the REPL's pidfd, control socket, stdout, stderr.
fn repl_of(reply: Reply, fds: Vec<OwnedFd>, exited: Option<oneshot::Receiver<ExitStatus>>) -> Result<Option<ReplProcess>> {
    let host_pid = match reply {
        Reply::Restored { repl_host_pid } => repl_host_pid,
        other => return Err(Error::Protocol(format!("unexpected reply {other:?}"))),
    };
    let Some(host_pid) = host_pid else { return Ok(None) };
    let mut ends = fds.into_iter().skip(5);
    let (Some(pidfd), Some(control), Some(stdout), Some(stderr)) = (ends.next(), ends.next(), ends.next(), ends.next()) else {
        return Err(Error::Protocol("the restored REPL's descriptors are missing".into()));
    };
    let exited = exited.ok_or_else(|| Error::Protocol("no waiter for the restored REPL".into()))?;
    let control = std::os::unix::net::UnixStream::from(control);
    control.set_nonblocking(true).map_err(|e| Error::io("nonblocking", e))?;
    Ok(Some(ReplProcess {
        control: tokio::net::UnixStream::from_std(control).map_err(|e| Error::io("register control socket", e))?,
        stdout: tokio::net::unix::pipe::Receiver::from_owned_fd(stdout).map_err(|e| Error::io("register pipe", e))?,
        stderr: tokio::net::unix::pipe::Receiver::from_owned_fd(stderr).map_err(|e| Error::io("register pipe", e))?,
        pidfd,
        host_pid,
        exited,
    }))
}
