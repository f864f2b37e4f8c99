//! Sandbox ids: how they are made and what shape they have.

use rand::Rng;

/// Sandbox ids: `sb-` and 20 lowercase base-32 characters (also the hostname).
pub fn new_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut rng = rand::rng();
    let s: String = (0..20).map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char).collect();
    format!("sb-{s}")
}

/// Whether `id` has the shape of a sandbox id (so bad input gets 400, not 404).
pub fn valid_id(id: &str) -> bool {
    id.len() <= 64 && !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}
