//! Moving a dumped tree to another uid range: criu recreates a user
//! namespace from `userns-*.img` with the maps written there, so a restore
//! into a fresh range rewrites that image (`UsernsEntry` of criu's
//! images/userns.proto: repeated `UidGidExtent { first, lower_first,
//! count }` as uid_map = 1 and gid_map = 2).

use std::path::Path;

use crate::error::CriuError;

/// Image files open with two magic numbers.
const HEADER: usize = 8;

/// Rewrite the user namespace image at `path` so its maps start at host
/// id `to_base` (each extent keeps its offset from the lowest one).
pub fn rebase_userns_image(path: &Path, to_base: u32) -> Result<(), CriuError> {
    let bad = |why: &str| CriuError::Image { path: path.to_path_buf(), why: why.to_string() };
    let data = std::fs::read(path).map_err(|e| bad(&e.to_string()))?;
    if data.len() < HEADER + 4 {
        return Err(bad("too short"));
    }
    let size = u32::from_le_bytes(data[HEADER..HEADER + 4].try_into().map_err(|_| bad("no entry size"))?) as usize;
    let entry = data.get(HEADER + 4..HEADER + 4 + size).ok_or_else(|| bad("entry cut short"))?;
    let extents = parse_entry(entry).ok_or_else(|| bad("not a user namespace entry"))?;
    let from_base = extents.iter().map(|(_, e)| e[1]).min().ok_or_else(|| bad("no map"))?;
    let mut out_entry = Vec::with_capacity(entry.len() + 8);
    for (field, [first, lower, count]) in extents {
        let lower = lower - from_base + to_base;
        let mut extent = Vec::new();
        for (tag, value) in [(0x08u8, first), (0x10, lower), (0x18, count)] {
            extent.push(tag);
            put_varint(&mut extent, u64::from(value));
        }
        out_entry.push(field << 3 | 2);
        put_varint(&mut out_entry, extent.len() as u64);
        out_entry.extend(extent);
    }
    let mut out = data[..HEADER].to_vec();
    out.extend((out_entry.len() as u32).to_le_bytes());
    out.extend(out_entry);
    out.extend(&data[HEADER + 4 + size..]);
    std::fs::write(path, out).map_err(|e| bad(&e.to_string()))
}

/// (field 1 or 2, [first, lower_first, count]) of each extent.
fn parse_entry(mut entry: &[u8]) -> Option<Vec<(u8, [u32; 3])>> {
    let mut out = Vec::new();
    while !entry.is_empty() {
        let tag = *entry.first()?;
        let field = tag >> 3;
        if tag & 7 != 2 || !(1..=2).contains(&field) {
            return None;
        }
        let (len, rest) = varint(&entry[1..])?;
        let (mut body, rest) = rest.split_at_checked(len as usize)?;
        let mut extent = [0u32; 3];
        while !body.is_empty() {
            let tag = body[0];
            let index = usize::from(tag >> 3).checked_sub(1).filter(|i| *i < 3 && tag & 7 == 0)?;
            let (value, rest) = varint(&body[1..])?;
            extent[index] = u32::try_from(value).ok()?;
            body = rest;
        }
        out.push((field, extent));
        entry = rest;
    }
    Some(out)
}

fn varint(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut value = 0u64;
    for (i, b) in bytes.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((value, &bytes[i + 1..]));
        }
    }
    None
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// userns-14.img as criu 4.2.1 wrote it for "0 268435456 65536".
    const DUMPED: [u8; 40] = [
        0x19, 0x43, 0x56, 0x54, 0x06, 0x49, 0x47, 0x55, 0x1c, 0, 0, 0, 0x0a, 0x0c, 0x08, 0x00, 0x10, 0x80, 0x80, 0x80, 0x80, 0x01, 0x18, 0x80, 0x80, 0x04,
        0x12, 0x0c, 0x08, 0x00, 0x10, 0x80, 0x80, 0x80, 0x80, 0x01, 0x18, 0x80, 0x80, 0x04,
    ];

    #[test]
    fn a_map_moves_to_the_new_base_and_nothing_else_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("userns-14.img");
        std::fs::write(&path, DUMPED).unwrap();
        rebase_userns_image(&path, 0x1001_0000).unwrap();
        let written = std::fs::read(&path).unwrap();
        assert_eq!(&written[..8], &DUMPED[..8]);
        let size = u32::from_le_bytes(written[8..12].try_into().unwrap()) as usize;
        let extents = parse_entry(&written[12..12 + size]).unwrap();
        assert_eq!(extents, [(1, [0, 0x1001_0000, 65536]), (2, [0, 0x1001_0000, 65536])]);
        // And back: the same bytes criu wrote.
        rebase_userns_image(&path, 268_435_456).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), DUMPED);
    }

    #[test]
    fn what_is_not_a_user_namespace_image_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.img");
        std::fs::write(&path, [0u8; 20]).unwrap();
        assert!(rebase_userns_image(&path, 1).is_err());
        std::fs::write(&path, &DUMPED[..30]).unwrap();
        assert!(rebase_userns_image(&path, 1).is_err());
    }
}
