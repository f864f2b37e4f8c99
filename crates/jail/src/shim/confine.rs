//! The last steps before a sandbox process runs user code: capabilities cut
//! to the container-default set, no_new_privs, the seccomp filter, a clean
//! signal state, then execve. Runs in a freshly forked child.

use std::ffi::CString;

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, SigmaskHow, Signal};

use super::messages::RunAs;
use crate::policy::SeccompPolicy;
use crate::sys;

/// What a confined process may keep.
pub struct Confinement {
    pub seccomp: SeccompPolicy,
    pub capabilities: Vec<caps::Capability>,
    pub repl_capabilities: Vec<caps::Capability>,
    /// The REPL's extra filter: calls that could reach another member's
    /// processes go to the shim for vetting (crate::notify).
    pub repl_notify: Vec<libc::sock_filter>,
}

/// Where a REPL sends its seccomp listener before it execs (a descriptor
/// the REPL helper sets up; close-on-exec).
pub const LISTENER_SOCKET_FD: i32 = 7;

/// Which confinement a process gets.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Everything spawned through a member's init (bash, later PTYs).
    Member,
    /// The REPL: may switch its pid_for_children (see repl/repl.py).
    Repl,
}

impl Confinement {
    pub fn load() -> Result<Confinement, crate::policy::PolicyError> {
        Self::with_seccomp(crate::policy::seccomp()?)
    }

    /// The confinement around seccomp programs compiled already.
    pub fn with_seccomp(seccomp: SeccompPolicy) -> Result<Confinement, crate::policy::PolicyError> {
        Ok(Confinement {
            seccomp,
            capabilities: crate::policy::capabilities()?,
            repl_capabilities: crate::policy::repl_capabilities()?,
            repl_notify: crate::notify::repl_filter(),
        })
    }

    /// Drop privileges and exec `argv` with `env`. Only returns on failure.
    pub fn exec(&self, role: Role, argv: &[String], env: &[String]) -> String {
        match self.exec_inner(role, RunAs::ROOT, argv, env) {
            Ok(never) => match never {},
            Err(e) => e,
        }
    }

    /// [`exec`](Self::exec) a member's command as `user`: one exec where
    /// `setpriv` in front of the command cost a second one.
    pub fn exec_as(&self, user: RunAs, argv: &[String], env: &[String]) -> String {
        match self.exec_inner(Role::Member, user, argv, env) {
            Ok(never) => match never {},
            Err(e) => e,
        }
    }

    fn exec_inner(&self, role: Role, user: RunAs, argv: &[String], env: &[String]) -> Result<std::convert::Infallible, String> {
        let keep = if role == Role::Repl { &self.repl_capabilities } else { &self.capabilities };
        reset_signals();
        let argv_c: Vec<CString> = argv.iter().map(|a| CString::new(a.as_bytes())).collect::<Result<_, _>>().map_err(|_| "NUL in argv")?;
        let env_c: Vec<CString> = env.iter().map(|a| CString::new(a.as_bytes())).collect::<Result<_, _>>().map_err(|_| "NUL in env")?;
        let program = argv_c.first().ok_or("empty argv")?.clone();
        for cap in caps::all() {
            if !keep.contains(&cap) {
                caps::drop(None, caps::CapSet::Bounding, cap).map_err(|e| format!("drop {cap}: {e}"))?;
            }
        }
        caps::clear(None, caps::CapSet::Inheritable).map_err(|e| format!("clear inheritable: {e}"))?;
        caps::clear(None, caps::CapSet::Ambient).map_err(|e| format!("clear ambient: {e}"))?;
        // After the bounding set (dropping from it needs CAP_SETPCAP) and
        // before the filter. Leaving uid 0 for another clears the permitted
        // and effective sets; real, effective and saved ids all change, so
        // nothing can switch back.
        if user != RunAs::ROOT {
            nix::unistd::setresgid(user.gid.into(), user.gid.into(), user.gid.into()).map_err(|e| format!("setresgid {}: {e}", user.gid))?;
            nix::unistd::setresuid(user.uid.into(), user.uid.into(), user.uid.into()).map_err(|e| format!("setresuid {}: {e}", user.uid))?;
        }
        sys::set_no_new_privs().map_err(|e| format!("no_new_privs: {e}"))?;
        match role {
            Role::Member => crate::policy::install(&self.seccomp),
            Role::Repl => crate::policy::install_repl(&self.seccomp),
        }
        .map_err(|e| format!("seccomp: {e}"))?;
        if role == Role::Repl {
            // The shim vets this REPL's (and its forks') signals from here on.
            let listener = crate::notify::install_with_listener(&self.repl_notify).map_err(|e| format!("seccomp listener: {e}"))?;
            // SAFETY: the helper put the shim's socket on this descriptor.
            let sock = unsafe { std::os::fd::BorrowedFd::borrow_raw(LISTENER_SOCKET_FD) };
            crate::channel::send(sock, &"listener", &[std::os::fd::AsRawFd::as_raw_fd(&listener)])
                .map_err(|e| format!("hand over the seccomp listener: {e}"))?;
        }
        let err = nix::unistd::execvpe(&program, &argv_c, &env_c).unwrap_err();
        Err(format!("exec {}: {err}", argv[0]))
    }
}

/// Default dispositions and an empty mask: both survive execve otherwise
/// (Rust ignores SIGPIPE, init blocks SIGCHLD).
pub fn reset_signals() {
    let dfl = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    for sig in Signal::iterator() {
        if sig != Signal::SIGKILL && sig != Signal::SIGSTOP {
            // SAFETY: installing SIG_DFL is always sound.
            let _ = unsafe { sigaction(sig, &dfl) };
        }
    }
    let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
}
