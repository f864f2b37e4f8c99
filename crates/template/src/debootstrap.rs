//! The debootstrap step: its command line and turning its output into progress.

use std::path::Path;
use std::process::Command;

use crate::recipe::Recipe;
use crate::steps::Steps;
use crate::tools::{self, Tools};

/// Packages in a Debian minbase (bookworm and trixie alike); the first guess before downloads reveal the real count.
const MINBASE_PACKAGES: u64 = 90;
/// Rough number of dependencies each extra package drags in.
const PACKAGES_PER_INCLUDE: u64 = 6;
/// Of all packages, about this many are "required" and get an extra Extracting line.
const REQUIRED_PACKAGES: u64 = 85;

/// debootstrap mounts /proc and /sys in the target itself; in a private mount
/// namespace those mounts die with it even if it is killed mid-way.
pub(crate) fn command(tools: &Tools, recipe: &Recipe, target: &Path) -> Command {
    let mut cmd = tools::command(&tools.unshare);
    cmd.args(["--mount", "--propagation", "private", "--"]).arg(&tools.debootstrap);
    if recipe.variant != "default" {
        cmd.arg(format!("--variant={}", recipe.variant));
    }
    if !recipe.apt.is_empty() {
        cmd.arg(format!("--include={}", recipe.apt.join(",")));
    }
    cmd.arg(&recipe.suite).arg(target).arg(&recipe.mirror);
    cmd
}

/// What one debootstrap output line means.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Line<'a> {
    /// A per-package step: retrieving, validating, extracting, unpacking, configuring.
    Package { action: Action, package: &'a str },
    /// Other "I:", "W:" or "E:" lines, shown as they are.
    Info(&'a str),
    /// Anything else (e.g. dpkg chatter).
    Other,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Retrieve,
    Validate,
    Extract,
    Unpack,
    Configure,
}

impl Action {
    fn verb(self) -> &'static str {
        match self {
            Action::Retrieve => "retrieving",
            Action::Validate => "validating",
            Action::Extract => "extracting",
            Action::Unpack => "unpacking",
            Action::Configure => "configuring",
        }
    }
}

pub(crate) fn parse(line: &str) -> Line<'_> {
    let Some(rest) = line.strip_prefix("I: ") else {
        return match line.starts_with("W: ") || line.starts_with("E: ") {
            true => Line::Info(line),
            false => Line::Other,
        };
    };
    let rest = rest.trim_end();
    let Some((verb, args)) = rest.split_once(' ') else {
        return Line::Info(rest);
    };
    let action = match verb {
        "Retrieving" => Action::Retrieve,
        "Validating" => Action::Validate,
        "Extracting" => Action::Extract,
        "Unpacking" => Action::Unpack,
        "Configuring" => Action::Configure,
        _ => return Line::Info(rest),
    };
    let package = match action {
        // "I: Retrieving libacl1 2.3.1-3"; index files ("Retrieving Packages") have no version.
        Action::Retrieve | Action::Validate => match args.split_once(' ') {
            Some((package, version)) if !version.contains(' ') => package,
            _ => return Line::Info(rest),
        },
        // "I: Unpacking libacl1:amd64..."; phase lines ("Unpacking the base system...") have spaces.
        Action::Extract | Action::Unpack | Action::Configure => match args.strip_suffix("...") {
            Some(package) if !package.contains(' ') => package.split(':').next().unwrap_or(package),
            _ => return Line::Info(rest),
        },
    };
    Line::Package { action, package }
}

/// Turns package lines into steps, re-estimating the total as counts become known.
pub(crate) struct Tracker {
    estimate: u64,
    retrieved: u64,
    validated: u64,
    extracted: u64,
    unpacked: u64,
    configured: u64,
    /// Downloads are over, so `retrieved` is the real package count.
    downloads_done: bool,
    /// Steps of later build phases, kept in the total.
    later: u64,
}

impl Tracker {
    pub(crate) fn new(recipe: &Recipe, later: u64) -> Tracker {
        Tracker {
            estimate: MINBASE_PACKAGES + PACKAGES_PER_INCLUDE * recipe.apt.len() as u64,
            retrieved: 0,
            validated: 0,
            extracted: 0,
            unpacked: 0,
            configured: 0,
            downloads_done: false,
            later,
        }
    }

    /// Steps the initial estimate expects for debootstrap alone.
    pub(crate) fn initial_steps(&self) -> u64 {
        self.remaining()
    }

    pub(crate) fn line(&mut self, steps: &mut Steps<'_>, line: &str) {
        match parse(line) {
            Line::Package { action, package } => {
                match action {
                    Action::Retrieve => self.retrieved += 1,
                    Action::Validate => self.validated += 1,
                    Action::Extract => self.extracted += 1,
                    Action::Unpack => self.unpacked += 1,
                    Action::Configure => self.configured += 1,
                }
                if !matches!(action, Action::Retrieve | Action::Validate) {
                    self.downloads_done = true;
                }
                steps.advance(&format!("{} {package}", action.verb()));
                steps.remaining(self.remaining() + self.later);
            }
            Line::Info(text) => steps.message(&text.to_lowercase()),
            Line::Other => {}
        }
    }

    fn remaining(&self) -> u64 {
        let packages = match self.downloads_done {
            true => self.retrieved,
            // Past the guess but still downloading: assume a few more to come.
            false => self.estimate.max(self.retrieved + 10),
        };
        let extracts = match self.unpacked > 0 {
            true => 0, // extraction of required packages comes before any unpacking
            false => packages.min(REQUIRED_PACKAGES),
        };
        (packages.saturating_sub(self.retrieved))
            + packages.saturating_sub(self.validated)
            + extracts.saturating_sub(self.extracted)
            + packages.saturating_sub(self.unpacked)
            + packages.saturating_sub(self.configured)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_package_lines() {
        let pkg = |action, package| Line::Package { action, package };
        assert_eq!(parse("I: Retrieving libacl1 2.3.1-3"), pkg(Action::Retrieve, "libacl1"));
        assert_eq!(parse("I: Validating python3-pandas 1.5.3+dfsg-2"), pkg(Action::Validate, "python3-pandas"));
        assert_eq!(parse("I: Extracting adduser..."), pkg(Action::Extract, "adduser"));
        assert_eq!(parse("I: Unpacking python3-pandas:all..."), pkg(Action::Unpack, "python3-pandas"));
        assert_eq!(parse("I: Configuring libc-bin:amd64..."), pkg(Action::Configure, "libc-bin"));
    }

    #[test]
    fn phase_and_index_lines_are_info() {
        assert_eq!(parse("I: Retrieving InRelease "), Line::Info("Retrieving InRelease"));
        assert_eq!(parse("I: Validating Packages "), Line::Info("Validating Packages"));
        assert_eq!(parse("I: Unpacking the base system..."), Line::Info("Unpacking the base system..."));
        assert_eq!(parse("I: Configuring required packages..."), Line::Info("Configuring required packages..."));
        assert_eq!(parse("I: Base system installed successfully."), Line::Info("Base system installed successfully."));
        assert_eq!(parse("E: Couldn't find these debs: nope"), Line::Info("E: Couldn't find these debs: nope"));
        assert_eq!(parse("dpkg: warning: something"), Line::Other);
    }

    #[test]
    fn estimate_converges_on_the_real_count() {
        use crate::progress::NoProgress;
        let recipe = Recipe::from_toml("name = \"t\"").unwrap();
        let mut tracker = Tracker::new(&recipe, 3);
        let mut steps = Steps::begin(&NoProgress, "t", tracker.initial_steps() + 3);
        for i in 0..100 {
            tracker.line(&mut steps, &format!("I: Retrieving p{i} 1.0"));
            tracker.line(&mut steps, &format!("I: Validating p{i} 1.0"));
        }
        // 100 downloaded so far; more than the guess, so more are assumed.
        assert!(tracker.remaining() > 300);
        tracker.line(&mut steps, "I: Extracting p0...");
        assert_eq!(tracker.remaining(), 84 + 200);
        for i in 0..100 {
            tracker.line(&mut steps, &format!("I: Unpacking p{i}:amd64..."));
            tracker.line(&mut steps, &format!("I: Configuring p{i}:amd64..."));
        }
        assert_eq!(tracker.remaining(), 0);
    }
}
