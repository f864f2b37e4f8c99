//! The TOML recipe file of `forkbox template build PATH`: the fields of
//! `protocol::TemplateRecipe`, except that each `[[files]]` entry names a
//! local `src` file (relative to the recipe's directory) whose content the
//! CLI reads and sends base64-encoded.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use base64::Engine;
use protocol::{Egress, TemplateFile, TemplateLimits, TemplateRecipe};
use serde::{Deserialize, Serialize};

/// Most bytes of file content one recipe may carry: base64 makes it 4/3
/// larger, which still fits the 96 MiB body limit of `POST /v1/templates`.
pub const MAX_FILES_BYTES: u64 = 64 << 20;

/// The file as written. Mirrors `TemplateRecipe` field for field (a test
/// keeps them in step) so that errors carry TOML line numbers.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RecipeFile {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    base: Option<String>,
    #[serde(default)]
    apt: Vec<String>,
    #[serde(default)]
    pip: Vec<String>,
    #[serde(default)]
    files: Vec<FileEntry>,
    #[serde(default)]
    commands: Vec<String>,
    #[serde(default)]
    preimport: Vec<String>,
    #[serde(default)]
    limits: TemplateLimits,
    #[serde(default)]
    egress: Option<Egress>,
}

/// One `[[files]]` table.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct FileEntry {
    /// Local file; relative paths start at the recipe's directory.
    src: PathBuf,
    /// Absolute path in the template.
    path: String,
    #[serde(default)]
    mode: Option<u32>,
}

/// Reads the recipe at `path` and the files it names.
pub fn load(path: &Path) -> anyhow::Result<TemplateRecipe> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read recipe {}", path.display()))?;
    let dir = path.parent().unwrap_or(Path::new(""));
    parse(&text, dir).with_context(|| format!("recipe {}", path.display()))
}

/// Parses recipe `text`, reading relative `src` files from `dir`.
pub fn parse(text: &str, dir: &Path) -> anyhow::Result<TemplateRecipe> {
    let file: RecipeFile = toml::from_str(text)?;
    let mut total = 0u64;
    let mut files = Vec::with_capacity(file.files.len());
    for entry in file.files {
        let src = dir.join(&entry.src);
        if !entry.path.starts_with('/') {
            bail!("[[files]] {}: path `{}` must be absolute", entry.src.display(), entry.path);
        }
        if entry.mode.is_some_and(|m| m > 0o7777) {
            bail!("[[files]] {}: mode {:#o} is not permission bits (at most 0o7777)", entry.src.display(), entry.mode.unwrap_or(0));
        }
        // Checked before reading, so a huge file fails fast.
        let len = std::fs::metadata(&src).with_context(|| format!("[[files]] src {}", src.display()))?.len();
        total += len;
        if total > MAX_FILES_BYTES {
            bail!("[[files]]: the files add up to more than {} MiB (at {}); a recipe carries at most that much", MAX_FILES_BYTES >> 20, src.display());
        }
        let content = std::fs::read(&src).with_context(|| format!("[[files]] src {}", src.display()))?;
        files.push(TemplateFile { path: entry.path, content_b64: base64::engine::general_purpose::STANDARD.encode(content), mode: entry.mode });
    }
    Ok(TemplateRecipe {
        name: file.name,
        description: file.description,
        base: file.base,
        apt: file.apt,
        pip: file.pip,
        files,
        commands: file.commands,
        preimport: file.preimport,
        limits: file.limits,
        egress: file.egress,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::EgressAllow;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    fn err(text: &str, dir: &Path) -> String {
        format!("{:#}", parse(text, dir).expect_err("must fail"))
    }

    #[test]
    fn full_recipe() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("start.sh"), "#!/bin/sh\necho hi\n").unwrap();
        std::fs::write(dir.path().join("conf.ini"), "[x]\n").unwrap();
        let text = r#"
            name = "ml"
            description = "pandas and a script"
            base = "python-datasci"
            apt = ["jq", "curl"]
            pip = ["pandas==2.2.2", "rich"]
            commands = ["echo one", "echo two"]
            preimport = ["pandas"]
            egress = true

            [limits]
            ram_mib = 2048
            rootfs_gb = 8
            timeout_seconds = 7200
            idle_timeout_seconds = 600

            [[files]]
            src = "start.sh"
            path = "/usr/local/bin/start"
            mode = 0o755

            [[files]]
            src = "conf.ini"
            path = "/etc/app/conf.ini"
        "#;
        let r = parse(text, dir.path()).unwrap();
        assert_eq!(
            r,
            TemplateRecipe {
                name: "ml".into(),
                description: "pandas and a script".into(),
                base: Some("python-datasci".into()),
                apt: vec!["jq".into(), "curl".into()],
                pip: vec!["pandas==2.2.2".into(), "rich".into()],
                files: vec![
                    TemplateFile { path: "/usr/local/bin/start".into(), content_b64: b64("#!/bin/sh\necho hi\n"), mode: Some(0o755) },
                    TemplateFile { path: "/etc/app/conf.ini".into(), content_b64: b64("[x]\n"), mode: None },
                ],
                commands: vec!["echo one".into(), "echo two".into()],
                preimport: vec!["pandas".into()],
                limits: TemplateLimits { ram_mib: Some(2048), rootfs_gb: Some(8), timeout_seconds: Some(7200), idle_timeout_seconds: Some(600) },
                egress: Some(Egress::On(true)),
            }
        );
    }

    #[test]
    fn minimal_recipe_takes_defaults() {
        let r = parse("name = \"tiny\"", Path::new("/nonexistent")).unwrap();
        assert_eq!(r, TemplateRecipe { name: "tiny".into(), ..Default::default() });
    }

    #[test]
    fn src_is_relative_to_the_recipe_and_may_be_absolute() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("recipes/assets")).unwrap();
        std::fs::write(dir.path().join("recipes/assets/a.txt"), "A").unwrap();
        let elsewhere = dir.path().join("b.txt");
        std::fs::write(&elsewhere, "B").unwrap();
        let recipe = dir.path().join("recipes/r.toml");
        let text = format!("name = \"r\"\n[[files]]\nsrc = \"assets/a.txt\"\npath = \"/a\"\n[[files]]\nsrc = \"{}\"\npath = \"/b\"\n", elsewhere.display());
        std::fs::write(&recipe, text).unwrap();
        let r = load(&recipe).unwrap();
        assert_eq!(r.files.iter().map(|f| f.content_b64.as_str()).collect::<Vec<_>>(), [b64("A"), b64("B")]);
    }

    #[test]
    fn missing_src_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let e = err("name = \"r\"\n[[files]]\nsrc = \"nope.txt\"\npath = \"/nope\"\n", dir.path());
        assert!(e.contains(&dir.path().join("nope.txt").display().to_string()), "{e}");
        assert!(e.contains("No such file"), "{e}");
    }

    #[test]
    fn unknown_fields_are_errors() {
        let e = err("name = \"r\"\nrun = [\"x\"]\n", Path::new("."));
        assert!(e.contains("unknown field `run`"), "{e}");
        assert!(e.contains("line 2"), "{e}");
        let e = err("name = \"r\"\n[limits]\nram = 1\n", Path::new("."));
        assert!(e.contains("unknown field `ram`"), "{e}");
        // The wire field is no file field: content comes from src.
        let e = err("name = \"r\"\n[[files]]\npath = \"/a\"\ncontent_b64 = \"QQ==\"\n", Path::new("."));
        assert!(e.contains("unknown field `content_b64`"), "{e}");
    }

    #[test]
    fn egress_forms() {
        let egress = |line: &str| parse(&format!("name = \"r\"\n{line}\n"), Path::new(".")).unwrap().egress;
        assert_eq!(egress(""), None);
        assert_eq!(egress("egress = false"), Some(Egress::On(false)));
        assert_eq!(egress("egress = true"), Some(Egress::On(true)));
        assert_eq!(
            egress("egress = { allow = [\"pypi.org\", \"*.pythonhosted.org\"] }"),
            Some(Egress::Allow(EgressAllow { allow: vec!["pypi.org".into(), "*.pythonhosted.org".into()] }))
        );
        assert_eq!(egress("[egress]\nallow = []"), Some(Egress::Allow(EgressAllow { allow: vec![] })));
        assert!(parse("name = \"r\"\negress = \"yes\"\n", Path::new(".")).is_err());
    }

    #[test]
    fn limits() {
        let r = parse("name = \"r\"\n[limits]\nram_mib = 512\n", Path::new(".")).unwrap();
        assert_eq!(r.limits, TemplateLimits { ram_mib: Some(512), ..Default::default() });
        let r = parse("name = \"r\"\nlimits = { rootfs_gb = 4, idle_timeout_seconds = 60 }\n", Path::new(".")).unwrap();
        assert_eq!(r.limits, TemplateLimits { rootfs_gb: Some(4), idle_timeout_seconds: Some(60), ..Default::default() });
        assert!(parse("name = \"r\"\n[limits]\nram_mib = -1\n", Path::new(".")).is_err());
    }

    #[test]
    fn file_paths_and_modes_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), "A").unwrap();
        let e = err("name = \"r\"\n[[files]]\nsrc = \"a\"\npath = \"etc/a\"\n", dir.path());
        assert!(e.contains("must be absolute"), "{e}");
        let e = err("name = \"r\"\n[[files]]\nsrc = \"a\"\npath = \"/a\"\nmode = 0o17777\n", dir.path());
        assert!(e.contains("0o17777"), "{e}");
    }

    #[test]
    fn files_are_capped_in_all() {
        let dir = tempfile::tempdir().unwrap();
        // Sparse: the cap is checked before any byte is read.
        let half = std::fs::File::create(dir.path().join("half")).unwrap();
        half.set_len(MAX_FILES_BYTES / 2 + 1).unwrap();
        let text = "name = \"r\"\n[[files]]\nsrc = \"half\"\npath = \"/1\"\n[[files]]\nsrc = \"half\"\npath = \"/2\"\n";
        let e = err(text, dir.path());
        assert!(e.contains("more than 64 MiB"), "{e}");
    }

    /// The file's fields are the wire recipe's, so a field added to
    /// `TemplateRecipe` can't be forgotten here.
    #[test]
    fn mirrors_template_recipe() {
        let keys = |v: serde_json::Value| {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        assert_eq!(keys(serde_json::to_value(RecipeFile::default()).unwrap()), keys(serde_json::to_value(TemplateRecipe::default()).unwrap()));
    }
}
