//! Replay measurement: how much of the repository context stays reusable across the pushes of a
//! real history, per block order.
//!
//! For each of the last `commits` first-parent commits C (with parent P) the context is built at P
//! in every order (the same blocks), and the paths changed from P to C are taken. When a changed
//! path is in P's context, two shares of P's context tokens are recorded per order:
//! - `block_prefix`: the tokens before the first block whose path changed;
//! - `token_prefix`: the longest common token prefix of the contexts at P and at C (same order) —
//!   what a prefix cache can actually reuse;
//! - `text_block_prefix`: the tokens before the first block whose *text* changed (or that left the
//!   context): `block_prefix` counts an outline as changed at every edit of its file, even one
//!   inside a function body that leaves the outline, and so its cached K/V, as it was.
//!
//! Each row also records a *hindsight* block prefix: P's blocks ordered by how many commits of the
//! whole replayed window (the future included) change their path, fewest first (larger blocks
//! first among equals) — a static order no model of the past can beat by much, which bounds what
//! any order can reach on `block_prefix` for this history and budget.
//!
//! Commits that change no path in the context are counted but have no row. Rows where the
//! rendered context did not change at all (e.g. a body-only edit of a file shown as an outline)
//! have a token prefix of 100% in every order; the summary also gives the token prefix over the
//! rows where it did change.

mod report;

use std::collections::{HashMap, HashSet};

pub use report::{Break, OrderShares, OrderSummary, ReplayReport, ReplayRow};

use crate::builder::{arrange, Prepared};
use crate::token_cache::Tokens;
use crate::{
    CommitId, ContextBuilder, ContextError, ContextOptions, DefinitionsVisible, Mirror, Order, RepoContext,
    TokenCounter,
};

pub use crate::stability::StabilityModel;

/// [`replay_with`] with [`StabilityModel::DEFAULT`].
pub fn replay(
    mirror: &Mirror,
    head: &CommitId,
    commits: usize,
    opts: &ContextOptions,
    tok: &dyn TokenCounter,
) -> Result<ReplayReport, ContextError> {
    replay_with(mirror, head, commits, opts, tok, &[StabilityModel::DEFAULT]).map(|mut r| r.remove(0))
}

/// Replays the history once and scores every stability model in `models` on it (path and
/// last-change orders do not depend on the model). One report per model, in the same order.
pub fn replay_with(
    mirror: &Mirror,
    head: &CommitId,
    commits: usize,
    opts: &ContextOptions,
    tok: &dyn TokenCounter,
    models: &[StabilityModel],
) -> Result<Vec<ReplayReport>, ContextError> {
    let repo = mirror.repo()?;
    let builder = ContextBuilder::new(1 << 20);
    let named = Named(tok);
    let tokens = Tokens::new(&named, builder.token_cache());
    let chain = mirror.first_parent(head, commits.saturating_add(1))?;
    let mut reports: Vec<ReplayReport> = models.iter().map(|m| ReplayReport::new(head, *m)).collect();
    let definitions = DefinitionsVisible::of(&builder.definitions(mirror, head, opts, &named)?);
    reports.iter_mut().for_each(|r| r.definitions = definitions);
    let mut changes = Vec::with_capacity(chain.len().saturating_sub(1));
    let mut counts: HashMap<String, usize> = HashMap::new();
    for pair in chain.windows(2) {
        let changed: HashSet<String> = mirror.changed_paths(&pair[1], &pair[0])?.into_iter().map(|c| c.path).collect();
        for p in &changed {
            *counts.entry(p.clone()).or_default() += 1;
        }
        changes.push(changed);
    }
    let mut newer: Option<(CommitId, Prepared)> = None;
    for (pair, changed) in chain.windows(2).zip(changes) {
        let (child, parent) = (&pair[0], &pair[1]);
        let at_child = match newer.take() {
            Some((id, p)) if &id == child => p,
            _ => builder.prepare(&repo, child, opts, &tokens)?,
        };
        let at_parent = builder.prepare(&repo, parent, opts, &tokens)?;
        let affected = at_parent.blocks.iter().filter(|b| b.path.as_ref().is_some_and(|p| changed.contains(p))).count();
        let ages_parent = builder.block_ages(&repo, parent, opts.history_depth, &at_parent)?;
        let ages_child = builder.block_ages(&repo, child, opts.history_depth, &at_child)?;
        for (report, model) in reports.iter_mut().zip(models) {
            report.commits_examined += 1;
            if affected == 0 {
                continue;
            }
            let mut row = ReplayRow::new(child, parent, changed.len(), affected);
            row.hindsight_block_prefix = hindsight_prefix(&at_parent, &changed, &counts);
            let (sel_p, sel_c) = (selection_key(&at_parent, &changed), selection_key(&at_child, &changed));
            row.selection_changed = sel_p != sel_c;
            row.selection_diff = sel_p
                .iter()
                .filter(|x| !sel_c.contains(x))
                .map(|(p, k)| format!("-{p} ({k:?})"))
                .chain(sel_c.iter().filter(|x| !sel_p.contains(x)).map(|(p, k)| format!("+{p} ({k:?})")))
                .collect();
            for order in Order::ALL {
                let before = arrange(parent, &at_parent, order, Some(&ages_parent), model);
                let after = arrange(child, &at_child, order, Some(&ages_child), model);
                if order == Order::Path {
                    row.context_changed = before.text != after.text;
                }
                let common = common_prefix(&before.tokens, &after.tokens);
                let cause = break_cause(&before, &after, common, &changed);
                let shares = [block_prefix(&before, &changed), common, text_block_prefix(&before, &after)];
                row.push(order, &before, shares, cause);
            }
            report.rows.push(row);
        }
        newer = Some((parent.clone(), at_parent));
    }
    for r in &mut reports {
        r.summarize();
    }
    Ok(reports)
}

/// The (path, kind) of the blocks of unchanged files.
fn selection_key(p: &Prepared, changed: &HashSet<String>) -> Vec<(String, crate::SegmentKind)> {
    let mut v: Vec<_> = p
        .blocks
        .iter()
        .filter_map(|b| b.path.as_ref().filter(|p| !changed.contains(*p)).map(|p| (p.clone(), b.kind)))
        .collect();
    v.sort();
    v
}

/// Named stability models to compare with [`replay_with`]: the default and variations of it.
pub fn variants() -> Vec<(&'static str, StabilityModel)> {
    let d = StabilityModel::DEFAULT;
    vec![
        ("default", d),
        ("half-life 25", StabilityModel { half_life: 25.0, ..d }),
        ("half-life 100", StabilityModel { half_life: 100.0, ..d }),
        ("no decay (count)", StabilityModel { half_life: f64::INFINITY, ..d }),
        ("outline weight 0.5", StabilityModel { outline_weight: 0.5, ..d }),
        ("+ recency 1.0/10", StabilityModel { recency_weight: 1.0, recency_half_life: 10.0, ..d }),
        ("no body edits (before 2026-12-05)", StabilityModel { body_edit_weight: 0.0, ..d }),
        ("lazy body edits 0.25", StabilityModel { body_edit_weight: 0.25, ..d }),
        ("lazy body edits 1", StabilityModel { body_edit_weight: 1.0, ..d }),
        ("lazy body edits 2", StabilityModel { body_edit_weight: 2.0, ..d }),
        ("eager body edits 0.1", StabilityModel { body_edit_weight: 0.1, lazy_body_edits: false, ..d }),
        ("eager body edits 0.25", StabilityModel { body_edit_weight: 0.25, lazy_body_edits: false, ..d }),
        ("eager body edits 0.5", StabilityModel { body_edit_weight: 0.5, lazy_body_edits: false, ..d }),
        ("eager body edits 1", StabilityModel { body_edit_weight: 1.0, lazy_body_edits: false, ..d }),
        ("size prior 0.5, no body edits", StabilityModel { body_edit_weight: 0.0, size_prior: Some(0.5), ..d }),
        ("size prior 0.5", StabilityModel { size_prior: Some(0.5), ..d }),
        ("size prior 0.2", StabilityModel { size_prior: Some(0.2), ..d }),
        ("size prior 2", StabilityModel { size_prior: Some(2.0), ..d }),
        ("no size", StabilityModel { size_prior: None, ..d }),
        ("epochs", StabilityModel { epochs: true, ..d }),
        ("tiers 1/doubling", StabilityModel { tiers_per_doubling: Some(1.0), ..d }),
        ("tiers 2/doubling", StabilityModel { tiers_per_doubling: Some(2.0), ..d }),
        ("tiers 4/doubling", StabilityModel { tiers_per_doubling: Some(4.0), ..d }),
        (
            "epochs, half-life 25, size prior 0.5",
            StabilityModel { epochs: true, half_life: 25.0, size_prior: Some(0.5), ..d },
        ),
    ]
}

/// A table comparing the stability order of each variant with path order (medians and the mean
/// token prefix; "× path" is the ratio to path order's).
pub fn variants_markdown(variants: &[(&str, StabilityModel)], reports: &[ReplayReport]) -> String {
    let mut out = String::from(
        "| stability variant | before first changed block | × path | token prefix when the text changed | × path \
         | token prefix mean | × path |\n|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for ((name, _), r) in variants.iter().zip(reports) {
        let (Some(s), Some(p)) = (r.summary_of(Order::Stability), r.summary_of(Order::Path)) else { continue };
        let ratio = |a: f64, b: f64| if b > 0.0 { format!("{:.2}", a / b) } else { "-".into() };
        out.push_str(&format!(
            "| {name} | {:.1}% | {} | {:.1}% | {} | {:.1}% | {} |\n",
            100.0 * s.block_prefix_median,
            ratio(s.block_prefix_median, p.block_prefix_median),
            100.0 * s.changed_token_prefix_median,
            ratio(s.changed_token_prefix_median, p.changed_token_prefix_median),
            100.0 * s.token_prefix_mean,
            ratio(s.token_prefix_mean, p.token_prefix_mean),
        ));
    }
    out
}

/// Tokens before the first block whose path changed.
fn block_prefix(ctx: &RepoContext, changed: &HashSet<String>) -> usize {
    ctx.segments
        .iter()
        .find(|s| s.path.as_ref().is_some_and(|p| changed.contains(p)))
        .map_or(ctx.tokens.len(), |s| s.tokens.start)
}

/// Tokens before the first block of `before` whose text `after` does not have for its path.
fn text_block_prefix(before: &RepoContext, after: &RepoContext) -> usize {
    before
        .segments
        .iter()
        .find(|s| s.path.as_deref().is_some_and(|p| text_of(after, p) != Some(before.segment_text(s))))
        .map_or(before.tokens.len(), |s| s.tokens.start)
}

/// The share of `p`'s tokens before the first changed block when its blocks are ordered in
/// hindsight: by the number of the window's commits that change their path (fewest first), larger
/// blocks first among equals, then by path; the header first as always.
fn hindsight_prefix(p: &Prepared, changed: &HashSet<String>, counts: &HashMap<String, usize>) -> f64 {
    let count = |b: &crate::context::Block| b.path.as_ref().and_then(|p| counts.get(p)).copied().unwrap_or(0);
    let mut blocks: Vec<_> = p.blocks.iter().collect();
    blocks.sort_by(|a, b| {
        count(a).cmp(&count(b)).then(b.tokens.len().cmp(&a.tokens.len())).then_with(|| a.path.cmp(&b.path))
    });
    let header: usize = p.header.iter().map(|b| b.tokens.len()).sum();
    let total = header + blocks.iter().map(|b| b.tokens.len()).sum::<usize>();
    let before = header
        + blocks
            .iter()
            .take_while(|b| !b.path.as_ref().is_some_and(|p| changed.contains(p)))
            .map(|b| b.tokens.len())
            .sum::<usize>();
    if total == 0 {
        0.0
    } else {
        before as f64 / total as f64
    }
}

/// The text of `path`'s block in `c`.
fn text_of<'a>(c: &'a RepoContext, path: &str) -> Option<&'a str> {
    c.segments.iter().find(|s| s.path.as_deref() == Some(path)).map(|s| c.segment_text(s))
}

/// Why the common token prefix of `before` and `after` ends at token `at`: the block of `before`
/// there, against what `after` has in its place. `None` when it does not end (`before` is a prefix
/// of `after`).
fn break_cause(before: &RepoContext, after: &RepoContext, at: usize, changed: &HashSet<String>) -> Option<Break> {
    let at_of = |c: &RepoContext| c.segments.iter().position(|s| s.tokens.contains(&at));
    let b = &before.segments[at_of(before)?];
    let a = at_of(after).map(|j| &after.segments[j]);
    let Some(path) = &b.path else { return Some(Break::Header) };
    let a_path = a.and_then(|a| a.path.as_deref());
    if changed.contains(path) || a_path.is_some_and(|p| changed.contains(p)) {
        // This block changed, or a changed file's block now stands in its place.
        return Some(Break::ChangedFile);
    }
    match (text_of(after, path), a_path.map(|p| text_of(before, p))) {
        (None, _) | (_, Some(None)) => Some(Break::Selection),
        (Some(t), _) if t != before.segment_text(b) => Some(Break::UnchangedFileText),
        _ => Some(Break::Moved),
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Gives the caller's tokenizer a cache id for the replay's private builder, so that blocks are
/// tokenized once across all the commits replayed.
struct Named<'a>(&'a dyn TokenCounter);

impl TokenCounter for Named<'_> {
    fn encode(&self, text: &str) -> Vec<u32> {
        self.0.encode(text)
    }
    fn cache_id(&self) -> Option<String> {
        Some("replay".to_string())
    }
}
