//! The replay's results: one row per commit that changed the context, and per-order summaries.

use std::fmt::Write;

use serde::Serialize;

use crate::stability::StabilityModel;
use crate::{CommitId, DefinitionsVisible, Order, RepoContext};

/// The result of a replay.
#[derive(Clone, Debug, Serialize)]
pub struct ReplayReport {
    /// The newest commit replayed.
    pub head: CommitId,
    /// The stability model the `stability` order used.
    pub model: StabilityModel,
    /// Commits replayed (each against its first parent).
    pub commits_examined: usize,
    /// One row per replayed commit that changed a path in its parent's context.
    pub rows: Vec<ReplayRow>,
    /// Per order: medians and means over `rows`.
    pub summary: Vec<OrderSummary>,
    /// At the head commit: of the definitions other files reference, how many the context shows.
    pub definitions: DefinitionsVisible,
}

/// One replayed commit.
#[derive(Clone, Debug, Serialize)]
pub struct ReplayRow {
    /// The commit (C).
    pub commit: CommitId,
    /// Its first parent (P), where the context was built.
    pub parent: CommitId,
    /// Paths changed from P to C.
    pub changed_paths: usize,
    /// Blocks of P's context whose path changed.
    pub changed_blocks: usize,
    /// Tokens of P's context.
    pub context_tokens: usize,
    /// Whether the context at C includes a different set of unchanged files (or the same files as
    /// different kinds of block) than at P: a knock-on effect of ranking or of a changed file's size.
    pub selection_changed: bool,
    /// The blocks of unchanged files that left (`-path (Kind)`) or entered (`+path (Kind)`) the
    /// context.
    pub selection_diff: Vec<String>,
    /// Whether the rendered context (in path order) differs between P and C. When it does not,
    /// every order keeps 100% of its tokens.
    pub context_changed: bool,
    /// The share of P's tokens before the first changed block with P's blocks in hindsight order
    /// (see the module's documentation): a bound on `block_prefix` for any order.
    pub hindsight_block_prefix: f64,
    /// The reusable shares per order.
    pub orders: Vec<OrderShares>,
}

/// The reusable shares of one order at one commit, as fractions of P's context tokens.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct OrderShares {
    /// The order.
    pub order: Order,
    /// Tokens before the first block whose path changed.
    pub block_prefix: f64,
    /// Longest common token prefix of the contexts at P and C.
    pub token_prefix: f64,
    /// Tokens before the first block whose text changed (or that left the context).
    pub text_block_prefix: f64,
    /// Why the common token prefix ends where it does (`None`: the contexts are equal).
    pub cause: Option<Break>,
}

/// What ends the reusable token prefix after a push: the block at that point in P's context.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Break {
    /// The header (the file list).
    Header,
    /// A block of a file the push changed (or such a block that moved up into its place).
    ChangedFile,
    /// A block of an unchanged file whose text changed (an outline showing what other files
    /// reference, or a cap that moved with the budget).
    UnchangedFileText,
    /// The same blocks in another order: an unchanged block moved.
    Moved,
    /// A block of an unchanged file entered or left the context.
    Selection,
}

impl Break {
    /// All causes, in report order.
    pub const ALL: [Break; 5] =
        [Break::Header, Break::ChangedFile, Break::UnchangedFileText, Break::Moved, Break::Selection];

    /// The cause as the report names it.
    pub fn name(self) -> &'static str {
        match self {
            Break::Header => "header",
            Break::ChangedFile => "changed file",
            Break::UnchangedFileText => "unchanged file's text",
            Break::Moved => "moved block",
            Break::Selection => "selection",
        }
    }
}

/// Medians and means of one order's shares over all rows.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct OrderSummary {
    /// The order.
    pub order: Order,
    /// Median of `block_prefix`.
    pub block_prefix_median: f64,
    /// Mean of `block_prefix`.
    pub block_prefix_mean: f64,
    /// Median of `token_prefix`.
    pub token_prefix_median: f64,
    /// Mean of `token_prefix`.
    pub token_prefix_mean: f64,
    /// Median of `token_prefix` over the rows whose rendered context changed.
    pub changed_token_prefix_median: f64,
    /// Mean of `token_prefix` over the rows whose rendered context changed.
    pub changed_token_prefix_mean: f64,
    /// Median of `text_block_prefix`.
    pub text_block_prefix_median: f64,
    /// Mean of `text_block_prefix`.
    pub text_block_prefix_mean: f64,
}

impl ReplayReport {
    pub(crate) fn new(head: &CommitId, model: StabilityModel) -> Self {
        ReplayReport {
            head: head.clone(),
            model,
            commits_examined: 0,
            rows: Vec::new(),
            summary: Vec::new(),
            definitions: DefinitionsVisible::default(),
        }
    }

    pub(crate) fn summarize(&mut self) {
        self.summary = Order::ALL
            .iter()
            .map(|&order| {
                let pick = |f: fn(&OrderShares) -> f64, only_changed: bool| -> Vec<f64> {
                    let rows = self.rows.iter().filter(|r| r.context_changed || !only_changed);
                    rows.flat_map(|r| r.orders.iter().filter(|s| s.order == order).map(f)).collect()
                };
                let blocks = pick(|s| s.block_prefix, false);
                let tokens = pick(|s| s.token_prefix, false);
                let changed = pick(|s| s.token_prefix, true);
                let text = pick(|s| s.text_block_prefix, false);
                OrderSummary {
                    order,
                    block_prefix_median: median(&blocks),
                    block_prefix_mean: mean(&blocks),
                    token_prefix_median: median(&tokens),
                    token_prefix_mean: mean(&tokens),
                    changed_token_prefix_median: median(&changed),
                    changed_token_prefix_mean: mean(&changed),
                    text_block_prefix_median: median(&text),
                    text_block_prefix_mean: mean(&text),
                }
            })
            .collect();
    }

    /// The summary of one order.
    pub fn summary_of(&self, order: Order) -> Option<&OrderSummary> {
        self.summary.iter().find(|s| s.order == order)
    }

    /// A Markdown table of the summary.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "Replay of {} commits from {}: {} changed a file in the context, {} changed its text, {} changed which \
             other files it holds.\n",
            self.commits_examined,
            short(&self.head),
            self.rows.len(),
            self.rows.iter().filter(|r| r.context_changed).count(),
            self.rows.iter().filter(|r| r.selection_changed).count()
        );
        let d = &self.definitions;
        let _ = writeln!(
            s,
            "Definitions visible at {}: {} of the {} definitions other files reference ({:.1}%).\n",
            short(&self.head),
            d.visible,
            d.referenced,
            100.0 * d.share()
        );
        s.push_str("Shares of the parent's context tokens that stay reusable (median / mean):\n\n");
        s.push_str(
            "| order | before first changed block | before first block whose text changed | token prefix \
             | token prefix when the text changed |\n",
        );
        s.push_str("|---|---:|---:|---:|---:|\n");
        let pct = |m: f64, a: f64| format!("{:.1}% / {:.1}%", 100.0 * m, 100.0 * a);
        for o in &self.summary {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} |",
                o.order.name(),
                pct(o.block_prefix_median, o.block_prefix_mean),
                pct(o.text_block_prefix_median, o.text_block_prefix_mean),
                pct(o.token_prefix_median, o.token_prefix_mean),
                pct(o.changed_token_prefix_median, o.changed_token_prefix_mean)
            );
        }
        let hindsight: Vec<f64> = self.rows.iter().map(|r| r.hindsight_block_prefix).collect();
        let _ = writeln!(
            s,
            "| (hindsight: fewest changes in the window first) | {} | | | |",
            pct(median(&hindsight), mean(&hindsight))
        );
        s.push_str("\nWhere the token prefix ends when the text changed (commits):\n\n| order |");
        for b in Break::ALL {
            let _ = write!(s, " {} |", b.name());
        }
        s.push_str("\n|---|");
        s.push_str(&"---:|".repeat(Break::ALL.len()));
        for o in &self.summary {
            let _ = write!(s, "\n| {} |", o.order.name());
            for b in Break::ALL {
                let n = self
                    .rows
                    .iter()
                    .filter(|r| r.context_changed)
                    .filter(|r| r.orders.iter().any(|x| x.order == o.order && x.cause == Some(b)))
                    .count();
                let _ = write!(s, " {n} |");
            }
        }
        s.push('\n');
        s
    }
}

impl ReplayRow {
    pub(crate) fn new(commit: &CommitId, parent: &CommitId, changed_paths: usize, changed_blocks: usize) -> Self {
        ReplayRow {
            commit: commit.clone(),
            parent: parent.clone(),
            changed_paths,
            changed_blocks,
            context_tokens: 0,
            selection_changed: false,
            selection_diff: Vec::new(),
            context_changed: false,
            hindsight_block_prefix: 0.0,
            orders: Vec::new(),
        }
    }

    pub(crate) fn push(
        &mut self,
        order: Order,
        before: &RepoContext,
        [block_prefix, token_prefix, text_block_prefix]: [usize; 3],
        cause: Option<Break>,
    ) {
        let total = before.tokens.len();
        self.context_tokens = total;
        let share = |n: usize| if total == 0 { 0.0 } else { n as f64 / total as f64 };
        self.orders.push(OrderShares {
            order,
            block_prefix: share(block_prefix),
            token_prefix: share(token_prefix),
            text_block_prefix: share(text_block_prefix),
            cause,
        });
    }
}

fn short(c: &CommitId) -> &str {
    c.0.get(..12).unwrap_or(&c.0)
}

fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        0.0
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}
