//! The jail engine behind the service's traits: each verb is the jail's own.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use jail::{Jail, Limits, MemberRecord, ReplProcess, Sandbox, SandboxSpec};

use super::{Adoption, Engine, Forked, Member, MemberRef, VolumeUsage};

/// The jail's sandbox behind `member` (every member a `Jail` is asked
/// about is one it made).
fn own(member: &dyn Member) -> jail::Result<&Sandbox> {
    member.as_any().downcast_ref::<Sandbox>().ok_or_else(|| jail::Error::Invalid(format!("`{}` is not a jail sandbox", member.id())))
}

fn forked(made: Vec<jail::ForkChild>) -> Vec<Forked> {
    made.into_iter().map(|c| Forked { member: Arc::new(c.sandbox), ns: c.ns, exited: c.exited }).collect()
}

#[async_trait::async_trait]
impl Engine for Jail {
    async fn create(&self, spec: SandboxSpec) -> jail::Result<MemberRef> {
        Ok(Arc::new(Jail::create(self, spec).await?))
    }

    async fn destroy(&self, member: &dyn Member) -> jail::Result<()> {
        Jail::destroy(self, own(member)?).await
    }

    async fn fork_members(&self, parent: &dyn Member, ids: &[String], repl: Option<i32>) -> jail::Result<(Vec<Forked>, jail::Rooting)> {
        let (made, rooting) = Jail::fork_members(self, own(parent)?, ids, repl).await?;
        Ok((forked(made), rooting))
    }

    async fn spare_members(&self, sibling: &dyn Member, ids: &[String], limits: &Limits) -> jail::Result<Vec<Forked>> {
        Ok(forked(Jail::spare_members(self, own(sibling)?, ids, limits).await?))
    }

    async fn expect_fork(&self, parent: &dyn Member, parent_repl: i32, slot: usize, child: &dyn Member, fds: &[BorrowedFd<'_>]) -> jail::Result<()> {
        Jail::expect_fork(self, own(parent)?, parent_repl, slot, own(child)?, fds).await
    }

    async fn adopt_forks(&self, parent: &dyn Member, parent_repl: i32, children: &[&dyn Member]) -> jail::Result<Vec<(i32, OwnedFd)>> {
        let children = children.iter().map(|c| own(*c)).collect::<jail::Result<Vec<_>>>()?;
        Jail::adopt_forks(self, own(parent)?, parent_repl, &children).await
    }

    async fn refill_hollows(&self, member: &dyn Member, target: usize, new_id: &(dyn Fn() -> String + Sync)) -> jail::Result<()> {
        Jail::refill_hollows(self, own(member)?, target, new_id).await
    }

    async fn stop_refills(&self) {
        Jail::stop_refills(self).await
    }

    fn spare_ids(&self) -> Vec<String> {
        Jail::spare_ids(self)
    }

    async fn dump(&self, member: &dyn Member, criu: &criu::Criu, images: &Path, after: jail::AfterDump) -> jail::Result<jail::Edges> {
        Jail::dump(self, own(member)?, criu, images, after).await
    }

    async fn restore(
        &self,
        spec: SandboxSpec,
        images: &Path,
        edges: &jail::Edges,
        criu: &criu::Criu,
        lazily: bool,
    ) -> jail::Result<(MemberRef, Option<ReplProcess>)> {
        let (sandbox, repl) = Jail::restore(self, spec, images, edges, criu, lazily).await?;
        Ok((Arc::new(sandbox), repl))
    }

    async fn take_over(&self, records: &[MemberRecord]) -> jail::Result<Vec<jail::Result<Adoption>>> {
        // The pastas were the dead server's children: new ones are started.
        self.kill_stale_pastas();
        let results = self.adopt(records).await;
        let kept = Jail::adopted_names(results.iter().filter_map(|r| r.as_ref().ok()).map(|a| &a.sandbox));
        self.clean_stale(&kept)?;
        Ok(results.into_iter().map(|r| r.map(|a| Adoption { member: Arc::new(a.sandbox), repl: a.repl })).collect())
    }

    fn volume_usage(&self) -> jail::Result<VolumeUsage> {
        Jail::volume_usage(self)
    }

    fn sweep(&self) {
        self.sweep_quota_groups()
    }

    fn leave_running(&self) {
        Jail::leave_running(self)
    }

    fn is_left_running(&self) -> bool {
        Jail::is_left_running(self)
    }

    fn close(&self) -> jail::Result<()> {
        Jail::close(self)
    }
}

#[async_trait::async_trait]
impl Member for Sandbox {
    fn id(&self) -> &str {
        &self.id
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn pause(&self) -> jail::Result<()> {
        Sandbox::pause(self)
    }

    fn resume(&self) -> jail::Result<()> {
        Sandbox::resume(self)
    }

    fn is_paused(&self) -> bool {
        Sandbox::is_paused(self)
    }

    fn is_solo(&self) -> bool {
        Sandbox::is_solo(self)
    }

    async fn start_repl(&self, argv: Vec<String>, env: Vec<String>, cwd: &str, source: &[u8]) -> jail::Result<ReplProcess> {
        Sandbox::start_repl(self, argv, env, cwd, source).await
    }

    async fn keep_repl_ends(&self, repl_host_pid: i32, ends: [OwnedFd; 3]) -> jail::Result<()> {
        Sandbox::keep_repl_ends(self, repl_host_pid, ends).await
    }

    fn self_join_fds(&self) -> Vec<OwnedFd> {
        Sandbox::self_join_fds(self)
    }

    fn same_family(&self, other: &dyn Member) -> bool {
        own(other).is_ok_and(|other| Sandbox::same_family(self, other))
    }

    fn record(&self) -> MemberRecord {
        Sandbox::record(self)
    }

    fn limits(&self) -> Limits {
        Sandbox::limits(self)
    }

    fn set_limits(&self, limits: &Limits) -> jail::Result<()> {
        Sandbox::set_limits(self, limits)
    }

    fn cgroup(&self) -> Option<&jail::cgroup::Cgroup> {
        Some(Sandbox::cgroup(self))
    }

    fn init_alive(&self) -> bool {
        Sandbox::init_alive(self)
    }

    async fn wait_init_gone(&self, limit: Duration) -> bool {
        Sandbox::wait_init_gone(self, limit).await
    }

    async fn rebuild(&self) -> jail::Result<()> {
        Sandbox::rebuild(self).await
    }

    fn layers(&self) -> (PathBuf, PathBuf) {
        Sandbox::layers(self)
    }

    fn export_upper(&self, dst: &Path) -> jail::Result<jail::Copied> {
        Sandbox::export_upper(self, dst)
    }

    fn fs(&self) -> jail::Result<jail::fs::SandboxFs> {
        Sandbox::fs(self)
    }

    async fn spawn_command(&self, argv: Vec<String>, env: Vec<String>, cwd: &str) -> jail::Result<jail::CommandProcess> {
        Sandbox::spawn_command(self, argv, env, cwd).await
    }

    async fn spawn_piped(&self, argv: Vec<String>, env: Vec<String>, cwd: &str, stdin: bool, run_as: jail::RunAs) -> jail::Result<jail::CommandProcess> {
        Sandbox::spawn_piped(self, argv, env, cwd, stdin, run_as).await
    }

    async fn spawn_terminal(
        &self,
        argv: Vec<String>,
        env: Vec<String>,
        cwd: &str,
        size: jail::pty::Size,
        run_as: jail::RunAs,
    ) -> jail::Result<jail::TerminalProcess> {
        Sandbox::spawn_terminal(self, argv, env, cwd, size, run_as).await
    }

    fn netns(&self) -> jail::Result<OwnedFd> {
        Sandbox::netns(self)
    }

    async fn connect_port(&self, port: u16, timeout: Duration) -> Result<(tokio::net::TcpStream, std::net::SocketAddr), jail::ports::PortError> {
        Sandbox::connect_port(self, port, timeout).await
    }

    fn set_up_network(&self, rules: &jail::net::Rules, need_pasta: bool, need_rules: bool) -> jail::Result<(Option<jail::net::Pasta>, OwnedFd)> {
        jail::egress::set_up(self, rules, need_pasta, need_rules)
    }

    fn point_resolver(&self) -> jail::Result<()> {
        jail::egress::point_resolver(self)
    }

    async fn hold_network(&self) -> jail::Result<Option<tokio::sync::oneshot::Receiver<()>>> {
        Sandbox::hold_network(self).await
    }

    async fn open_network(&self) -> jail::Result<()> {
        Sandbox::open_network(self).await
    }
}
