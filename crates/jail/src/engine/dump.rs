//! Dumping a solo sandbox's whole process tree with criu
//! (docs/state.md, "the sandbox shape a process-keeping Space needs").
//!
//! The tree is the member's init (pid 1 of its own pid namespace) and
//! everything under it; the mounts that bind host files in are named to
//! criu as external, and the descriptors that cross the sandbox's edge
//! (init's channel to the shim, the REPL's control socket and output
//! pipes) are recorded, by inode, so a restore can hand in new ones.

use std::path::Path;

use super::*;

/// Where criu, run in its tools root, sees the images directory.
const IMAGES_INSIDE: &str = "/forkbox/images";
/// The log criu writes into the images directory.
pub const DUMP_LOG: &str = "dump.log";
/// How long a dump waits for a lazily restored tree's memory to be all in
/// (criu's daemon copies about a GiB a second).
const PAGES_IN_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// What becomes of a dumped tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterDump {
    /// It ends once the dump is complete (its memory is on disk now).
    End,
    /// It was paused (`Sandbox::pause`) and stays so: criu takes it
    /// through its freezer cgroup and leaves it there. A freeze copies the
    /// files of the paused tree, dumps it, and ends it only once the Space
    /// is written, so a crash at any point leaves the sandbox or a Space.
    StayPaused,
}

impl Jail {
    /// Dump `sandbox` (solo) into `images` with `criu`; a failed dump
    /// leaves the tree as it was.
    pub async fn dump(&self, sandbox: &Sandbox, criu: &criu::Criu, images: &Path, after: AfterDump) -> Result<Edges> {
        if !sandbox.is_solo() {
            return Err(Error::Unsupported("only a solo sandbox's processes can be dumped".into()));
        }
        if after == AfterDump::StayPaused && !sandbox.is_paused() {
            return Err(Error::Invalid("a dump that leaves the sandbox paused needs it paused first".into()));
        }
        // A lazily restored tree's pages still coming in would be missing
        // from its dump. (An older shim restores nothing lazily.)
        let shim = sandbox.shim();
        let asked = async {
            if shim.protocol() >= crate::shim::messages::PAGES_IN {
                shim.call(Request::PagesIn, &[]).await.map(|_| ())
            } else {
                Ok(())
            }
        };
        match tokio::time::timeout(PAGES_IN_WAIT, asked).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(Error::Unsupported(format!("its memory is still coming in after {} s", PAGES_IN_WAIT.as_secs()))),
        }
        let init = sandbox.init_pid()?;
        let other_users = super::tree_creds::check_settled(init, criu.restores_other_users)?;
        let edges = edges_of(init, other_users)?;
        // Init is the shim's binary, bound in where it was found.
        let init_binary = std::fs::canonicalize(&self.config.shim_exe).map_err(|e| Error::io("find the shim's binary", e))?;
        let seen = criu.seen(images, Path::new(IMAGES_INSIDE)).to_path_buf();
        let mut command = criu.command_as("dump", &[(images, Path::new(IMAGES_INSIDE))], sandbox.family.config.id_base);
        command.arg("-t").arg(init.to_string()).arg("-D").arg(&seen).args(["-o", DUMP_LOG, "--network-lock", "skip", "--ext-unix-sk", "--empty-ns", "net"]);
        if after == AfterDump::StayPaused {
            command.arg("--leave-running").arg("--freeze-cgroup").arg(sandbox.cgroup().freezer_dir());
        }
        for socket in edges.sockets() {
            command.arg("--external").arg(format!("unix[{socket}]"));
        }
        for bind in crate::shim::init::host_binds(&init_binary) {
            command.arg("--external").arg(format!("mnt[{}]:{}", bind.inside, bind.key));
        }
        // criu runs in the tree's uts namespace, so it keeps that one out
        // of the images: filling a uts namespace at restore takes writes
        // only host root may make, so a restore gives the tree one it made
        // itself, under the new sandbox's name (shim/restore.rs).
        let uts = std::fs::File::open(format!("/proc/{init}/ns/uts")).map_err(|e| Error::io("open the tree's uts namespace", e))?;
        // A server killed mid-dump leaves criu running to its end, holding
        // this lock, which the next server waits on (dump_lock.rs).
        let lock = super::dump_lock::DumpLock::take(super::dump_lock::path(&sandbox.family.config.run_dir, &sandbox.id))?;
        let lock_fd = lock.raw_fd();
        // SAFETY: setns, fcntl and pwrite between fork and exec, on
        // descriptors opened before.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
                if libc::setns(uts.as_raw_fd(), libc::CLONE_NEWUTS) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                super::dump_lock::hand_to_child(lock_fd)
            });
        }
        let log = images.join(DUMP_LOG);
        tokio::task::spawn_blocking(move || criu::run_logged(command, "dump", &log))
            .await
            .map_err(|e| Error::Thread(e.to_string()))?
            .map_err(|e| Error::Setup(e.to_string()))?;
        drop(lock);
        seal(images)?;
        Ok(edges)
    }

    /// Wait until no criu dump a previous server started still runs: until
    /// then criu owns that sandbox's freezer, and writes into a Space's
    /// partial directory (dump_lock.rs). A server calls this before it
    /// reads its predecessor's Spaces or adopts its sandboxes.
    pub async fn wait_for_dumps(&self) {
        super::dump_lock::wait_for_all(&self.config.state_dir.join("run")).await
    }
}

/// The images are the server's alone: criu wrote them as the family's
/// host root (the sandbox's root on the host), so hand them to host root,
/// readable by it only.
fn seal(images: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let own = |path: &Path, mode: u32| -> Result<()> {
        std::os::unix::fs::lchown(path, Some(0), Some(0)).map_err(|e| Error::io("give the images to root", e))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|e| Error::io("close the images", e))
    };
    for entry in std::fs::read_dir(images).map_err(|e| Error::io("read the images", e))?.flatten() {
        own(&entry.path(), 0o600)?;
    }
    own(images, 0o700)
}

/// The edge descriptors of the tree whose init is host pid `init`, and
/// whether a task of it runs as another user than its root.
fn edges_of(init: i32, other_users: bool) -> Result<Edges> {
    let link = |pid: i32, fd: i32| std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).map(|p| p.to_string_lossy().into_owned());
    let init_channel = link(init, 3).map_err(|e| Error::io("read init's channel", e))?;
    let repl = crate::shim::solo::repl_child(init).and_then(|child| Some([link(child, 1).ok()?, link(child, 2).ok()?, link(child, 3).ok()?]));
    Ok(Edges { init_channel, repl, other_users })
}
