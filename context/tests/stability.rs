//! Stability ordering: files that change often go last, so a push keeps the prefix before them.

use crate::common;

use cachet_context::testing::TestRepo;
use cachet_context::{CommitId, ContextBuilder, ContextOptions, Mirror, Order, RepoContext, SegmentKind};
use common::Words;

fn module(name: &str, version: usize) -> String {
    format!("pub fn {name}_entry(x: u32) -> u32 {{\n    x + {version}\n}}\n")
}

/// `a_hot.rs` changes in every commit, `b_warm.rs` in every third (not the last); the others never after the first.
fn busy_repo(dir: &std::path::Path) -> (TestRepo, CommitId) {
    let repo = TestRepo::init(dir).unwrap();
    let stable: Vec<(String, String)> =
        ["c_core", "d_model", "e_util", "f_io"].iter().map(|n| (format!("src/{n}.rs"), module(n, 0))).collect();
    let mut files: Vec<(&str, Option<&str>)> = stable.iter().map(|(p, c)| (p.as_str(), Some(c.as_str()))).collect();
    let hot0 = module("hot", 0);
    let warm0 = module("warm", 0);
    files.push(("src/a_hot.rs", Some(&hot0)));
    files.push(("src/b_warm.rs", Some(&warm0)));
    let mut head = repo.commit(&files, "initial").unwrap();
    for i in 1..=13 {
        let hot = module("hot", i);
        let warm = module("warm", i);
        let mut change: Vec<(&str, Option<&str>)> = vec![("src/a_hot.rs", Some(&hot))];
        if i % 3 == 0 {
            change.push(("src/b_warm.rs", Some(&warm)));
        }
        head = repo.commit(&change, &format!("change {i}")).unwrap();
    }
    (repo, head)
}

fn paths(ctx: &RepoContext) -> Vec<String> {
    ctx.segments.iter().filter_map(|s| s.path.clone()).collect()
}

#[test]
fn frequently_changed_files_go_last() {
    let dir = tempfile::tempdir().unwrap();
    let (_repo, head) = busy_repo(dir.path());
    let mirror = Mirror::open_path(dir.path()).unwrap();
    let o = ContextOptions { budget_tokens: 10_000, ..ContextOptions::default() };
    let ctx = ContextBuilder::new(100).build(&mirror, &head, &o, &Words).unwrap();
    let p = paths(&ctx);
    assert_eq!(p.len(), 6);
    assert_eq!(&p[4..], ["src/b_warm.rs", "src/a_hot.rs"], "{p:?}");
    let by_path = ContextBuilder::new(100).build(&mirror, &head, &ContextOptions { order: Order::Path, ..o }, &Words);
    assert_eq!(paths(&by_path.unwrap())[0], "src/a_hot.rs");
}

#[test]
fn a_push_to_the_hot_file_keeps_the_prefix_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, head) = busy_repo(dir.path());
    let mirror = Mirror::open_path(dir.path()).unwrap();
    let builder = ContextBuilder::new(100);
    let o = ContextOptions { budget_tokens: 10_000, ..ContextOptions::default() };
    let before = builder.build(&mirror, &head, &o, &Words).unwrap();
    let pushed = repo.commit(&[("src/a_hot.rs", Some(&module("hot", 99)))], "push").unwrap();
    let after = builder.build(&mirror, &pushed, &o, &Words).unwrap();
    let hot = before.segments.iter().find(|s| s.path.as_deref() == Some("src/a_hot.rs")).unwrap();
    assert_eq!(before.text[..hot.text.start], after.text[..hot.text.start]);
    assert_eq!(before.tokens[..hot.tokens.start], after.tokens[..hot.tokens.start]);
    assert!(hot.tokens.start * 10 >= before.tokens.len() * 8, "the hot file's block should be near the end");

    // Path order puts the hot file first: almost nothing survives the push.
    let po = ContextOptions { order: Order::Path, ..o };
    let (pb, pa) =
        (builder.build(&mirror, &head, &po, &Words).unwrap(), builder.build(&mirror, &pushed, &po, &Words).unwrap());
    let common = pb.tokens.iter().zip(&pa.tokens).take_while(|(a, b)| a == b).count();
    assert!(common < hot.tokens.start, "{common} vs {}", hot.tokens.start);
}

#[test]
fn last_change_order_puts_least_recently_changed_first() {
    let dir = tempfile::tempdir().unwrap();
    let (_repo, head) = busy_repo(dir.path());
    let mirror = Mirror::open_path(dir.path()).unwrap();
    let o = ContextOptions { budget_tokens: 10_000, order: Order::LastChange, ..ContextOptions::default() };
    let p = paths(&ContextBuilder::new(100).build(&mirror, &head, &o, &Words).unwrap());
    assert_eq!(p, ["src/c_core.rs", "src/d_model.rs", "src/e_util.rs", "src/f_io.rs", "src/b_warm.rs", "src/a_hot.rs"]);
}

#[test]
fn history_depth_limits_what_is_remembered() {
    let dir = tempfile::tempdir().unwrap();
    let (_repo, head) = busy_repo(dir.path());
    let mirror = Mirror::open_path(dir.path()).unwrap();
    // With one commit of history only the hot file changed: in last-change order warm sorts with
    // the never-changed files (by path, so first); with the whole history it is second to last.
    let o = ContextOptions {
        budget_tokens: 10_000,
        history_depth: 1,
        order: Order::LastChange,
        ..ContextOptions::default()
    };
    let p = paths(&ContextBuilder::new(100).build(&mirror, &head, &o, &Words).unwrap());
    assert_eq!((p[0].as_str(), p[5].as_str()), ("src/b_warm.rs", "src/a_hot.rs"), "{p:?}");
    let o = ContextOptions { history_depth: 500, ..o };
    let deep = paths(&ContextBuilder::new(100).build(&mirror, &head, &o, &Words).unwrap());
    assert_eq!((deep[4].as_str(), deep[5].as_str()), ("src/b_warm.rs", "src/a_hot.rs"), "{deep:?}");
}

fn typed_module(name: &str, ty: &str, version: usize) -> String {
    format!("pub fn {name}_entry(x: {ty}) -> {ty} {{\n    x + {version}\n}}\n")
}

/// Two outlines of the same size whose signatures changed together; then `a_busy.rs` gets eight
/// body-only edits. Those edits leave its outline, and so the context, as it was (they would move
/// it behind `b_calm.rs` if counted at once); at the next signature change of both they count, and
/// the busy file goes last.
#[test]
fn body_edits_move_an_outline_only_when_its_text_changes() {
    let dir = tempfile::tempdir().unwrap();
    let repo = TestRepo::init(dir.path()).unwrap();
    let both = |ty: &str, v: usize| [typed_module("a_busy", ty, v), typed_module("b_calm", ty, v)];
    let commit_both = |m: &[String; 2], msg: &str| {
        repo.commit(&[("src/a_busy.rs", Some(m[0].as_str())), ("src/b_calm.rs", Some(m[1].as_str()))], msg).unwrap()
    };
    commit_both(&both("u32", 0), "initial");
    let mut head = commit_both(&both("u64", 0), "signatures");
    let mirror = Mirror::open_path(dir.path()).unwrap();
    let builder = ContextBuilder::new(100);
    let o = ContextOptions { budget_tokens: 10_000, full_file_share: 0.0, ..ContextOptions::default() };
    let before = builder.build(&mirror, &head, &o, &Words).unwrap();
    assert_eq!(paths(&before), ["src/a_busy.rs", "src/b_calm.rs"]);
    for v in 1..=8 {
        head = repo.commit(&[("src/a_busy.rs", Some(&typed_module("a_busy", "u64", v)))], "body").unwrap();
    }
    let busy = builder.build(&mirror, &head, &o, &Words).unwrap();
    assert_eq!(busy.segments.iter().map(|s| s.kind).collect::<Vec<_>>()[1..], [SegmentKind::Outline; 2]);
    let blocks = |c: &RepoContext| c.text[c.segments[0].text.end..].to_owned();
    assert_eq!(blocks(&busy), blocks(&before), "a body-only edit changed or moved a block");

    let head = commit_both(&both("i64", 9), "signatures again");
    let after = builder.build(&mirror, &head, &o, &Words).unwrap();
    assert_eq!(paths(&after), ["src/b_calm.rs", "src/a_busy.rs"]);
}
