//! Which names other files use: what an outline shows first, and the "definitions visible"
//! measure of a context.

use std::collections::HashMap;

use crate::outline::FileAnalysis;

/// How many files reference each name, over one commit's eligible files.
#[derive(Clone, Debug, Default)]
pub(crate) struct References {
    files: HashMap<String, u32>,
}

impl References {
    pub(crate) fn new<'a>(analyses: impl IntoIterator<Item = &'a FileAnalysis>) -> References {
        let mut files: HashMap<String, u32> = HashMap::new();
        for a in analyses {
            for (name, _) in &a.references {
                *files.entry(name.clone()).or_default() += 1;
            }
        }
        References { files }
    }

    /// Whether a file other than the one analysed as `own` references `name`.
    pub(crate) fn elsewhere(&self, own: &FileAnalysis, name: &str) -> bool {
        let all = self.files.get(name).copied().unwrap_or(0);
        let mine = u32::from(own.references.binary_search_by(|(n, _)| n.as_str().cmp(name)).is_ok());
        all > mine
    }

    /// The names `own` defines that other files reference.
    pub(crate) fn used_definitions<'a>(&'a self, own: &'a FileAnalysis) -> impl Iterator<Item = &'a str> + 'a {
        own.defines.iter().map(String::as_str).filter(move |n| self.elsewhere(own, n))
    }
}

/// Of the definitions other files reference, how many a context shows (whole files show all of
/// theirs; outlines the ones they kept).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DefinitionsVisible {
    /// Definitions (a file's defined name) that another file references.
    pub referenced: usize,
    /// Of those, the ones whose signature or text appears in the context.
    pub visible: usize,
}

impl DefinitionsVisible {
    /// The counts of a list of definitions.
    pub fn of(all: &[DefinitionShown]) -> DefinitionsVisible {
        DefinitionsVisible { referenced: all.len(), visible: all.iter().filter(|d| d.visible).count() }
    }

    /// `visible / referenced` (1 when nothing is referenced).
    pub fn share(&self) -> f64 {
        if self.referenced == 0 {
            1.0
        } else {
            self.visible as f64 / self.referenced as f64
        }
    }
}

/// A definition that another file references, and whether a context shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DefinitionShown {
    /// The defining file.
    pub path: String,
    /// The defined name.
    pub name: String,
    /// Whether the context shows its signature (or the whole file).
    pub visible: bool,
}
