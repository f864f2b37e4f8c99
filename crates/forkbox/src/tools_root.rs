//! The tools roots under `<state-dir>/tools` (tools/*.toml): built like
//! templates, with the same store, but never a sandbox's root.

use std::path::Path;

use anyhow::Context;

fn store(tools_dir: &Path) -> anyhow::Result<template::TemplateStore> {
    let mut store = template::TemplateStore::new(tools_dir);
    for name in template::tool_names() {
        store.register(template::tool_recipe(name).context("built-in tools recipe")?).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(store)
}

/// Builds tools root `name` unless it is built for its recipe.
pub fn build(tools_dir: &Path, name: &str) -> anyhow::Result<template::BuiltTemplate> {
    let store = store(tools_dir)?;
    let recipe = store.recipe(name).filter(|_| template::tool_recipe(name).is_some());
    let recipe = recipe.with_context(|| format!("unknown tools root `{name}` (there is: {})", template::tool_names().join(", ")))?;
    store.build(&recipe, &template::BarProgress).map_err(|e| anyhow::anyhow!("{e}"))
}

/// The criu a server with these tools roots uses, or why there is none.
pub fn criu_readiness(tools_dir: &Path) -> criu::Readiness {
    let built = store(tools_dir).ok().and_then(|store| store.lookup(&template::tool_recipe("criu")?).ok().flatten());
    let expected = built.as_ref().map_or_else(|| tools_dir.join("criu"), |b| b.rootfs.clone());
    criu::Readiness::probe(built.as_ref().map(|b| b.rootfs.as_path()), &expected)
}
