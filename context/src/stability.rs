//! The stability estimate: how likely a block is to change at the next push, from its history.

use serde::Serialize;

use crate::context::SegmentKind;

/// The parameters of the stability score. Blocks are ordered by ascending score (ties by path):
///
/// `score = kind_weight × Σ_changes 0.5^(age / half_life) + body_edit_weight × Σ_body_edits 0.5^(age / half_life)
///          + recency_weight × 0.5^(last_age / recency_half_life)`
///
/// where a block's changes are the commits that changed its text, and an outline block's body
/// edits the commits that edited its file but left the outline as it was;
/// ages count first-parent commits back from the context's commit, `kind_weight` is
/// `outline_weight` for outline blocks and 1 for full files, and the recency term is 0 for a path
/// that did not change in the window. With `size_aware`, the score is divided by the block's token
/// count, so that among equally (un)stable blocks the larger ones come first (the expected reusable
/// prefix is larger that way).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct StabilityModel {
    /// Half-life of a change's weight, in commits (`f64::INFINITY`: plain change count).
    pub half_life: f64,
    /// Weight of an outline block's changes relative to a full file's (an edit inside a function
    /// body leaves the outline unchanged).
    pub outline_weight: f64,
    /// Weight of the recency term.
    pub recency_weight: f64,
    /// Half-life of the recency term, in commits.
    pub recency_half_life: f64,
    /// Prior added to every score before dividing by the block's tokens; `None` keeps scores as is.
    pub size_prior: Option<f64>,
    /// Keys from the history before the current epoch only, blocks changed in the epoch last
    /// (see [`crate::history::history`]); `false`: keys from the whole history up to the commit.
    pub epochs: bool,
    /// Scores quantised into this many tiers per doubling, blocks of one tier by path: scores
    /// drift as commits age every change, and two unrelated blocks whose scores cross swap places
    /// (which breaks the reusable prefix at the first of them); in tiers they swap only when one
    /// crosses a tier boundary. `None`: exact scores.
    pub tiers_per_doubling: Option<f64>,
    /// Weight of an outline block's body edits (which leave its text, and so the reusable prefix,
    /// as it was).
    pub body_edit_weight: f64,
}

impl StabilityModel {
    /// The model [`crate::Order::Stability`] uses: change count with a slow decay (half-life 200
    /// commits), divided by the block's size with a small prior, no epochs. Chosen by replaying
    /// real and synthetic histories (`docs/context.md`): faster decay, epochs, outline weights
    /// below 1 and a recency term all measured worse on the real history; without the size term
    /// the real history lost half its reusable prefix.
    pub const DEFAULT: StabilityModel = StabilityModel {
        half_life: 200.0,
        outline_weight: 1.0,
        recency_weight: 0.0,
        recency_half_life: 10.0,
        size_prior: Some(0.05),
        epochs: false,
        tiers_per_doubling: None,
        body_edit_weight: 0.0,
    };

    /// The score of a block (lower = more stable = earlier).
    pub(crate) fn score(&self, ages: &[u32], body_edits: &[u32], kind: SegmentKind, tokens: usize) -> f64 {
        let decayed: f64 = ages.iter().map(|&a| decay(a, self.half_life)).sum();
        let body: f64 = body_edits.iter().map(|&a| decay(a, self.half_life)).sum();
        let kind_weight = if kind == SegmentKind::Outline { self.outline_weight } else { 1.0 };
        let recency = ages.first().map_or(0.0, |&a| decay(a, self.recency_half_life));
        let score = kind_weight * decayed + self.body_edit_weight * body + self.recency_weight * recency;
        let score = match self.size_prior {
            Some(prior) => (score + prior) / tokens.max(1) as f64,
            None => score,
        };
        match self.tiers_per_doubling {
            Some(k) if k > 0.0 && score > 0.0 => (score.log2() * k).floor(),
            _ => score,
        }
    }
}

impl Default for StabilityModel {
    fn default() -> Self {
        Self::DEFAULT
    }
}

fn decay(age: u32, half_life: f64) -> f64 {
    if half_life.is_infinite() {
        1.0
    } else {
        0.5f64.powf(f64::from(age) / half_life.max(1e-9))
    }
}
