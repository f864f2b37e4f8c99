//! A solo member built from criu's images of a dumped one (docs/state.md,
//! "the sandbox shape a process-keeping Space needs").
//!
//! criu runs as this family's host root (`Criu::command_as`), so the user
//! namespace it recreates belongs to the family's range owner, from a copy
//! of the images whose user namespace maps were moved to this family's
//! range (the files are already there: the layer was shifted on copy). It
//! runs in the member's cgroup, so everything it restores lands there. The
//! descriptors that led out of the dumped tree are replaced by new ones
//! (`--inherit-fd`): init's channel, the REPL's control socket and output
//! pipes; the two sockets then move into the member's own network
//! namespace (move_edges.rs), so it can be dumped again. The network
//! namespace comes back empty, its loopback brought up here: loopback
//! connections and listening sockets are kept, nothing else of the network
//! is.

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::unistd::Pid;

use super::family::Family;
use super::member::{self, Member, MemberNs};
use super::messages::Edges;
use super::move_edges::{in_netns, move_repl_control, renew_init};
use crate::channel;
use crate::error::{Error, Result};
use crate::sys;

/// Where criu, in its tools root, sees the images, the root and init's binary.
const IMAGES_INSIDE: &str = "/forkbox/images";
const ROOT_INSIDE: &str = "/forkbox/root";
const BIN_INSIDE: &str = "/forkbox/bin";
/// The first descriptor number criu is handed new edges on.
const FIRST_INHERITED_FD: i32 = 10;
/// The log criu writes into the images directory.
pub const RESTORE_LOG: &str = "restore.log";
const PIDFILE: &str = "restored.pid";

/// What `restore` gives the shim: the member, and when a REPL was dumped,
/// its host pid and the server's new ends (control, stdout, stderr).
pub struct Restored {
    pub member: Member,
    pub repl: Option<(i32, [OwnedFd; 3])>,
    /// The pages still coming in, for a lazy restore (see `lazy`).
    pub lazy: Option<super::lazy::Transfer>,
}

/// What a restore is asked to do (`Request::RestoreMember`).
pub struct Request<'a> {
    pub name: &'a str,
    pub upper: &'a Path,
    pub work: &'a Path,
    pub cgroup_procs: &'a [PathBuf],
    pub images: &'a Path,
    pub edges: &'a Edges,
    pub criu_root: Option<&'a Path>,
    /// The family's first host uid and gid.
    pub id_base: u32,
    /// Whether the tree may run before its memory is all in (`lazy`).
    pub lazily: bool,
}

pub fn restore(family: &Family, run_dir: &Path, req: &Request<'_>) -> Result<Restored> {
    let criu = criu::Criu::find(req.criu_root, req.criu_root.unwrap_or(Path::new("/"))).map_err(|e| Error::Setup(e.to_string()))?;
    if req.edges.other_users && !criu.restores_other_users {
        // It would fail on the task, then hang (tree_creds.rs).
        return Err(Error::Setup(format!("the dump holds a task of another user than the sandbox's root, which {} cannot restore", criu.describe())));
    }
    let root = member::mount_root(family, run_dir, req.name, req.upper, req.work)?;
    let restored = restore_over(&criu, &root, req);
    if restored.is_err() {
        member::unmount_root(&root);
    }
    restored
}

fn restore_over(criu: &criu::Criu, root: &Path, req: &Request<'_>) -> Result<Restored> {
    let (init_ours, init_theirs) = channel::pair()?;
    let (control_ours, control_theirs) = std::os::unix::net::UnixStream::pair().map_err(|e| Error::io("socketpair", e))?;
    let (stdout_r, stdout_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| Error::sys("pipe", e))?;
    let (stderr_r, stderr_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| Error::sys("pipe", e))?;
    // The new edges, in the order `Edges::all` lists the old ones.
    let control_theirs = OwnedFd::from(control_theirs);
    let new_edges: Vec<&OwnedFd> = match req.edges.repl {
        Some(_) => vec![&init_theirs, &stdout_w, &stderr_w, &control_theirs],
        None => vec![&init_theirs],
    };
    let old_edges: Vec<(&str, u64)> = req.edges.all().collect();
    if old_edges.len() != new_edges.len() {
        return Err(Error::Invalid(format!("the dump's edges are incomplete: {:?}", req.edges)));
    }

    let exe = std::fs::read_link("/proc/self/exe").map_err(|e| Error::io("find own binary", e))?;
    let bin_dir = exe.parent().unwrap_or(Path::new("/")).to_path_buf();
    let exe_name = exe.file_name().map(PathBuf::from).unwrap_or_default();
    let images_dir = root.parent().unwrap_or(root).join("images");
    let lent = copy_images(req.images, &images_dir, req.id_base)?;
    let binds = [(images_dir.as_path(), Path::new(IMAGES_INSIDE)), (root, Path::new(ROOT_INSIDE)), (bin_dir.as_path(), Path::new(BIN_INSIDE))];
    let images = criu.seen(&images_dir, Path::new(IMAGES_INSIDE)).to_path_buf();
    let mut daemon = if req.lazily { super::lazy::start(criu, &binds, &images, req.id_base) } else { None };
    let mut command = criu.command_as("restore", &binds, req.id_base);
    command.arg("-D").arg(&images).args(["-o", RESTORE_LOG, "-d", "--manage-cgroups=ignore", "--empty-ns", "net", "--ext-unix-sk"]);
    command.arg("--root").arg(criu.seen(root, Path::new(ROOT_INSIDE)));
    command.arg("--pidfile").arg(images.join(PIDFILE));
    let seen_bin = criu.seen(&bin_dir, Path::new(BIN_INSIDE)).join(&exe_name);
    for bind in super::init::host_binds(&seen_bin) {
        command.arg("--external").arg(format!("mnt[{}]:{}", bind.key, bind.host.display()));
    }
    for (i, (kind, ino)) in old_edges.iter().enumerate() {
        // As /proc/<pid>/fd names it ("socket:[ino]"), which criu matches.
        command.arg("--inherit-fd").arg(format!("fd[{}]:{kind}:[{ino}]", FIRST_INHERITED_FD + i as i32));
    }
    let mut sources: Vec<i32> = new_edges.iter().map(|fd| fd.as_raw_fd()).collect();
    if let Some(daemon) = daemon.as_mut() {
        daemon.hand_to(&mut command, &mut sources, FIRST_INHERITED_FD);
    }
    let hostname = req.name.as_bytes().to_vec();
    let cgroups: Vec<CString> = req.cgroup_procs.iter().map(|p| CString::new(p.as_os_str().as_bytes()).unwrap_or_default()).collect();
    // SAFETY: the closure runs between fork and exec; it only makes system
    // calls on what was made before the fork.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
            // The tree shares criu's uts namespace (see `copy_images`):
            // one of its own, named for the new sandbox. (Filling one from
            // the images takes writes only host root may make.)
            if libc::unshare(libc::CLONE_NEWUTS) != 0 || libc::sethostname(hostname.as_ptr().cast(), hostname.len()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Everything criu restores is its child, so lands in its cgroup.
            for file in &cgroups {
                let fd = libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(fd);
            }
            sys::place_fds(&sources, FIRST_INHERITED_FD).map_err(std::io::Error::from)
        });
    }
    let ran = criu::run_logged_unless(command, "restore", &images_dir.join(RESTORE_LOG), || daemon.as_mut().and_then(|d| d.died()));
    if let Err(e) = ran {
        // Beside the images it came from, for whoever looks into why.
        let _ = std::fs::copy(images_dir.join(RESTORE_LOG), req.images.join(RESTORE_LOG));
        if let Some(daemon) = daemon.as_mut() {
            daemon.stop();
        }
        return Err(Error::Setup(e.to_string()));
    }
    drop((init_theirs, stdout_w, stderr_w, control_theirs));
    let pid_text = std::fs::read_to_string(images_dir.join(PIDFILE)).map_err(|e| Error::io("read criu's pidfile", e))?;
    let init_pid = Pid::from_raw(pid_text.trim().parse().map_err(|_| Error::Protocol(format!("criu's pidfile says {pid_text:?}")))?);
    // Restored lazily, the images are read until the daemon is done.
    let lazy = daemon.and_then(|daemon| daemon.transfer(init_pid, images_dir.clone(), Box::new(lent)));
    if lazy.is_none() {
        let _ = std::fs::remove_dir_all(&images_dir);
    }
    let ns = MemberNs::of_init(init_pid)?;
    in_netns(&ns.net, || sys::loopback_up().map_err(|e| Error::sys("bring the restored loopback up", e)))?;
    let init = renew_init(&ns.net, init_ours)?;
    let repl = match req.edges.repl {
        None => None,
        Some(_) => {
            let pid = super::solo::repl_child(init_pid.as_raw()).ok_or_else(|| Error::Died("the restored REPL is gone".into()))?;
            let control = move_repl_control(&ns.net, control_ours)?;
            Some((pid, [OwnedFd::from(control), stdout_r, stderr_r]))
        }
    };
    let member = Member { root: root.to_path_buf(), ns, init, init_pid };
    Ok(Restored { member, repl, lazy })
}

/// The images of `images` in `dir` for one restore, readable by the
/// family's host root `id_base` only (criu's restored tasks open them as
/// that uid; the Space's own stay host root's). The small ones are copied
/// (the user namespace maps move to the family's range); the memory pages,
/// most of the bytes and never edited, are lent: hard-linked and handed to
/// `id_base` until the returned guard gives them back to root.
fn copy_images(images: &Path, dir: &Path, id_base: u32) -> Result<LentImages> {
    use std::os::unix::fs::PermissionsExt;
    let give = |path: &Path, mode: u32| -> Result<()> {
        std::os::unix::fs::chown(path, Some(id_base), Some(id_base)).map_err(|e| Error::io("give the restore its images", e))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|e| Error::io("close the restore's images", e))
    };
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(|e| Error::io("create the restore's image directory", e))?;
    give(dir, 0o700)?;
    let mut lent = LentImages(Vec::new());
    for entry in std::fs::read_dir(images).map_err(|e| Error::io("read the images", e))?.flatten() {
        let name = entry.file_name();
        let name_text = name.to_string_lossy();
        if !name_text.ends_with(".img") {
            continue; // logs
        }
        let target = dir.join(&name);
        if name_text.starts_with("pages-") && std::fs::hard_link(entry.path(), &target).is_ok() {
            lent.0.push(entry.path());
        } else {
            std::fs::copy(entry.path(), &target).map_err(|e| Error::io("copy an image", e))?;
        }
        if name_text.starts_with("userns-") {
            criu::rebase_userns_image(&target, id_base).map_err(|e| Error::Setup(e.to_string()))?;
        }
        give(&target, 0o600)?;
    }
    Ok(lent)
}

/// Images lent to a restore (`copy_images`): root's again when dropped.
struct LentImages(Vec<PathBuf>);

impl Drop for LentImages {
    fn drop(&mut self) {
        for path in &self.0 {
            if let Err(e) = std::os::unix::fs::chown(path, Some(0), Some(0)) {
                tracing::error!(image = %path.display(), err = %e, "could not give a lent image back to root");
            }
        }
    }
}
