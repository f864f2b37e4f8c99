//! The tools roots under `<state-dir>/tools` (tools/*.toml): built like
//! templates, with the same store, but never a sandbox's root.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// Where tools roots are unless `--tools-dir` says otherwise.
pub fn default_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("tools")
}

/// Builds tools root `name` unless it is built for its recipe.
pub fn build(tools_dir: &Path, name: &str) -> anyhow::Result<template::BuiltTemplate> {
    let recipe = template::tool_recipe(name).with_context(|| format!("unknown tools root `{name}` (there is: {})", template::tool_names().join(", ")))?;
    template::TemplateStore::new(tools_dir).build(&recipe, &template::BarProgress).map_err(|e| anyhow::anyhow!("{e}"))
}

/// The criu a server with these tools roots uses, or why there is none.
pub fn criu_readiness(tools_dir: &Path) -> criu::Readiness {
    let built = template::tool_recipe("criu").and_then(|recipe| template::TemplateStore::new(tools_dir).lookup(&recipe).ok().flatten());
    criu::Readiness::probe(built.as_ref().map(|b| b.rootfs.as_path()), &tools_dir.join("criu"))
}
