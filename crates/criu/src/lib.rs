//! criu for forkbox: where it comes from and how it is run
//! (docs/state.md#where-criu-comes-from).
//!
//! criu 4.2 is the first release that dumps on Linux >= 6.16. A host whose
//! own criu is that new uses it; elsewhere forkbox builds a *tools root*
//! (a Debian 13 root with sid's criu, `forkbox tools build criu`) and runs
//! criu pivoted into it: criu restores a mount namespace only when its own
//! root is its mount namespace's root (a chroot is not enough), and its
//! helpers (`ip`, `iptables-restore`) then come from the same release.
//!
//! Layout: [`version`] reads `criu --version`, [`locate`] picks the criu
//! ([`Criu`]), [`pivot`] makes the command that runs inside the tools root,
//! [`check`] asks criu whether this kernel can take a dump, [`identity`]
//! runs it as a family's host root, [`run`] runs it to its end,
//! [`userns_image`] moves a dump to another uid range.

mod check;
mod error;
mod identity;
mod locate;
mod pivot;
mod run;
mod userns_image;
mod version;

pub use check::Readiness;
pub use error::CriuError;
pub use locate::{Criu, Source};
pub use run::{run_logged, run_logged_unless, LONGEST_RUN};
pub use userns_image::rebase_userns_image;
pub use version::{Version, MINIMUM};

/// The environment variable that names the descriptor of an open
/// `/dev/userfaultfd` handed to the patched criu (tools/criu.toml): it
/// makes every userfaultfd of a lazy restore from it, and closes it in each
/// restored task before the task runs again (docs/state.md#lazy-resume).
pub const USERFAULTFD_DEV_FD_ENV: &str = "CRIU_USERFAULTFD_DEV_FD";
