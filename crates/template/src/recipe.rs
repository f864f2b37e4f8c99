//! Template recipes: parsing, validation and the canonical form that is hashed.

use serde::{Deserialize, Serialize};

use crate::error::TemplateError;

/// Debian 13; `debian::Debian::default()` names the same release.
pub const DEFAULT_SUITE: &str = "trixie";
pub const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";
pub const DEFAULT_VARIANT: &str = "minbase";

/// Variants we accept; "default" means debootstrap's own default (no `--variant`).
const VARIANTS: &[&str] = &["minbase", "buildd", "default"];

/// Names become directory names, so keep them short and boring.
const MAX_NAME_LEN: usize = 64;

/// How to build one template. A recipe either starts from scratch with
/// debootstrap (`base` is `None`) or derives from another template, in which
/// case `suite`, `mirror` and `variant` come from the base and are empty here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Recipe {
    pub name: String,
    pub description: String,
    pub base: Option<String>,
    pub suite: String,
    pub mirror: String,
    pub variant: String,
    /// Debian packages to install.
    pub apt: Vec<String>,
    /// Shell commands run in the rootfs as root, in order.
    pub run: Vec<String>,
}

/// The TOML file as written; optional fields get their defaults in `from_toml`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RecipeFile {
    name: String,
    #[serde(default)]
    description: String,
    base: Option<String>,
    suite: Option<String>,
    mirror: Option<String>,
    variant: Option<String>,
    #[serde(default)]
    apt: Vec<String>,
    #[serde(default)]
    run: Vec<String>,
}

/// What the key hashes. A struct (not a JSON map) so the byte layout can't
/// change with serde_json features.
#[derive(Serialize)]
struct Canonical<'a> {
    name: &'a str,
    description: &'a str,
    base: Option<&'a str>,
    suite: &'a str,
    mirror: &'a str,
    variant: &'a str,
    apt: Vec<&'a str>,
    run: &'a [String],
}

impl Recipe {
    /// Parses and validates a recipe file.
    pub fn from_toml(text: &str) -> Result<Recipe, TemplateError> {
        let file: RecipeFile = toml::from_str(text)?;
        let derived = file.base.is_some();
        let inherited = |field: &str, value: Option<String>, default: &str| {
            match (derived, value) {
                // Silently ignoring these would build something other than asked.
                (true, Some(_)) => Err(TemplateError::Invalid(format!("template {:?}: `{field}` comes from the base template and cannot be set", file.name))),
                (true, None) => Ok(String::new()),
                (false, value) => Ok(value.unwrap_or_else(|| default.to_string())),
            }
        };
        let recipe = Recipe {
            suite: inherited("suite", file.suite.clone(), DEFAULT_SUITE)?,
            mirror: inherited("mirror", file.mirror.clone(), DEFAULT_MIRROR)?,
            variant: inherited("variant", file.variant.clone(), DEFAULT_VARIANT)?,
            name: file.name,
            description: file.description,
            base: file.base,
            apt: file.apt,
            run: file.run,
        };
        recipe.validate()?;
        Ok(recipe)
    }

    /// Checks everything that ends up in paths, command lines or shell scripts.
    pub fn validate(&self) -> Result<(), TemplateError> {
        let invalid = |reason: String| Err(TemplateError::Invalid(reason));
        if self.name.is_empty() {
            return invalid("name is empty".into());
        }
        if !is_valid_name(&self.name) {
            return invalid(format!("name {:?} must be at most {MAX_NAME_LEN} lower-case letters, digits, '-' or '_'", self.name));
        }
        let name = &self.name;
        match &self.base {
            Some(base) if !is_valid_name(base) => {
                return invalid(format!("template {name:?}: base {base:?} is not a valid template name"));
            }
            Some(base) if base == name => {
                return invalid(format!("template {name:?} cannot be its own base"));
            }
            Some(_) => {}
            None => self.validate_bootstrap()?,
        }
        let mut seen = std::collections::HashSet::new();
        for package in &self.apt {
            if !is_valid_package(package) {
                return invalid(format!("template {name:?}: {package:?} is not a valid Debian package name"));
            }
            if !seen.insert(package) {
                return invalid(format!("template {name:?}: apt package {package:?} is listed twice"));
            }
        }
        for command in &self.run {
            if command.trim().is_empty() {
                return invalid(format!("template {name:?}: a run command is empty"));
            }
            if command.contains('\0') {
                return invalid(format!("template {name:?}: a run command contains a NUL byte"));
            }
        }
        Ok(())
    }

    fn validate_bootstrap(&self) -> Result<(), TemplateError> {
        let name = &self.name;
        let suite_ok =
            !self.suite.is_empty() && self.suite.bytes().all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.')) && !self.suite.starts_with(['-', '.']);
        if !suite_ok {
            return Err(TemplateError::Invalid(format!("template {name:?}: suite {:?} is not a valid Debian suite name", self.suite)));
        }
        let mirror_ok =
            ["http://", "https://", "file:///"].iter().any(|p| self.mirror.starts_with(p)) && !self.mirror.chars().any(|c| c.is_whitespace() || c.is_control());
        if !mirror_ok {
            return Err(TemplateError::Invalid(format!("template {name:?}: mirror {:?} must be an http://, https:// or file:/// URL", self.mirror)));
        }
        if !VARIANTS.contains(&self.variant.as_str()) {
            return Err(TemplateError::Invalid(format!("template {name:?}: variant {:?} must be one of {}", self.variant, VARIANTS.join(", "))));
        }
        Ok(())
    }

    /// Stable text of everything that affects the built rootfs. Package order
    /// doesn't matter to apt, so it is sorted; run order does, so it isn't.
    /// Derived recipes inherit suite/mirror/variant through the base's key.
    pub(crate) fn canonical(&self) -> String {
        let (suite, mirror, variant) = match self.base {
            Some(_) => ("", "", ""),
            None => (self.suite.as_str(), self.mirror.as_str(), self.variant.as_str()),
        };
        let mut apt: Vec<&str> = self.apt.iter().map(String::as_str).collect();
        apt.sort_unstable();
        let canonical = Canonical { name: &self.name, description: &self.description, base: self.base.as_deref(), suite, mirror, variant, apt, run: &self.run };
        serde_json::to_string(&canonical).expect("serializing plain strings cannot fail")
    }
}

/// Template names: `[a-z0-9][a-z0-9_-]*`, no dots so `<name>.lock` can't clash
/// with another template's directory.
pub fn is_valid_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_NAME_LEN
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes.iter().all(|&b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_'))
}

/// Debian policy package names; also keeps option-looking strings off command lines.
pub fn is_valid_package(name: &str) -> bool {
    let bytes = name.as_bytes();
    bytes.len() >= 2
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes.iter().all(|&b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'+' | b'-' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid(text: &str) -> String {
        match Recipe::from_toml(text) {
            Err(e @ (TemplateError::Invalid(_) | TemplateError::Parse(_))) => e.to_string(),
            other => panic!("expected a recipe error for {text:?}, got {other:?}"),
        }
    }

    #[test]
    fn parses_all_fields() {
        let r = Recipe::from_toml(
            r#"
            name = "web"
            description = "a web box"
            suite = "trixie"
            mirror = "https://mirror.example/debian"
            variant = "buildd"
            apt = ["nginx", "libc6-dev", "g++"]
            run = ["echo hi > /etc/motd", "true"]
            "#,
        )
        .unwrap();
        assert_eq!(
            r,
            Recipe {
                name: "web".into(),
                description: "a web box".into(),
                base: None,
                suite: "trixie".into(),
                mirror: "https://mirror.example/debian".into(),
                variant: "buildd".into(),
                apt: vec!["nginx".into(), "libc6-dev".into(), "g++".into()],
                run: vec!["echo hi > /etc/motd".into(), "true".into()],
            }
        );
    }

    #[test]
    fn fills_defaults() {
        let r = Recipe::from_toml("name = \"x\"").unwrap();
        assert_eq!((r.suite.as_str(), r.mirror.as_str(), r.variant.as_str()), (DEFAULT_SUITE, DEFAULT_MIRROR, DEFAULT_VARIANT));
        assert_eq!((r.description.as_str(), r.base.as_deref()), ("", None));
        assert!(r.apt.is_empty() && r.run.is_empty());
    }

    #[test]
    fn derived_recipes_inherit_the_bootstrap_fields() {
        let r = Recipe::from_toml("name = \"d\"\nbase = \"default\"\napt = [\"jq\"]").unwrap();
        assert_eq!(r.base.as_deref(), Some("default"));
        assert_eq!((r.suite.as_str(), r.mirror.as_str(), r.variant.as_str()), ("", "", ""));
        let err = invalid("name = \"d\"\nbase = \"default\"\nsuite = \"trixie\"");
        assert!(err.contains("`suite` comes from the base"), "{err}");
    }

    #[test]
    fn rejects_unknown_fields() {
        let err = invalid("name = \"x\"\npackages = [\"jq\"]");
        assert!(err.contains("unknown field `packages`"), "{err}");
    }

    #[test]
    fn rejects_empty_and_bad_names() {
        assert_eq!(invalid("name = \"\""), "invalid recipe: name is empty");
        assert!(invalid("apt = []").contains("missing field `name`"));
        for bad in ["Default", "a.b", "a/b", "-x", "ü", &"n".repeat(65)] {
            assert!(invalid(&format!("name = {bad:?}")).contains("must be at most 64"), "{bad}");
        }
        assert!(Recipe::from_toml(&format!("name = {:?}", "n".repeat(64))).is_ok());
    }

    #[test]
    fn rejects_bad_fields() {
        let cases = [
            ("name = \"x\"\nbase = \"x\"", "cannot be its own base"),
            ("name = \"x\"\nbase = \"../etc\"", "is not a valid template name"),
            ("name = \"x\"\nsuite = \"\"", "suite \"\" is not a valid"),
            ("name = \"x\"\nsuite = \"--foo\"", "is not a valid Debian suite"),
            ("name = \"x\"\nmirror = \"ftp://x\"", "must be an http://"),
            ("name = \"x\"\nmirror = \"http://a b\"", "must be an http://"),
            ("name = \"x\"\nvariant = \"fat\"", "variant \"fat\" must be one of"),
            ("name = \"x\"\napt = [\"--force-yes\"]", "not a valid Debian package name"),
            ("name = \"x\"\napt = [\"jq; rm -rf /\"]", "not a valid Debian package name"),
            ("name = \"x\"\napt = [\"jq\", \"jq\"]", "listed twice"),
            ("name = \"x\"\nrun = [\"  \"]", "a run command is empty"),
            ("name = \"x\"\nrun = [\"a\\u0000b\"]", "NUL"),
            ("name = \"x\"\napt = \"jq\"", "invalid type"),
        ];
        for (text, expected) in cases {
            let err = invalid(text);
            assert!(err.contains(expected), "{text:?}: {err}");
        }
    }

    #[test]
    fn canonical_ignores_package_order_but_not_run_order() {
        let a = Recipe::from_toml("name = \"x\"\napt = [\"a1\", \"b1\"]\nrun = [\"1\", \"2\"]").unwrap();
        let b = Recipe::from_toml("name = \"x\"\napt = [\"b1\", \"a1\"]\nrun = [\"1\", \"2\"]").unwrap();
        let c = Recipe::from_toml("name = \"x\"\napt = [\"a1\", \"b1\"]\nrun = [\"2\", \"1\"]").unwrap();
        assert_eq!(a.canonical(), b.canonical());
        assert_ne!(a.canonical(), c.canonical());
    }
}
