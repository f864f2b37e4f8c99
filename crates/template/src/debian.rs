//! Which Debian release the built-in templates are made from.
//!
//! The built-in recipes name Debian 13 (trixie): Python 3.13, numpy 2,
//! pandas 2. An operator whose code still wants Debian 12's stack (Python
//! 3.11, numpy 1.24, pandas 1.5) builds them from bookworm instead, with
//! `--debian 12`. Only recipes that start from scratch take the release;
//! derived ones get it from their base, so `python-datasci` follows `default`.

use std::fmt;
use std::str::FromStr;

use crate::error::TemplateError;
use crate::recipe::Recipe;

/// A Debian release the built-in recipes can be made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Debian {
    /// Debian 12: Python 3.11, numpy 1.24, pandas 1.5.
    Bookworm,
    /// Debian 13: Python 3.13, numpy 2.2, pandas 2.2.
    #[default]
    Trixie,
}

impl Debian {
    pub const ALL: [Debian; 2] = [Debian::Bookworm, Debian::Trixie];

    /// The suite debootstrap is given.
    pub fn suite(self) -> &'static str {
        match self {
            Debian::Bookworm => "bookworm",
            Debian::Trixie => "trixie",
        }
    }

    /// The release number (`12`, `13`).
    pub fn version(self) -> u32 {
        match self {
            Debian::Bookworm => 12,
            Debian::Trixie => 13,
        }
    }

    /// The release's own `python3`, as `major.minor`.
    pub fn python(self) -> &'static str {
        match self {
            Debian::Bookworm => "3.11",
            Debian::Trixie => "3.13",
        }
    }
}

impl fmt::Display for Debian {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Debian {} ({})", self.version(), self.suite())
    }
}

impl FromStr for Debian {
    type Err = TemplateError;

    /// `12`, `13`, or the suite's name.
    fn from_str(s: &str) -> Result<Debian, TemplateError> {
        let s = s.trim();
        Debian::ALL
            .into_iter()
            .find(|d| s == d.suite() || s == d.version().to_string())
            .ok_or_else(|| TemplateError::Invalid(format!("unknown Debian release {s:?}: use 12 (bookworm) or 13 (trixie)")))
    }
}

impl Recipe {
    /// This recipe made from `debian`: a recipe that bootstraps takes its
    /// suite; a derived one is left alone (its base decides).
    pub fn on_debian(mut self, debian: Debian) -> Recipe {
        if self.base.is_none() {
            self.suite = debian.suite().to_string();
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_parse_by_number_or_suite() {
        for (text, want) in [("12", Debian::Bookworm), ("bookworm", Debian::Bookworm), ("13", Debian::Trixie), (" trixie ", Debian::Trixie)] {
            assert_eq!(text.parse::<Debian>().unwrap(), want, "{text}");
        }
        for bad in ["", "11", "sid", "Debian 13", "14"] {
            let err = bad.parse::<Debian>().unwrap_err().to_string();
            assert!(err.contains("use 12 (bookworm) or 13 (trixie)"), "{bad}: {err}");
        }
        assert_eq!(Debian::default(), Debian::Trixie);
        assert_eq!(crate::recipe::DEFAULT_SUITE, Debian::default().suite());
        assert_eq!(Debian::Bookworm.to_string(), "Debian 12 (bookworm)");
    }

    #[test]
    fn only_a_bootstrapping_recipe_takes_the_release() {
        let root = Recipe::from_toml("name = \"r\"").unwrap();
        assert_eq!(root.clone().on_debian(Debian::Bookworm).suite, "bookworm");
        assert_eq!(root.on_debian(Debian::Trixie).suite, "trixie");
        let derived = Recipe::from_toml("name = \"d\"\nbase = \"r\"").unwrap();
        assert_eq!(derived.clone().on_debian(Debian::Bookworm), derived);
    }
}
