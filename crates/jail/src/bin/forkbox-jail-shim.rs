//! The shim as a standalone executable, for the engine's own tests (the
//! `forkbox` binary runs the same code as `forkbox __shim`).

fn main() {
    let config = std::env::args().nth(2).unwrap_or_default();
    forkbox_jail::shim::main(&config)
}
