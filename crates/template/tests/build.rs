//! Real builds: a minbase debootstrap (cached across runs) and templates derived from it.
//!
//! The base lives in `$FORKBOX_TEST_CACHE` (default /var/cache/forkbox-test)
//! so only the first run pays for debootstrap. Needs root and network access
//! to deb.debian.org, like any template build.

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use forkbox_template::{Recipe, RecordedProgress, TemplateError, TemplateStore};

const BASE: &str = r#"
name = "forkbox-test-base"
description = "minimal bookworm for forkbox-template's tests"
suite = "bookworm"
mirror = "http://deb.debian.org/debian"
variant = "minbase"
# Smaller base, faster copies for the derived templates below.
run = [
    "apt-get clean",
    "rm -rf /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/* /usr/share/locale/*",
]
"#;

fn store() -> TemplateStore {
    let root = std::env::var_os("FORKBOX_TEST_CACHE").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/var/cache/forkbox-test"));
    let mut store = TemplateStore::new(root);
    store.register(Recipe::from_toml(BASE).unwrap()).unwrap();
    store
}

/// A derived recipe named `name` running `run`.
fn derived(name: &str, run: &str) -> Recipe {
    Recipe::from_toml(&format!("name = {name:?}\nbase = \"forkbox-test-base\"\nrun = [{run:?}]")).unwrap()
}

/// Removes every version of `name`, so the test starts from a known state.
fn clear(store: &TemplateStore, name: &str) {
    for version in store.versions(name) {
        store.remove_version(&version).unwrap();
    }
    assert!(store.versions(name).is_empty());
}

/// Deletes test bases built by older versions of this test or the builder,
/// so the cache doesn't grow forever.
fn prune_old_bases(store: &TemplateStore) {
    let base = store.recipe("forkbox-test-base").unwrap();
    let current = store.key(&base).unwrap();
    for version in store.versions(&base.name) {
        if version.hash != current {
            store.remove_version(&version).unwrap();
        }
    }
}

/// Records progress calls per kind.
#[derive(Default)]
struct Recorder(RecordedProgress);

impl Recorder {
    fn calls(&self, kind: &str) -> Vec<String> {
        self.0.calls().into_iter().filter(|c| c.starts_with(kind)).collect()
    }

    /// Calls from the start of `template`'s build on (the base may have been built first).
    fn calls_for(&self, template: &str, kind: &str) -> Vec<String> {
        let calls = self.0.calls();
        let start = calls.iter().position(|c| c.starts_with(&format!("begin {template} ")));
        let start = start.unwrap_or_else(|| panic!("{template} never began: {calls:?}"));
        calls[start..].iter().filter(|c| c.starts_with(kind)).cloned().collect()
    }
}

fn nothing_mounted_under(store: &TemplateStore) {
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let root = store.root().to_string_lossy().into_owned();
    assert!(!mounts.contains(&root), "build left mounts under {root}:\n{mounts}");
}

#[test]
fn derived_template_builds_caches_and_rebuilds_on_change() {
    let store = store();
    prune_old_bases(&store);
    let name = "forkbox-test-derived";
    clear(&store, name);
    // A leftover of a killed build must not survive the next one.
    let stale = store.root().join(name).join("0123456789abcdef.partial");
    fs::create_dir_all(stale.join("rootfs")).unwrap();

    // The run step also checks the build sandbox: /proc, /dev and DNS config present.
    let check = "test -r /proc/self/status && test -c /dev/null && test -s /etc/resolv.conf";
    let first = derived(name, &format!("{check} && echo first > /etc/forkbox-test"));
    let progress = Recorder::default();
    let built = store.build(&first, &progress.0).unwrap();
    assert_eq!(built.name, name);
    assert_eq!(built.hash, store.key(&first).unwrap());
    assert_eq!(built.rootfs, store.root().join(name).join(&built.hash).join("rootfs"));
    assert_eq!(fs::read_to_string(built.rootfs.join("etc/forkbox-test")).unwrap(), "first\n");
    // Build-time tweaks are undone.
    assert_eq!(fs::read(built.rootfs.join("etc/resolv.conf")).unwrap(), b"");
    assert!(!built.rootfs.join("usr/sbin/policy-rc.d").exists());
    assert!(built.rootfs.join("usr/bin/apt-get").exists(), "base rootfs was copied");
    assert!(!stale.exists(), "stale .partial dir was not removed");
    nothing_mounted_under(&store);
    // Copy, one run step, finishing.
    assert_eq!(progress.calls_for(name, "begin"), [format!("begin {name} 3")]);
    assert_eq!(progress.calls_for(name, "advance").len(), 3);
    assert_eq!(progress.calls_for(name, "finish"), [format!("finish {name}")]);

    // Same recipe again: a cache hit, no build at all.
    let again = Recorder::default();
    let started = Instant::now();
    assert_eq!(store.build(&first, &again.0).unwrap(), built);
    assert!(started.elapsed() < Duration::from_secs(2), "cache hit took {:?}", started.elapsed());
    assert!(again.calls("").is_empty(), "cache hit reported progress: {:?}", again.calls(""));
    assert_eq!(store.lookup(&first).unwrap(), Some(built.clone()));

    // A changed run step is a new version; the old one stays until removed.
    let second = derived(name, "echo second > /etc/forkbox-test");
    assert_eq!(store.lookup(&second).unwrap(), None);
    let rebuilt = store.build(&second, &RecordedProgress::default()).unwrap();
    assert_ne!(rebuilt.hash, built.hash);
    assert_eq!(fs::read_to_string(rebuilt.rootfs.join("etc/forkbox-test")).unwrap(), "second\n");
    assert_eq!(fs::read_to_string(built.rootfs.join("etc/forkbox-test")).unwrap(), "first\n");
    assert_eq!(store.versions(name), [rebuilt.clone(), built.clone()], "newest first");

    store.remove_version(&built).unwrap();
    assert!(!built.rootfs.exists());
    assert_eq!(store.versions(name), std::slice::from_ref(&rebuilt));
    assert_eq!(store.lookup(&first).unwrap(), None);
    store.remove_version(&built).unwrap();
    clear(&store, name);
}

#[test]
fn failing_step_reports_its_output_and_leaves_nothing_behind() {
    let store = store();
    let name = "forkbox-test-failing";
    clear(&store, name);
    let recipe = derived(name, "for i in $(seq 1 70); do echo line-$i; done; exit 7");
    let err = store.build(&recipe, &RecordedProgress::default()).unwrap_err();
    let TemplateError::StepFailed { template, step, status, tail } = &err else {
        panic!("expected a failed step, got {err}");
    };
    assert_eq!(template, name);
    assert!(step.starts_with("run step 1 (`for i in"), "{step}");
    assert_eq!(status, "exit status 7");
    assert_eq!(tail.lines().count(), 50);
    assert!(tail.starts_with("line-21\n") && tail.ends_with("line-70"), "{tail}");
    assert!(store.versions(name).is_empty());
    let leftovers: Vec<_> = fs::read_dir(store.root().join(name)).unwrap().flatten().collect();
    assert!(leftovers.is_empty(), "failed build left {leftovers:?}");
    nothing_mounted_under(&store);
}

#[test]
fn tools_are_installed() {
    forkbox_template::check_tools().unwrap();
}
