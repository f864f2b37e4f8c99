//! Custom templates by name: what each is made of, who owns it, and the
//! defaults it gives its sandboxes. One JSON file per template under
//! `<templates-dir>/.user/templates/`, replaced in one rename.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use protocol::{TemplateLimits, TemplateRecipe, Unsaved};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UserTemplate {
    pub name: String,
    /// The API key that made it (`None` on a server without keys).
    pub owner: Option<String>,
    /// `recipe` or `saved`.
    pub kind: String,
    pub description: String,
    /// The template it was made on.
    pub base: String,
    /// Its top layer (`None`: a recipe that changed no files, on a built-in).
    pub top: Option<String>,
    /// The built-in root filesystem at the bottom of its stack.
    pub base_rootfs: PathBuf,
    /// The top layer of `base` when it was made: layers above it are this
    /// template's own (their bytes are its size).
    pub base_top: Option<String>,
    pub preimport: Vec<String>,
    pub limits: TemplateLimits,
    pub recipe: Option<TemplateRecipe>,
    pub saved_from: Option<String>,
    pub unsaved: Vec<Unsaved>,
    pub created_at: u64,
}

pub struct UserTemplates {
    dir: PathBuf,
    by_name: HashMap<String, UserTemplate>,
}

impl UserTemplates {
    pub fn load(dir: PathBuf) -> UserTemplates {
        let mut by_name = HashMap::new();
        if let Ok(entries) = fs::read_dir(&dir) {
            for e in entries.flatten() {
                let path = e.path();
                if path.extension().is_some_and(|x| x == "json") {
                    match fs::read(&path).map_err(|e| e.to_string()).and_then(|b| serde_json::from_slice::<UserTemplate>(&b).map_err(|e| e.to_string())) {
                        Ok(t) => {
                            by_name.insert(t.name.clone(), t);
                        }
                        Err(err) => tracing::warn!(file = %path.display(), err = %err, "skipping an unreadable template record"),
                    }
                }
            }
        }
        UserTemplates { dir, by_name }
    }

    pub fn get(&self, name: &str) -> Option<&UserTemplate> {
        self.by_name.get(name)
    }

    pub fn all(&self) -> impl Iterator<Item = &UserTemplate> {
        self.by_name.values()
    }

    /// Register (or replace) a template, on disk first.
    pub fn put(&mut self, t: UserTemplate) -> io::Result<()> {
        fs::create_dir_all(&self.dir)?;
        let path = self.path(&t.name);
        let tmp = path.with_extension("json.tmp");
        fs::write(&tmp, serde_json::to_vec_pretty(&t)?)?;
        fs::File::open(&tmp)?.sync_all()?;
        fs::rename(&tmp, &path)?;
        self.by_name.insert(t.name.clone(), t);
        Ok(())
    }

    pub fn remove(&mut self, name: &str) -> io::Result<Option<UserTemplate>> {
        match fs::remove_file(self.path(name)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(self.by_name.remove(name))
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.json"))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Remember the last layer the latest build of `name` got to (it
    /// may have failed after it): the build cache keeps that chain, so
    /// fixing the failed step rebuilds from there.
    pub fn set_build_cache(&self, name: &str, top: &str) -> io::Result<()> {
        let dir = self.cache_dir();
        fs::create_dir_all(&dir)?;
        fs::write(dir.join(name), top)
    }

    pub fn forget_build_cache(&self, name: &str) {
        let _ = fs::remove_file(self.cache_dir().join(name));
    }

    /// The top layer of each name's latest build.
    pub fn build_cache_tops(&self) -> Vec<String> {
        let Ok(dir) = fs::read_dir(self.cache_dir()) else { return Vec::new() };
        dir.filter_map(|e| fs::read_to_string(e.ok()?.path()).ok()).map(|s| s.trim().to_string()).collect()
    }

    fn cache_dir(&self) -> PathBuf {
        self.dir.with_file_name("build-cache")
    }
}
