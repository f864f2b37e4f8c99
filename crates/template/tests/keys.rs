//! Template keys: stable, and sensitive to everything that shapes the rootfs.

use forkbox_template::{builtin, Recipe, TemplateError, TemplateStore};

fn recipe(text: &str) -> Recipe {
    Recipe::from_toml(text).unwrap()
}

fn store() -> TemplateStore {
    TemplateStore::new("/nonexistent/forkbox-templates")
}

const ROOT: &str = r#"
name = "k"
description = "d"
suite = "bookworm"
mirror = "http://deb.debian.org/debian"
variant = "minbase"
apt = ["jq", "curl"]
run = ["echo one", "echo two"]
"#;

#[test]
fn key_is_stable_short_hex() {
    let store = store();
    let key = store.key(&recipe(ROOT)).unwrap();
    assert_eq!(key, store.key(&recipe(ROOT)).unwrap());
    assert_eq!(key, TemplateStore::new("/elsewhere").key(&recipe(ROOT)).unwrap(), "key depends on the root dir");
    assert_eq!(key.len(), 16);
    assert!(key.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    // Pinned: a change here means every deployed template gets rebuilt, so
    // it should come with a BUILDER_VERSION bump, not by accident.
    assert_eq!(key, "42bd16b3f2d65a5f");
}

#[test]
fn key_changes_with_every_field() {
    let store = store();
    let base = store.key(&recipe(ROOT)).unwrap();
    let edits = [
        ("name = \"k\"", "name = \"k2\""),
        ("description = \"d\"", "description = \"e\""),
        ("suite = \"bookworm\"", "suite = \"trixie\""),
        ("debian.org/debian", "debian.org/debian2"),
        ("variant = \"minbase\"", "variant = \"buildd\""),
        ("[\"jq\", \"curl\"]", "[\"jq\"]"),
        ("[\"echo one\", \"echo two\"]", "[\"echo one\"]"),
        ("[\"echo one\", \"echo two\"]", "[\"echo two\", \"echo one\"]"),
        ("[\"echo one\", \"echo two\"]", "[\"echo one\", \"echo two \"]"),
    ];
    let mut seen = std::collections::HashSet::from([base.clone()]);
    for (from, to) in edits {
        let edited = ROOT.replace(from, to);
        assert_ne!(edited, ROOT, "edit {from:?} didn't apply");
        let key = store.key(&recipe(&edited)).unwrap();
        assert!(seen.insert(key), "key unchanged by {from:?} -> {to:?}");
    }
    // Package order is irrelevant to apt, so it is irrelevant to the key.
    let reordered = ROOT.replace("[\"jq\", \"curl\"]", "[\"curl\", \"jq\"]");
    assert_eq!(store.key(&recipe(&reordered)).unwrap(), base);
}

#[test]
fn key_follows_the_base() {
    let mut store = store();
    let derived = recipe("name = \"child\"\nbase = \"parent\"\nrun = [\"true\"]");
    match store.key(&derived) {
        Err(TemplateError::UnknownBase(name)) => assert_eq!(name, "parent"),
        other => panic!("expected unknown base, got {other:?}"),
    }
    store.register(recipe("name = \"parent\"\napt = [\"jq\"]")).unwrap();
    let first = store.key(&derived).unwrap();
    assert_eq!(first, store.key(&derived).unwrap());
    store.register(recipe("name = \"parent\"\napt = [\"jq\", \"curl\"]")).unwrap();
    let second = store.key(&derived).unwrap();
    assert_ne!(first, second, "a changed base must change the derived key");

    // Two levels down, too.
    store.register(derived.clone()).unwrap();
    let grandchild = recipe("name = \"grandchild\"\nbase = \"child\"");
    let before = store.key(&grandchild).unwrap();
    store.register(recipe("name = \"parent\"\napt = [\"curl\"]")).unwrap();
    assert_ne!(before, store.key(&grandchild).unwrap());
}

#[test]
fn base_cycles_are_reported() {
    let mut store = store();
    store.register(recipe("name = \"a\"\nbase = \"b\"")).unwrap();
    store.register(recipe("name = \"b\"\nbase = \"a\"")).unwrap();
    let err = store.key(&store.recipe("a").unwrap()).unwrap_err();
    assert!(matches!(err, TemplateError::BaseCycle(_)), "{err}");
}

#[test]
fn builtins_key_and_registered_recipes_shadow_them() {
    let mut store = store();
    let default = builtin("default").unwrap();
    let datasci = builtin("python-datasci").unwrap();
    let before = store.key(&datasci).unwrap();
    assert_ne!(store.key(&default).unwrap(), before);

    let mut custom = default.clone();
    custom.apt.push("jq".into());
    store.register(custom).unwrap();
    assert_ne!(store.key(&datasci).unwrap(), before, "derived built-in follows a replaced base");
}

#[test]
fn nothing_is_built_in_an_empty_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = TemplateStore::new(dir.path());
    assert!(store.lookup(&builtin("default").unwrap()).unwrap().is_none());
    assert!(store.versions("default").is_empty());
    assert!(store.versions("../etc").is_empty());
}
