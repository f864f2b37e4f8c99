//! Builds and caches forkbox templates: Debian root filesystems, made with
//! debootstrap plus apt packages and shell fixups, that sandboxes use
//! read-only as the lower layer of their overlay.
//!
//! Recipes are TOML (see `templates/default.toml` for the field reference);
//! the ones in the repository's `templates/` directory are built in. Each
//! recipe has a content key, and a [`TemplateStore`] keeps one directory per
//! built key, so unchanged recipes are never rebuilt.

mod apt;
mod build;
mod builtin;
mod chroot;
mod debian;
mod debootstrap;
mod error;
mod exec;
mod key;
mod lock;
mod progress;
mod recipe;
mod remove;
mod steps;
mod store;
mod tools;

pub use builtin::{builtin, builtin_names, tool_names, tool_recipe};
pub use debian::Debian;
pub use error::TemplateError;
pub use key::BUILDER_VERSION;
pub use progress::{BarProgress, NoProgress, Progress, RecordedProgress};
pub use recipe::{is_valid_name, is_valid_package, Recipe, DEFAULT_MIRROR, DEFAULT_SUITE, DEFAULT_VARIANT};
pub use store::{BuiltTemplate, TemplateStore};
pub use tools::check_tools;
