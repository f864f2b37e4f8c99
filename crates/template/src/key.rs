//! Content hash that names a built template version.

use sha2::{Digest, Sha256};

use crate::recipe::Recipe;

/// Bump whenever the build steps change what ends up in a rootfs, so every
/// template is rebuilt with the new builder.
pub const BUILDER_VERSION: u32 = 1;

/// Hex characters of the sha256 kept; 64 bits is plenty for one template's versions.
const KEY_LEN: usize = 16;

/// Key of `recipe` given the key of its base (if any). Including the base's
/// key makes a changed base rebuild every template derived from it.
pub(crate) fn compute(recipe: &Recipe, base_key: Option<&str>) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"forkbox-template\0");
    hasher.update(BUILDER_VERSION.to_le_bytes());
    hasher.update(recipe.canonical().as_bytes());
    hasher.update(b"\0");
    hasher.update(base_key.unwrap_or("").as_bytes());
    let mut key = hex::encode(hasher.finalize());
    key.truncate(KEY_LEN);
    key
}

/// Whether `s` could be a key we produced; guards paths built from caller input.
pub(crate) fn is_valid(s: &str) -> bool {
    s.len() == KEY_LEN && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}
