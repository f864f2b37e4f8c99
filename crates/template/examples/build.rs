//! Builds templates by name with a progress bar:
//! `cargo run -p forkbox-template --example build -- <store-root> [name...]`
//! (all built-ins when no name is given).

use forkbox_template::{builtin, builtin_names, check_tools, BarProgress, TemplateStore};

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(root) = args.next() else {
        eprintln!("usage: build <store-root> [template...]");
        std::process::exit(2);
    };
    let mut names: Vec<String> = args.collect();
    if names.is_empty() {
        names = builtin_names().iter().map(|n| n.to_string()).collect();
    }
    if let Err(e) = check_tools() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
    let store = TemplateStore::new(root);
    for name in names {
        let Some(recipe) = builtin(&name) else {
            eprintln!("error: no built-in template {name:?}");
            std::process::exit(1);
        };
        match store.build(&recipe, &BarProgress) {
            Ok(t) => println!("{} {} {}", t.name, t.hash, t.rootfs.display()),
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
    }
}
