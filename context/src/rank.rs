//! Ranking files by how much the rest of the repository refers to them, in the spirit of Aider's
//! repo map: a reference graph between files and PageRank over it.
//!
//! Deterministic: nodes are files in path order, edges are accumulated in sorted order, and the
//! iteration count is fixed, so the same inputs give bit-identical ranks.

use std::collections::BTreeMap;

use crate::outline::FileAnalysis;

const DAMPING: f64 = 0.85;
const ITERATIONS: usize = 40;
/// Names defined in more files than this are common (`new`, `run`, `get`) and count less.
const COMMON_DEFINERS: usize = 5;

/// The rank of each file (same order as `files`, which must be sorted by path). Ranks sum to 1.
pub(crate) fn rank(files: &[(&str, &FileAnalysis)]) -> Vec<f64> {
    let n = files.len();
    if n == 0 {
        return Vec::new();
    }
    let edges = reference_edges(files);
    let out_weight: Vec<f64> = edges.iter().map(|e| e.iter().map(|(_, w)| w).sum()).collect();
    let uniform = 1.0 / n as f64;
    let mut rank = vec![uniform; n];
    let mut next = vec![0.0; n];
    for _ in 0..ITERATIONS {
        let mut dangling = 0.0;
        next.iter_mut().for_each(|x| *x = 0.0);
        for (i, out) in edges.iter().enumerate() {
            if out_weight[i] > 0.0 {
                let share = DAMPING * rank[i] / out_weight[i];
                for &(j, w) in out {
                    next[j] += share * w;
                }
            } else {
                dangling += rank[i];
            }
        }
        let base = (1.0 - DAMPING) * uniform + DAMPING * dangling * uniform;
        for (r, x) in rank.iter_mut().zip(&next) {
            *r = base + x;
        }
    }
    rank
}

/// For each file, its weighted edges to the files defining what it references, sorted by target.
fn reference_edges(files: &[(&str, &FileAnalysis)]) -> Vec<Vec<(usize, f64)>> {
    let mut definers: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, (_, a)) in files.iter().enumerate() {
        for name in &a.defines {
            definers.entry(name.as_str()).or_default().push(i);
        }
    }
    let mut edges = Vec::with_capacity(files.len());
    for (i, (_, a)) in files.iter().enumerate() {
        let mut out: BTreeMap<usize, f64> = BTreeMap::new();
        for (name, count) in &a.references {
            let Some(defs) = definers.get(name.as_str()) else { continue };
            let weight = name_weight(name, defs.len()) * f64::from(*count).sqrt();
            for &j in defs.iter().filter(|&&j| j != i) {
                *out.entry(j).or_default() += weight;
            }
        }
        edges.push(out.into_iter().collect());
    }
    edges
}

/// How much a reference to `name` says about the files defining it: specific names (long compound
/// names) say more; private, very short and commonly defined names say less.
fn name_weight(name: &str, definer_count: usize) -> f64 {
    let mut w = 1.0;
    let compound = name.contains('_') || (name.chars().any(char::is_lowercase) && name.chars().any(char::is_uppercase));
    if name.len() >= 8 && compound {
        w *= 10.0;
    }
    if name.starts_with('_') {
        w *= 0.1;
    }
    if name.chars().count() <= 2 {
        w *= 0.1;
    }
    if definer_count > COMMON_DEFINERS {
        w *= 0.1;
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(defines: &[&str], refs: &[(&str, u32)]) -> FileAnalysis {
        FileAnalysis {
            lang: None,
            outline: String::new(),
            entries: Vec::new(),
            defines: defines.iter().map(|s| s.to_string()).collect(),
            references: refs.iter().map(|(s, n)| (s.to_string(), *n)).collect(),
        }
    }

    #[test]
    fn referenced_file_ranks_highest() {
        let core = file(&["RepoStore"], &[]);
        let a = file(&["alpha"], &[("RepoStore", 3)]);
        let b = file(&["beta"], &[("RepoStore", 1), ("alpha", 1)]);
        let lonely = file(&["gamma"], &[]);
        let files = [("a.rs", &a), ("b.rs", &b), ("core.rs", &core), ("lonely.rs", &lonely)];
        let r = rank(&files);
        assert!(r[2] > r[0] && r[0] > r[3], "{r:?}");
        assert!((r.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        assert_eq!(r, rank(&files));
    }
}
