//! Making and removing custom templates (docs/templates.md): from a recipe
//! (build.rs), from a running sandbox (save.rs), and deleting one
//! (manage.rs). Which templates exist and where their files are is
//! templates/'s.

pub mod build;
pub mod manage;
pub mod save;
