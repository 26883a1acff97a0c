//! The models cachet knows by name, and [`resolve`]: from what a user wrote
//! (`--model`, `[model] path`, `cachet models pull NAME`) to a verified file.

use std::path::{Path, PathBuf};

use super::hf::{self, HfFile, HfOptions};
use super::{pull, ModelSpec, Progress, PullError, PullOptions};

/// One model of the catalogue.
#[derive(Debug, Clone, Copy)]
pub struct CatalogueEntry {
    /// The name users type: `cachet models pull NAME`, `serve --model NAME`.
    pub name: &'static str,
    /// One line on what it is for.
    pub summary: &'static str,
    /// Where its parts are published and their hashes.
    pub spec: fn() -> ModelSpec,
}

/// The catalogue; the first entry is the default model.
pub const CATALOGUE: [CatalogueEntry; 2] = [
    CatalogueEntry {
        name: "qwen2.5-coder-0.5b",
        summary: "Qwen2.5-Coder-0.5B-Instruct Q4_K_M, context 32k: the fastest first token, for chat and \
                  completion; too small to drive a tool-calling agent reliably",
        spec: ModelSpec::default_model,
    },
    CatalogueEntry {
        name: "qwen2.5-coder-1.5b",
        summary: "Qwen2.5-Coder-1.5B-Instruct Q4_K_M, context 32k: for agents that edit files (aider, Codex, \
                  Qwen Code); reads 2.3x the weights per token",
        spec: ModelSpec::coder_1_5b,
    },
];

/// The catalogue entry called `name` (case-insensitive; `default` is the first).
pub fn find(name: &str) -> Option<&'static CatalogueEntry> {
    if name.eq_ignore_ascii_case("default") {
        return CATALOGUE.first();
    }
    CATALOGUE.iter().find(|e| e.name.eq_ignore_ascii_case(name))
}

/// What a model name stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// An existing file or directory.
    Path(PathBuf),
    /// A catalogue model (its entry's name).
    Catalogue(&'static str),
    /// A Hugging Face file.
    Hub(HfFile),
}

impl Resolved {
    /// Reads a name: an existing path wins, then `hf:…`, then a catalogue name.
    pub fn parse(name: &str) -> Result<Self, PullError> {
        let name = name.trim();
        if name.starts_with("hf:") {
            return Ok(Resolved::Hub(name.parse()?));
        }
        if Path::new(name).exists() {
            return Ok(Resolved::Path(PathBuf::from(name)));
        }
        if let Some(entry) = find(name) {
            return Ok(Resolved::Catalogue(entry.name));
        }
        let names: Vec<&str> = CATALOGUE.iter().map(|e| e.name).collect();
        Err(PullError::BadName {
            name: name.to_string(),
            reason: format!(
                "no such file, and not a model name ({}, or hf:OWNER/REPO/FILE.gguf); see `cachet models list`",
                names.join(", ")
            ),
        })
    }

    /// Where the model's file is (or will be, once pulled) under `dir`.
    pub fn local_path(&self, dir: &Path) -> PathBuf {
        match self {
            Resolved::Path(p) => p.clone(),
            Resolved::Catalogue(name) => dir.join(find(name).map_or_else(String::new, |e| (e.spec)().file_name)),
            Resolved::Hub(file) => file.local_path(dir),
        }
    }
}

/// Turns `name` into the path of a verified model file, downloading it into
/// `dir` first if it is a catalogue model or a hub file (idempotent).
pub fn resolve(name: &str, dir: &Path, progress: Progress) -> Result<PathBuf, PullError> {
    match Resolved::parse(name)? {
        Resolved::Path(path) => Ok(path),
        Resolved::Catalogue(name) => {
            let spec = (find(name).map(|e| e.spec).unwrap_or(ModelSpec::default_model))();
            pull(&spec, dir, &PullOptions { progress, ..Default::default() })
        }
        Resolved::Hub(file) => hf::pull(&file, dir, &HfOptions { progress, ..HfOptions::default() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve() {
        assert_eq!(Resolved::parse("default").unwrap(), Resolved::Catalogue("qwen2.5-coder-0.5b"));
        assert_eq!(Resolved::parse("Qwen2.5-Coder-1.5B").unwrap(), Resolved::Catalogue("qwen2.5-coder-1.5b"));
        assert!(matches!(Resolved::parse("hf:a/b/c.gguf").unwrap(), Resolved::Hub(_)));
        let here = std::env::temp_dir();
        assert_eq!(Resolved::parse(&here.display().to_string()).unwrap(), Resolved::Path(here));
        let e = Resolved::parse("qwen9-giant").unwrap_err().to_string();
        assert!(e.contains("cachet models list") && e.contains("qwen2.5-coder-1.5b"), "{e}");
        let names: std::collections::HashSet<_> = CATALOGUE.iter().map(|e| (e.spec)().file_name).collect();
        assert_eq!(names.len(), CATALOGUE.len(), "every catalogue model has its own file");
    }
}
