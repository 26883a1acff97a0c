//! Replays a history and prints how much of the context each order keeps reusable, for the default
//! stability model and a set of variants.
//!
//! ```text
//! cargo run -p cachet-context --example replay -- --repo PATH [BRANCH] [--commits 300] [--budget 8192] [--depth 500]
//! cargo run -p cachet-context --example replay -- --synth FILES COMMITS SEED [ROTATION] [--commits 300]
//! ```

#[path = "../tests/common/synth.rs"]
mod synth;

use std::time::Instant;

use cachet_context::replay::{replay_with, StabilityModel};
use cachet_context::testing::TestRepo;
use cachet_context::{CommitId, ContextOptions, Mirror, Order, TokenCounter};

/// A stand-in for a byte-level BPE pre-tokenizer: runs of letters/digits (split every 6 chars),
/// single punctuation, whitespace runs; ids are hashes, so equal text gives equal tokens.
struct PreTokens;

impl TokenCounter for PreTokens {
    fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        let mut cur = String::new();
        let mut class = 0u8;
        for c in text.chars() {
            let k = if c.is_alphanumeric() || c == '_' {
                1
            } else if c.is_whitespace() {
                2
            } else {
                3
            };
            if !cur.is_empty() && (k != class || k == 3 || (k == 1 && cur.len() >= 6)) {
                out.push(hash(&cur));
                cur.clear();
            }
            class = k;
            cur.push(c);
        }
        if !cur.is_empty() {
            out.push(hash(&cur));
        }
        out
    }
}

fn hash(s: &str) -> u32 {
    s.bytes().fold(0x811c9dc5u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x01000193))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| args.iter().position(|a| a == name).map(|i| args[i + 1..].to_vec());
    let commits: usize = flag("--commits").map_or(300, |v| v[0].parse().unwrap());
    let budget: usize = flag("--budget").map_or(8192, |v| v[0].parse().unwrap());
    let depth: usize = flag("--depth").map_or(500, |v| v[0].parse().unwrap());
    let _keep;
    let (mirror, head): (Mirror, CommitId) = if let Some(v) = flag("--repo") {
        let m = Mirror::open_path(std::path::Path::new(&v[0])).unwrap();
        let head = m.resolve(v.get(1).map_or("main", String::as_str)).unwrap();
        (m, head)
    } else {
        let v = flag("--synth").expect("--repo PATH or --synth FILES COMMITS SEED");
        let dir = tempfile::tempdir().unwrap();
        let repo = TestRepo::init(dir.path()).unwrap();
        let t = Instant::now();
        let rotation = v.get(3).and_then(|r| r.parse().ok()).unwrap_or(0.15);
        let head = synth::synthetic_repo_with(
            &repo,
            v[0].parse().unwrap(),
            v[1].parse().unwrap(),
            v[2].parse().unwrap(),
            rotation,
        );
        eprintln!("synthetic repository written in {:.1?}", t.elapsed());
        let m = Mirror::open_path(repo.path()).unwrap();
        _keep = dir;
        (m, head)
    };
    let variants = cachet_context::replay::variants();
    let models: Vec<StabilityModel> = variants.iter().map(|(_, m)| *m).collect();
    let opts = ContextOptions { budget_tokens: budget, history_depth: depth, ..ContextOptions::default() };
    let t = Instant::now();
    let reports = replay_with(&mirror, &head, commits, &opts, &PreTokens, &models).unwrap();
    eprintln!("replay of {commits} commits with {} models in {:.1?}", models.len(), t.elapsed());
    println!("{}", reports[0].markdown());
    let shares = |r: &cachet_context::replay::ReplayRow, o: Order| *r.orders.iter().find(|s| s.order == o).unwrap();
    let lost: Vec<_> = reports[0]
        .rows
        .iter()
        .filter(|r| shares(r, Order::Stability).token_prefix + 1e-9 < shares(r, Order::Stability).block_prefix)
        .collect();
    let n = reports[0].rows.len().max(1);
    eprintln!(
        "mean context tokens: {:.0}",
        reports[0].rows.iter().map(|r| r.context_tokens).sum::<usize>() as f64 / n as f64
    );
    eprintln!(
        "stability rows where the token prefix ends before the first changed block: {} ({} with a selection change)",
        lost.len(),
        lost.iter().filter(|r| r.selection_changed).count()
    );
    println!("{}", cachet_context::replay::variants_markdown(&variants, &reports));
}
