//! The service is what every front end calls; it must not grow a
//! dependency on one of them (docs/architecture.md#crates).

const HTTP_CRATES: &[&str] = &["axum", "hyper", "hyper-util", "tower", "tower-http", "http", "http-body", "http-body-util", "reqwest", "forkbox-server"];

#[test]
fn the_service_depends_on_no_http_crate() {
    let manifest = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).expect("read Cargo.toml");
    let mut section = "";
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
            continue;
        }
        if section != "[dependencies]" || line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name = line.split(['=', '.', ' ']).next().unwrap_or_default();
        assert!(!HTTP_CRATES.contains(&name), "crates/service depends on `{name}`, an HTTP crate: put what needs it in crates/server");
    }
}
