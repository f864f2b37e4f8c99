//! No crate of the workspace has an import cycle among its modules
//! (docs/architecture.md#layers). A module is a file at the top of a
//! crate's `src/`, or a folder there with everything under it: a module
//! split into files is one unit, and its files may name each other.
//! An edge is any `crate::x` path in a module's code (not in its
//! `#[cfg(test)] mod tests`, nor in a crate's test-only `tests` module).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

/// Every `.rs` file under `path` (itself, if it is one).
fn sources(path: &Path) -> Vec<PathBuf> {
    if path.is_file() {
        return vec![path.to_path_buf()];
    }
    let mut all = Vec::new();
    for entry in std::fs::read_dir(path).expect("read a source folder").flatten() {
        let p = entry.path();
        if p.is_dir() {
            all.extend(sources(&p));
        } else if p.extension().is_some_and(|e| e == "rs") {
            all.push(p);
        }
    }
    all
}

/// The code of a file without its unit tests (by convention, last).
fn code(file: &Path) -> String {
    let text = std::fs::read_to_string(file).expect("read a source file");
    match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

fn ident(s: &str) -> &str {
    let end = s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(s.len());
    &s[..end]
}

/// The top-level modules `code` names through `crate::`.
fn references(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `use crate::{a::X, b}`: the first name of each item (nesting
            // is rare at the top and only adds names of the same kind).
            let group = &group[..group.find('}').unwrap_or(group.len())];
            found.extend(group.split(',').map(|item| ident(item.trim()).to_string()));
        } else {
            found.insert(ident(rest).to_string());
        }
    }
    found.retain(|m| !m.is_empty());
    found
}

/// The module graph of the crate whose sources are in `src`.
fn graph(src: &Path) -> Graph {
    let mut modules = BTreeMap::new();
    for entry in std::fs::read_dir(src).expect("read src").flatten() {
        let path = entry.path();
        let name = path.file_stem().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        let is_module = path.is_dir() || path.extension().is_some_and(|e| e == "rs");
        if !is_module || ["lib", "main", "tests"].contains(&name.as_str()) {
            continue;
        }
        modules.insert(name, path);
    }
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    modules
        .iter()
        .map(|(name, path)| {
            let deps = sources(path).iter().flat_map(|f| references(&code(f))).filter(|d| d != name && names.contains(d)).collect();
            (name.clone(), deps)
        })
        .collect()
}

/// A cycle in `g`, if it has one (as the modules on it, in order).
fn cycle(g: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(g: &Graph, at: &str, marks: &mut BTreeMap<String, Mark>, path: &mut Vec<String>) -> Option<Vec<String>> {
        match marks.get(at) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let from = path.iter().position(|m| m == at).unwrap_or(0);
                let mut found = path[from..].to_vec();
                found.push(at.to_string());
                return Some(found);
            }
            None => {}
        }
        marks.insert(at.to_string(), Mark::Open);
        path.push(at.to_string());
        for next in g.get(at).into_iter().flatten() {
            if let Some(c) = visit(g, next, marks, path) {
                return Some(c);
            }
        }
        path.pop();
        marks.insert(at.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    g.keys().find_map(|m| visit(g, m, &mut marks, &mut Vec::new()))
}

#[test]
fn no_crate_has_a_module_import_cycle() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the crates folder");
    let mut checked = 0;
    for entry in std::fs::read_dir(crates).expect("read crates").flatten() {
        let src = entry.path().join("src");
        if !src.is_dir() {
            continue;
        }
        let g = graph(&src);
        if let Some(c) = cycle(&g) {
            panic!("{}: its modules import each other in a cycle: {}", entry.path().display(), c.join(" → "));
        }
        checked += 1;
    }
    assert!(checked >= 8, "only {checked} crates found under {}", crates.display());
}

#[test]
fn a_cycle_is_found() {
    let g: Graph = [("a", vec!["b"]), ("b", vec!["c"]), ("c", vec!["a"]), ("d", vec!["a"])]
        .into_iter()
        .map(|(m, deps)| (m.to_string(), deps.into_iter().map(String::from).collect()))
        .collect();
    assert_eq!(cycle(&g), Some(vec!["a", "b", "c", "a"].into_iter().map(String::from).collect()));
    let acyclic: Graph = [("a", vec!["b"]), ("b", vec![])].into_iter().map(|(m, d)| (m.to_string(), d.into_iter().map(String::from).collect())).collect();
    assert_eq!(cycle(&acyclic), None);
}

#[test]
fn references_are_read_from_paths_and_use_groups() {
    let found = references("use crate::{a::X, b};\nfn f() { crate::c::g(); }\n");
    assert_eq!(found, ["a", "b", "c"].into_iter().map(String::from).collect());
}
