//! The apt-get step of derived templates and turning its output into progress.

use crate::steps::Steps;

/// Dependencies guessed per requested package until apt says how many it installs.
const PACKAGES_PER_REQUEST: u64 = 8;

/// Shell command that installs `packages` inside the rootfs. Names are
/// validated Debian package names, so joining them with spaces is safe.
pub(crate) fn install_script(packages: &[String]) -> String {
    format!(
        "apt-get update -q -o Dpkg::Use-Pty=0 && \
         apt-get install -y -q --no-install-recommends -o Dpkg::Use-Pty=0 {}",
        packages.join(" ")
    )
}

/// What one apt-get output line means.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Line<'a> {
    /// "0 upgraded, 57 newly installed, 0 to remove and 0 not upgraded."
    Plan(u64),
    Fetch(&'a str),
    Unpack(&'a str),
    Setup(&'a str),
    Other,
}

pub(crate) fn parse(line: &str) -> Line<'_> {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        [_, "upgraded,", n, "newly", "installed,", ..] => n.parse().map_or(Line::Other, Line::Plan),
        // "Get:3 http://deb.debian.org/debian bookworm/main amd64 python3-scipy amd64 1.10.1-2 [15.0 MB]";
        // index downloads during `apt-get update` have other shapes.
        [get, _url, _dist, _arch, package, _arch2, _version, size, _unit] if get.starts_with("Get:") && size.starts_with('[') => Line::Fetch(package),
        ["Unpacking", package, ..] => Line::Unpack(strip_arch(package)),
        ["Setting", "up", package, ..] => Line::Setup(strip_arch(package)),
        _ => Line::Other,
    }
}

fn strip_arch(package: &str) -> &str {
    package.split(':').next().unwrap_or(package)
}

/// Turns apt-get lines into steps: one for update, then fetch, unpack and
/// set up for each package once apt has said how many there are.
pub(crate) struct Tracker {
    planned: Option<u64>,
    requested: u64,
    events: u64,
    later: u64,
}

impl Tracker {
    pub(crate) fn new(requested: usize, later: u64) -> Tracker {
        Tracker { planned: None, requested: requested as u64, events: 0, later }
    }

    pub(crate) fn initial_steps(&self) -> u64 {
        self.remaining()
    }

    pub(crate) fn line(&mut self, steps: &mut Steps<'_>, line: &str) {
        let (verb, package) = match parse(line) {
            Line::Plan(n) => {
                self.planned = Some(n);
                steps.advance(&format!("installing {n} packages"));
                steps.remaining(self.remaining() + self.later);
                return;
            }
            // Only package downloads of the install count; update fetches indexes.
            Line::Fetch(p) if self.planned.is_some() => ("retrieving", p),
            Line::Unpack(p) => ("unpacking", p),
            Line::Setup(p) => ("configuring", p),
            Line::Fetch(_) | Line::Other => {
                if self.planned.is_none() && !line.trim().is_empty() {
                    steps.message(&format!("apt-get update: {line}"));
                }
                return;
            }
        };
        self.events += 1;
        steps.advance(&format!("{verb} {package}"));
        steps.remaining(self.remaining() + self.later);
    }

    fn remaining(&self) -> u64 {
        match self.planned {
            Some(n) => (3 * n).saturating_sub(self.events),
            // One step for the update, then a guess at the install.
            None => 1 + 3 * self.requested * PACKAGES_PER_REQUEST,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_apt_lines() {
        assert_eq!(parse("0 upgraded, 57 newly installed, 0 to remove and 0 not upgraded."), Line::Plan(57));
        assert_eq!(parse("Get:3 http://deb.debian.org/debian bookworm/main amd64 python3-scipy amd64 1.10.1-2 [15.0 MB]"), Line::Fetch("python3-scipy"));
        assert_eq!(parse("Get:1 http://deb.debian.org/debian bookworm InRelease [151 kB]"), Line::Other);
        assert_eq!(parse("Get:4 http://deb.debian.org/debian bookworm/main amd64 Packages [8792 kB]"), Line::Other);
        assert_eq!(parse("Unpacking python3-scipy (1.10.1-2) ..."), Line::Unpack("python3-scipy"));
        assert_eq!(parse("Setting up libblas3:amd64 (3.11.0-2) ..."), Line::Setup("libblas3"));
        assert_eq!(parse("Reading package lists..."), Line::Other);
    }

    #[test]
    fn tracker_counts_three_steps_per_planned_package() {
        use crate::progress::NoProgress;
        let mut tracker = Tracker::new(1, 2);
        assert_eq!(tracker.initial_steps(), 1 + 3 * PACKAGES_PER_REQUEST);
        let mut steps = Steps::begin(&NoProgress, "t", tracker.initial_steps() + 2);
        tracker.line(&mut steps, "Get:4 http://deb.debian.org/debian bookworm/main amd64 jq amd64 1.6-2.1 [64.9 kB]");
        assert_eq!(tracker.events, 0, "downloads before the plan are index files");
        tracker.line(&mut steps, "0 upgraded, 2 newly installed, 0 to remove and 0 not upgraded.");
        assert_eq!(tracker.remaining(), 6);
        tracker.line(&mut steps, "Get:1 http://deb.debian.org/debian bookworm/main amd64 jq amd64 1.6-2.1 [64.9 kB]");
        tracker.line(&mut steps, "Unpacking jq (1.6-2.1) ...");
        tracker.line(&mut steps, "Setting up jq (1.6-2.1) ...");
        assert_eq!(tracker.remaining(), 3);
    }

    #[test]
    fn script_installs_without_recommends() {
        let script = install_script(&["a1".into(), "b2".into()]);
        assert!(script.starts_with("apt-get update"));
        assert!(script.ends_with("--no-install-recommends -o Dpkg::Use-Pty=0 a1 b2"));
    }
}
