//! criu's version, as `criu --version` prints it (`Version: 4.2.1`).

use std::fmt;

/// A criu release, compared field by field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

/// The first criu that works on Linux >= 6.16: 3.17 does not start
/// (`Unexpected rt vDSO area bounds`) and 4.1.1 cannot dump an `AF_INET`
/// socket (`Can't get 1:16 opt`).
pub const MINIMUM: Version = Version { major: 4, minor: 2, patch: 0 };

impl Version {
    /// The version on the `Version:` line of `criu --version`'s output.
    pub fn from_output(output: &str) -> Option<Version> {
        let line = output.lines().find_map(|l| l.trim().strip_prefix("Version:"))?;
        let mut fields = line.trim().split('.').map(|f| f.parse::<u32>());
        let major = fields.next()?.ok()?;
        let minor = fields.next()?.ok()?;
        // "4.2" has no patch field.
        let patch = match fields.next() {
            Some(p) => p.ok()?,
            None => 0,
        };
        Some(Version { major, minor, patch })
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_version_line_and_orders_releases() {
        assert_eq!(Version::from_output("Version: 4.2.1\n"), Some(Version { major: 4, minor: 2, patch: 1 }));
        assert_eq!(Version::from_output("Version: 3.17\nGitID: v3.17\n"), Some(Version { major: 3, minor: 17, patch: 0 }));
        assert_eq!(Version::from_output("criu: unknown option\n"), None);
        assert_eq!(Version::from_output("Version: four\n"), None);
        assert!(Version::from_output("Version: 4.1.1").unwrap() < MINIMUM);
        assert!(Version::from_output("Version: 4.2").unwrap() >= MINIMUM);
        assert!(Version::from_output("Version: 5.0.0").unwrap() > MINIMUM);
        assert_eq!(MINIMUM.to_string(), "4.2.0");
    }
}
