//! The stability estimate: how likely a block is to change at the next push, from its history.

use serde::Serialize;

use crate::context::SegmentKind;

/// The parameters of the stability score. Blocks are ordered by ascending score (ties by path):
///
/// `score = kind_weight × Σ_changes 0.5^(age / half_life) + body_edit_weight × Σ_body_edits 0.5^(age / half_life)
///          + recency_weight × 0.5^(last_age / recency_half_life)`
///
/// where a block's changes are the commits that changed its text, and an outline block's body
/// edits the commits that edited its file but left the outline as it was (with
/// `lazy_body_edits`, only those before its last text change);
/// ages count first-parent commits back from the context's commit, `kind_weight` is
/// `outline_weight` for outline blocks and 1 for full files, and the recency term is 0 for a path
/// that did not change in the window. With a `size_prior`, the score plus the prior is divided by
/// the block's token count, so that among equally (un)stable blocks the larger ones come first
/// (the expected reusable prefix is larger that way).
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
    /// (see `history::history`); `false`: keys from the whole history up to the commit.
    pub epochs: bool,
    /// Scores quantised into this many tiers per doubling, blocks of one tier by path: scores
    /// drift as commits age every change, and two unrelated blocks whose scores cross swap places
    /// (which breaks the reusable prefix at the first of them); in tiers they swap only when one
    /// crosses a tier boundary. `None`: exact scores.
    pub tiers_per_doubling: Option<f64>,
    /// Weight of an outline block's body edits (which leave its text, and so the reusable prefix,
    /// as it was).
    pub body_edit_weight: f64,
    /// Counts only the body edits older than the block's last text change (none when its text did
    /// not change in the window): a body-only edit then never moves the block by itself (the move
    /// would break the reusable prefix where it was); the edits since weigh in when its text next
    /// changes, when the block is re-rendered anyway.
    pub lazy_body_edits: bool,
}

impl StabilityModel {
    /// The model [`crate::Order::Stability`] uses: change count with a slow decay (half-life 200
    /// commits), an outline's body edits at half weight counted lazily (only those before its last
    /// text change), divided by the block's size with a small prior, no epochs. Chosen by replaying
    /// real and synthetic histories (`docs/context.md`): faster decay, epochs, outline weights
    /// below 1 and a recency term all measured worse on the real history; without the size term
    /// the real history lost half its reusable prefix; body edits counted at once (each body-only
    /// edit moving its block) lowered the mean reusable token prefix by 3–12 points, counted
    /// lazily they raised the share before the first changed block without lowering it.
    pub const DEFAULT: StabilityModel = StabilityModel {
        half_life: 200.0,
        outline_weight: 1.0,
        recency_weight: 0.0,
        recency_half_life: 10.0,
        size_prior: Some(0.05),
        epochs: false,
        tiers_per_doubling: None,
        body_edit_weight: 0.5,
        lazy_body_edits: true,
    };

    /// The score of a block (lower = more stable = earlier).
    pub(crate) fn score(&self, ages: &[u32], body_edits: &[u32], kind: SegmentKind, tokens: usize) -> f64 {
        let decayed: f64 = ages.iter().map(|&a| decay(a, self.half_life)).sum();
        let last_text_change = if self.lazy_body_edits { ages.first().copied() } else { Some(0) };
        let body: f64 = match last_text_change {
            Some(last) => body_edits.iter().filter(|&&a| a >= last).map(|&a| decay(a, self.half_life)).sum(),
            None => 0.0,
        };
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

#[cfg(test)]
mod tests {
    use super::*;

    fn score(m: &StabilityModel, ages: &[u32], body: &[u32]) -> f64 {
        m.score(ages, body, SegmentKind::Outline, 100)
    }

    #[test]
    fn lazy_body_edits_count_only_before_the_last_text_change() {
        let lazy = StabilityModel::DEFAULT;
        let eager = StabilityModel { lazy_body_edits: false, ..lazy };
        // Body edits at ages 1..=3, the outline's text last changed at age 5: none counted yet, so a
        // body-only edit does not move the block.
        assert_eq!(score(&lazy, &[5, 9], &[1, 2, 3]), score(&lazy, &[5, 9], &[]));
        assert!(score(&eager, &[5, 9], &[1, 2, 3]) > score(&eager, &[5, 9], &[]));
        // Once the text changes again (age 0), the edits before it count.
        assert!(score(&lazy, &[0, 6, 10], &[2, 3, 4]) > score(&lazy, &[0, 6, 10], &[]));
        // Edits older than the last text change count at once; none when the text never changed.
        assert!(score(&lazy, &[5], &[7]) > score(&lazy, &[5], &[]));
        assert_eq!(score(&lazy, &[], &[1, 7]), score(&lazy, &[], &[]));
    }
}
