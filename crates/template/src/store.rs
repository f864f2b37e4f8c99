//! The on-disk cache of built templates: `<root>/<name>/<key>/rootfs`.
//!
//! A version is built in `<name>/<key>.partial` and renamed into place only
//! when complete, so a crash never leaves a half template that looks done.
//! `<root>/<name>.lock` serializes builders and removers of one template.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::build::{self, Base};
use crate::builtin::builtin;
use crate::debian::Debian;
use crate::error::TemplateError;
use crate::key::{self, BUILDER_VERSION};
use crate::lock;
use crate::progress::Progress;
use crate::recipe::{is_valid_name, Recipe};
use crate::remove::remove_tree;
use crate::tools::Tools;

/// Base chains longer than this are taken to be loops.
const MAX_BASE_DEPTH: usize = 8;
/// Suffix of a version being built.
const PARTIAL: &str = ".partial";
/// Suffix of a version being deleted.
const REMOVING: &str = ".removing";
/// Written next to `rootfs`: what was built, for people and future tooling.
const METADATA: &str = "template.json";

/// One built version of a template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BuiltTemplate {
    pub name: String,
    /// The recipe key it was built for.
    pub hash: String,
    /// The complete root filesystem; use it read-only.
    pub rootfs: PathBuf,
}

/// Built templates under one directory, plus the recipes they can be built from.
#[derive(Debug, Clone)]
pub struct TemplateStore {
    root: PathBuf,
    /// Recipes known besides the built-ins; they win over a built-in of the same name.
    recipes: Vec<Recipe>,
    /// The release the built-ins are made from.
    debian: Debian,
}

#[derive(Serialize)]
struct Metadata<'a> {
    name: &'a str,
    key: &'a str,
    builder_version: u32,
    base: Option<&'a BuiltTemplate>,
    built_at_unix: u64,
    recipe: &'a Recipe,
}

impl TemplateStore {
    /// A store rooted at `root`, normally `<state-dir>/templates`. Nothing is
    /// created until the first build.
    pub fn new(root: impl Into<PathBuf>) -> TemplateStore {
        TemplateStore { root: root.into(), recipes: Vec::new(), debian: Debian::default() }
    }

    /// The same store, its built-in recipes made from `debian`. Versions
    /// built from another release stay on disk and keep working for what
    /// was made on them; they are no longer what a name resolves to.
    pub fn with_debian(mut self, debian: Debian) -> TemplateStore {
        self.debian = debian;
        self
    }

    pub fn debian(&self) -> Debian {
        self.debian
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Makes `recipe` known by name, so other recipes can use it as `base`.
    /// Replaces an earlier registration or built-in of the same name.
    pub fn register(&mut self, recipe: Recipe) -> Result<(), TemplateError> {
        recipe.validate()?;
        self.recipes.retain(|r| r.name != recipe.name);
        self.recipes.push(recipe);
        Ok(())
    }

    /// The recipe called `name`: a registered one, else a built-in (made
    /// from this store's Debian release).
    pub fn recipe(&self, name: &str) -> Option<Recipe> {
        self.recipes.iter().find(|r| r.name == name).cloned().or_else(|| builtin(name).map(|r| r.on_debian(self.debian)))
    }

    /// Content hash of `recipe`, covering its base chain and the builder version.
    pub fn key(&self, recipe: &Recipe) -> Result<String, TemplateError> {
        self.key_at(recipe, 0)
    }

    fn key_at(&self, recipe: &Recipe, depth: usize) -> Result<String, TemplateError> {
        recipe.validate()?;
        let base_key = match &recipe.base {
            None => None,
            Some(_) if depth >= MAX_BASE_DEPTH => return Err(TemplateError::BaseCycle(recipe.name.clone())),
            Some(base) => Some(self.key_at(&self.base_recipe(base)?, depth + 1)?),
        };
        Ok(key::compute(recipe, base_key.as_deref()))
    }

    fn base_recipe(&self, name: &str) -> Result<Recipe, TemplateError> {
        self.recipe(name).ok_or_else(|| TemplateError::UnknownBase(name.to_string()))
    }

    /// The built version of `recipe` for its current key, if there is one.
    pub fn lookup(&self, recipe: &Recipe) -> Result<Option<BuiltTemplate>, TemplateError> {
        let key = self.key(recipe)?;
        Ok(self.built(&recipe.name, &key))
    }

    fn built(&self, name: &str, key: &str) -> Option<BuiltTemplate> {
        let rootfs = self.root.join(name).join(key).join("rootfs");
        rootfs.is_dir().then(|| BuiltTemplate { name: name.to_string(), hash: key.to_string(), rootfs })
    }

    /// Builds `recipe` unless it is already built for its key, building its
    /// base first if needed. Needs root.
    pub fn build(&self, recipe: &Recipe, progress: &dyn Progress) -> Result<BuiltTemplate, TemplateError> {
        let key = self.key(recipe)?;
        if let Some(built) = self.built(&recipe.name, &key) {
            return Ok(built);
        }
        if !nix::unistd::geteuid().is_root() {
            return Err(TemplateError::NotRoot);
        }
        let tools = Tools::find()?;
        let base = match &recipe.base {
            Some(name) => Some(self.build(&self.base_recipe(name)?, progress)?),
            None => None,
        };

        let name = recipe.name.as_str();
        let dir = self.root.join(name);
        fs::create_dir_all(&dir).map_err(TemplateError::io(format!("creating {}", dir.display())))?;
        let _lock = lock::exclusive(&self.lock_path(name), || {
            progress.message(&format!("waiting for another build of {name}"));
        })?;
        // Someone else may have built it while we waited.
        if let Some(built) = self.built(name, &key) {
            return Ok(built);
        }
        // Holding the lock, any leftover in-progress directory is from a dead build.
        remove_leftovers(&dir)?;

        let partial = dir.join(format!("{key}{PARTIAL}"));
        fs::create_dir(&partial).map_err(TemplateError::io(format!("creating {}", partial.display())))?;
        let base = base.map(|built| BaseBuild { base: Base { lock: self.lock_path(&built.name), rootfs: built.rootfs.clone() }, built });
        let result = build::run(recipe, &tools, &partial.join("rootfs"), base.as_ref().map(|b| &b.base), progress)
            .and_then(|()| commit(recipe, &key, base.as_ref().map(|b| &b.built), &partial, &dir.join(&key)));
        if let Err(e) = result {
            // Failed builds are useless; free the space now rather than at the next build.
            if let Err(cleanup) = remove_tree(&partial) {
                tracing::warn!("{cleanup}");
            }
            return Err(e);
        }
        progress.finish(name);
        Ok(self.built(name, &key).expect("just committed"))
    }

    /// All built versions of template `name`, newest first.
    pub fn versions(&self, name: &str) -> Vec<BuiltTemplate> {
        if !is_valid_name(name) {
            return Vec::new();
        }
        let Ok(entries) = fs::read_dir(self.root.join(name)) else {
            return Vec::new();
        };
        let mut versions: Vec<(SystemTime, BuiltTemplate)> = entries
            .flatten()
            .filter_map(|entry| {
                let hash = entry.file_name().into_string().ok()?;
                // Skips .partial and .removing directories too.
                if !key::is_valid(&hash) {
                    return None;
                }
                let built = self.built(name, &hash)?;
                let modified = entry.metadata().and_then(|m| m.modified()).unwrap_or(UNIX_EPOCH);
                Some((modified, built))
            })
            .collect();
        versions.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.hash.cmp(&b.1.hash)));
        versions.into_iter().map(|(_, built)| built).collect()
    }

    /// Deletes one built version. Removing one that is already gone is not an
    /// error. Callers must make sure no sandbox still uses it.
    pub fn remove_version(&self, t: &BuiltTemplate) -> Result<(), TemplateError> {
        // Paths come from name and hash only, never from the caller's `rootfs`.
        if !is_valid_name(&t.name) || !key::is_valid(&t.hash) {
            return Err(TemplateError::Invalid(format!("no such template version {}/{}", t.name, t.hash)));
        }
        let dir = self.root.join(&t.name);
        let version = dir.join(&t.hash);
        if !version.exists() {
            return Ok(());
        }
        let _lock = lock::exclusive(&self.lock_path(&t.name), || {})?;
        // Renamed first so a crash mid-delete can't leave a damaged version that looks complete.
        let doomed = dir.join(format!("{}{REMOVING}", t.hash));
        remove_tree(&doomed)?;
        match fs::rename(&version, &doomed) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            result => result.map_err(TemplateError::io(format!("removing {}", version.display())))?,
        }
        remove_tree(&doomed)
    }

    fn lock_path(&self, name: &str) -> PathBuf {
        self.root.join(format!("{name}.lock"))
    }
}

/// The base's build paths plus what it was, for the metadata.
struct BaseBuild {
    base: Base,
    built: BuiltTemplate,
}

/// Removes `.partial` and `.removing` directories left by killed processes.
fn remove_leftovers(dir: &Path) -> Result<(), TemplateError> {
    let entries = fs::read_dir(dir).map_err(TemplateError::io(format!("reading {}", dir.display())))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.ends_with(PARTIAL) || name.ends_with(REMOVING) {
            let path = entry.path();
            tracing::info!(path = %path.display(), "removing leftover of an interrupted build");
            remove_tree(&path)?;
        }
    }
    Ok(())
}

/// Records metadata, flushes the new rootfs to disk, then renames it into place.
fn commit(recipe: &Recipe, key: &str, base: Option<&BuiltTemplate>, partial: &Path, done: &Path) -> Result<(), TemplateError> {
    let metadata = Metadata {
        name: &recipe.name,
        key,
        builder_version: BUILDER_VERSION,
        base,
        built_at_unix: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        recipe,
    };
    let json = serde_json::to_vec_pretty(&metadata).expect("metadata serializes");
    let path = partial.join(METADATA);
    fs::write(&path, json).map_err(TemplateError::io(format!("writing {}", path.display())))?;

    // The rename must not become durable before the files it publishes.
    let context = || format!("syncing {}", partial.display());
    let dir = File::open(partial).map_err(TemplateError::io(context()))?;
    nix::unistd::syncfs(&dir).map_err(|e| TemplateError::io(context())(e.into()))?;
    fs::rename(partial, done).map_err(TemplateError::io(format!("renaming {} into place", partial.display())))?;
    let parent = done.parent().expect("version dir has a parent");
    File::open(parent).and_then(|d| d.sync_all()).map_err(TemplateError::io(format!("syncing {}", parent.display())))
}
