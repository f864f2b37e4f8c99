//! The shim as a standalone executable, for the engine's own tests (the
//! `forkbox` binary runs the same code as `forkbox __shim`).

fn main() {
    if std::env::args_os().next().is_some_and(|a| a == forkbox_jail::entry::INIT_ARGV0) {
        forkbox_jail::entry::init_main();
    }
    let config = std::env::args().nth(2).unwrap_or_default();
    forkbox_jail::entry::shim_main(&config)
}
