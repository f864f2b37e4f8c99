//! Recipes shipped with forkbox, embedded from the repository's templates/ dir.

use crate::recipe::Recipe;

/// Name and TOML text of each built-in, bases before the templates derived from them.
const BUILTINS: &[(&str, &str)] =
    &[("default", include_str!("../../../templates/default.toml")), ("python-datasci", include_str!("../../../templates/python-datasci.toml"))];

const NAMES: &[&str] = &["default", "python-datasci"];

/// The built-in recipe called `name`.
pub fn builtin(name: &str) -> Option<Recipe> {
    let (_, text) = BUILTINS.iter().find(|(n, _)| *n == name)?;
    // The tests parse every built-in, so this only fails on a broken checkout.
    Some(Recipe::from_toml(text).expect("built-in recipe is valid"))
}

/// Names of all built-in recipes, in build order (a base before its derived templates).
pub fn builtin_names() -> &'static [&'static str] {
    NAMES
}

/// Roots the server runs host tools in, never a sandbox's (the repository's
/// tools/ dir): built into their own store, `<state-dir>/tools`.
const TOOLS: &[(&str, &str)] = &[("criu", include_str!("../../../tools/criu.toml"))];

/// The recipe of tools root `name`.
pub fn tool_recipe(name: &str) -> Option<Recipe> {
    let (_, text) = TOOLS.iter().find(|(n, _)| *n == name)?;
    Some(Recipe::from_toml(text).expect("built-in tools recipe is valid"))
}

/// Names of the tools roots.
pub fn tool_names() -> Vec<&'static str> {
    TOOLS.iter().map(|(name, _)| *name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_parses_and_is_named_after_its_entry() {
        assert_eq!(builtin_names().len(), BUILTINS.len());
        for (i, name) in builtin_names().iter().enumerate() {
            assert_eq!(BUILTINS[i].0, *name);
            let recipe = builtin(name).unwrap();
            assert_eq!(recipe.name, *name);
            // Build order: a base must come earlier in the list.
            if let Some(base) = &recipe.base {
                let pos = builtin_names().iter().position(|n| n == base).unwrap();
                assert!(pos < i, "{name} listed before its base {base}");
            }
        }
        assert!(builtin("nope").is_none());
    }

    #[test]
    fn tools_recipes_parse_stay_out_of_the_templates_and_pin_their_release() {
        for name in tool_names() {
            let recipe = tool_recipe(name).unwrap();
            assert_eq!(recipe.name, name);
            assert!(builtin(name).is_none(), "{name} must not be a sandbox template");
            // A tools root is made from the release its recipe names, whatever `--debian` says.
            assert_eq!(recipe.suite, "trixie");
        }
        let criu = tool_recipe("criu").unwrap();
        assert!(criu.run.iter().any(|c| c.contains("-t sid criu")));
        assert!(criu.run.iter().any(|c| c.contains("Check-Valid-Until")));
        // criu is rebuilt with the restorer patch and the root marked for it.
        assert!(criu.run.iter().any(|c| c.contains("SECURE_NO_SETUID_FIXUP") && c.contains("grep -q")));
        assert!(criu.run.iter().any(|c| c.contains("/usr/lib/forkbox/criu-restores-other-users")));
        // ... and with the lazy-pages patch, applied to the source it came from.
        assert!(criu
            .run
            .iter()
            .any(|c| c.starts_with("patch -d /tmp/criu") && c.contains("USERFAULTFD_IOC_NEW") && c.contains("close_service_fd(UFFD_DEV_OFF)")));
        assert!(criu.run.iter().any(|c| c.contains("/usr/lib/forkbox/criu-lazy-pages-from-device")));
        assert!(tool_recipe("nope").is_none());
    }

    #[test]
    fn default_matches_the_spec() {
        let r = builtin("default").unwrap();
        assert_eq!(r.base, None);
        assert_eq!(r.suite, crate::Debian::default().suite());
        assert_eq!(r.variant, "minbase");
        assert_eq!(r.mirror, "http://deb.debian.org/debian");
        for pkg in ["python3-pandas", "python3-cloudpickle", "python3-requests", "python3-httpx", "iproute2", "ca-certificates"] {
            assert!(r.apt.iter().any(|p| p == pkg), "{pkg} missing");
        }
        assert!(r.run.iter().any(|c| c.contains("EXTERNALLY-MANAGED")));
        assert!(r.run.iter().any(|c| c.contains("/etc/hostname")));

        let ds = builtin("python-datasci").unwrap();
        assert_eq!(ds.base.as_deref(), Some("default"));
        assert_eq!(ds.apt, ["python3-matplotlib", "python3-scipy", "python3-sklearn", "python3-seaborn", "python3-sympy", "python3-openpyxl", "python3-pil"]);
        assert_eq!(ds.suite, "");
    }
}
