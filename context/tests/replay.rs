//! The replay measurement on a synthetic history.

use crate::common;

use cachet_context::replay::{replay, replay_with, Break, StabilityModel};
use cachet_context::testing::TestRepo;
use cachet_context::{ContextOptions, Mirror, Order};
use common::synth::synthetic_repo;
use common::Words;

#[test]
fn stability_order_keeps_more_of_the_context_than_path_order() {
    let dir = tempfile::tempdir().unwrap();
    let repo = TestRepo::init(dir.path()).unwrap();
    let head = synthetic_repo(&repo, 60, 80, 7);
    let mirror = Mirror::open_path(repo.path()).unwrap();
    let opts = ContextOptions { budget_tokens: 3000, ..ContextOptions::default() };
    let report = replay(&mirror, &head, 40, &opts, &Words).unwrap();
    assert_eq!(report.commits_examined, 40);
    assert!(report.rows.len() >= 10, "only {} rows", report.rows.len());
    for row in &report.rows {
        assert_eq!(row.orders.len(), 3);
        assert!((0.0..=1.0).contains(&row.hindsight_block_prefix), "{row:?}");
        for s in &row.orders {
            assert!((0.0..=1.0).contains(&s.block_prefix) && (0.0..=1.0).contains(&s.token_prefix));
            // No block's text changed when the context did not (whatever its file's edits).
            if !row.context_changed {
                assert_eq!(s.text_block_prefix, 1.0, "{row:?}");
            }
            assert!((0.0..=1.0).contains(&s.text_block_prefix), "{row:?}");
            // The prefix ends somewhere exactly when the text changed; a changed file's block ends
            // it no later than the first changed block.
            assert_eq!(s.cause.is_some(), row.context_changed && s.token_prefix < 1.0, "{row:?}");
            if s.cause == Some(Break::ChangedFile) && s.order == Order::Path {
                assert!(s.token_prefix >= s.block_prefix - 1e-9, "{row:?}");
            }
            if s.cause == Some(Break::Selection) {
                assert!(row.selection_changed, "{row:?}");
            }
        }
    }
    let stab = report.summary_of(Order::Stability).unwrap();
    let path = report.summary_of(Order::Path).unwrap();
    println!("{}", report.markdown());
    assert!(stab.token_prefix_median >= path.token_prefix_median, "{}", report.markdown());
    assert!(stab.block_prefix_median >= path.block_prefix_median, "{}", report.markdown());
    assert!(stab.token_prefix_median >= 0.5, "{}", report.markdown());
    assert!(report.markdown().contains("| stability |"));
    assert!(report.markdown().contains("| (hindsight: fewest changes in the window first) |"));
    assert!(report.markdown().contains("| order | header | changed file |"));
    let json = serde_json::to_value(&report).unwrap();
    assert!(json["rows"].as_array().is_some_and(|r| !r.is_empty()));
}

#[test]
fn replay_with_scores_several_models_on_one_history() {
    let dir = tempfile::tempdir().unwrap();
    let repo = TestRepo::init(dir.path()).unwrap();
    let head = synthetic_repo(&repo, 30, 30, 3);
    let mirror = Mirror::open_path(repo.path()).unwrap();
    let opts = ContextOptions { budget_tokens: 2000, ..ContextOptions::default() };
    let plain = StabilityModel { half_life: f64::INFINITY, ..StabilityModel::DEFAULT };
    let reports = replay_with(&mirror, &head, 20, &opts, &Words, &[StabilityModel::DEFAULT, plain]).unwrap();
    assert_eq!(reports.len(), 2);
    assert_eq!(reports[0].rows.len(), reports[1].rows.len());
    // Path order does not depend on the model.
    let p0 = reports[0].summary_of(Order::Path).unwrap().token_prefix_mean;
    let p1 = reports[1].summary_of(Order::Path).unwrap().token_prefix_mean;
    assert_eq!(p0, p1);
}
