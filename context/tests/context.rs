//! Building repository contexts from real repositories.

use crate::common;

use std::collections::BTreeSet;

use cachet_context::testing::TestRepo;
use cachet_context::{
    CommitId, ContextBuilder, ContextError, ContextOptions, FileRules, Mirror, Order, RepoContext, SegmentKind,
    TokenCounter,
};
use common::{NamedWords, Words};

const CORE: &str = "\
pub struct RepoStore {
    pub root: String,
}

impl RepoStore {
    pub fn open_mirror(&self, name: &str) -> MirrorHandle {
        MirrorHandle { name: name.to_string() }
    }
}

pub struct MirrorHandle {
    pub name: String,
}
";

fn user(i: usize) -> String {
    format!(
        "use crate::core::{{RepoStore, MirrorHandle}};\n\n\
         pub fn handler_{i}(store: &RepoStore) -> MirrorHandle {{\n    store.open_mirror(\"repo_{i}\")\n}}\n"
    )
}

const LONELY: &str = "\
pub struct UnusedThing {
    pub field: u32,
}

pub fn unused_function(x: u32) -> u32 {
    x + 1
}
";

const PY: &str = "class Greeter:\n    def greet(self, name: str) -> str:\n        return 'hi ' + name\n";

struct Fixture {
    _dir: tempfile::TempDir,
    repo: TestRepo,
    mirror: Mirror,
    head: CommitId,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let repo = TestRepo::init(dir.path().join("r")).unwrap();
    let users: Vec<(String, String)> = (0..4).map(|i| (format!("src/handlers/h{i}.rs"), user(i))).collect();
    let mut files: Vec<(&str, Option<&str>)> = vec![
        ("src/core.rs", Some(CORE)),
        ("src/lonely.rs", Some(LONELY)),
        ("tools/greet.py", Some(PY)),
        ("README.md", Some("# Demo\n\nA demo repository.\n")),
        ("docs/fences.md", Some("Run:\n\n```sh\ncargo test\n```\n")),
    ];
    files.extend(users.iter().map(|(p, c)| (p.as_str(), Some(c.as_str()))));
    repo.commit(&files, "initial").unwrap();
    let head = repo.commit(&[("src/lonely.rs", Some(&format!("{LONELY}\n// touched\n")))], "touch").unwrap();
    let mirror = Mirror::open_path(repo.path()).unwrap();
    Fixture { _dir: dir, repo, mirror, head }
}

fn opts(budget: usize, order: Order) -> ContextOptions {
    ContextOptions { budget_tokens: budget, order, ..ContextOptions::default() }
}

fn build(f: &Fixture, o: &ContextOptions) -> RepoContext {
    ContextBuilder::new(100).build(&f.mirror, &f.head, o, &Words).unwrap()
}

fn included(ctx: &RepoContext) -> BTreeSet<(Option<String>, SegmentKind)> {
    ctx.segments.iter().map(|s| (s.path.clone(), s.kind)).collect()
}

fn block_of<'a>(ctx: &'a RepoContext, path: &str) -> Option<&'a cachet_context::Segment> {
    ctx.segments.iter().find(|s| s.path.as_deref() == Some(path))
}

/// Segments tile text and tokens; each block tokenizes on its own to its token range; the whole text
/// tokenizes to the same tokens; each block starts with non-whitespace and ends with '\n'.
fn assert_well_formed(ctx: &RepoContext, tok: &dyn TokenCounter) {
    let (mut text_end, mut tok_end) = (0, 0);
    for s in &ctx.segments {
        assert_eq!(s.text.start, text_end);
        assert_eq!(s.tokens.start, tok_end);
        text_end = s.text.end;
        tok_end = s.tokens.end;
        let t = ctx.segment_text(s);
        assert!(t.ends_with('\n') && !t.starts_with(char::is_whitespace), "{t:?}");
        assert_eq!(tok.encode(t), ctx.tokens[s.tokens.clone()]);
    }
    assert_eq!(text_end, ctx.text.len());
    assert_eq!(tok_end, ctx.tokens.len());
    assert_eq!(tok.encode(&ctx.text), ctx.tokens);
    if let Some(first) = ctx.segments.first() {
        assert_eq!(first.kind, SegmentKind::Header);
    }
}

#[test]
fn contexts_are_byte_identical_across_builds_and_builders() {
    let f = fixture();
    for order in Order::ALL {
        let o = opts(400, order);
        let builder = ContextBuilder::new(100);
        let a = builder.build(&f.mirror, &f.head, &o, &Words).unwrap();
        let b = builder.build(&f.mirror, &f.head, &o, &Words).unwrap();
        let c = ContextBuilder::new(1).build(&f.mirror, &f.head, &o, &Words).unwrap();
        let shared = ContextBuilder::new(100);
        let d = shared.build(&f.mirror, &f.head, &o, &NamedWords).unwrap();
        let e = shared.build(&f.mirror, &f.head, &o, &NamedWords).unwrap();
        assert_eq!(a, b);
        assert_eq!(a, c);
        assert_eq!(a, d);
        assert_eq!(a, e);
        assert_well_formed(&a, &Words);
    }
}

#[test]
fn the_budget_is_never_exceeded() {
    let f = fixture();
    let builder = ContextBuilder::new(100);
    let budgets = (0..120).chain((120..1500).step_by(37));
    for budget in budgets {
        for share in [0.0, 0.5, 1.0] {
            let o = ContextOptions { full_file_share: share, ..opts(budget, Order::Stability) };
            let ctx = builder.build(&f.mirror, &f.head, &o, &Words).unwrap();
            assert!(ctx.tokens.len() <= budget, "budget {budget}: {} tokens", ctx.tokens.len());
            assert_well_formed(&ctx, &Words);
        }
    }
    assert!(build(&f, &opts(0, Order::Path)).segments.is_empty());
    let odd = ContextOptions { full_file_share: f64::NAN, ..opts(300, Order::Path) };
    assert!(build(&f, &odd).tokens.len() <= 300);
}

#[test]
fn the_included_set_does_not_depend_on_the_order() {
    let f = fixture();
    for budget in [60, 150, 300, 800, 5000] {
        let sets: Vec<_> = Order::ALL.iter().map(|&o| included(&build(&f, &opts(budget, o)))).collect();
        assert_eq!(sets[0], sets[1], "budget {budget}");
        assert_eq!(sets[0], sets[2], "budget {budget}");
    }
}

#[test]
fn referenced_files_rank_above_unreferenced_ones() {
    let f = fixture();
    // Room for exactly one full file in the full-file share: it must be the referenced core.
    let core_block = Words.encode(&format!("### src/core.rs (full)\n```rust\n{CORE}```\n\n")).len();
    let header = build(&f, &opts(1000, Order::Path)).segments[0].tokens.len();
    let budget = header + 2 * core_block;
    let o = ContextOptions { full_file_share: (core_block as f64 + 0.5) / budget as f64, ..opts(budget, Order::Path) };
    let ctx = build(&f, &o);
    assert_eq!(block_of(&ctx, "src/core.rs").map(|s| s.kind), Some(SegmentKind::File), "{}", ctx.text);
    assert_ne!(block_of(&ctx, "src/lonely.rs").map(|s| s.kind), Some(SegmentKind::File));
}

#[test]
fn versions_tag_blocks_by_what_they_are_made_of() {
    let f = fixture();
    let ctx = build(&f, &ContextOptions { full_file_share: 0.0, ..opts(5000, Order::Path) });
    let outline = block_of(&ctx, "src/core.rs").unwrap();
    assert_eq!(outline.kind, SegmentKind::Outline);
    assert!(outline.version.starts_with("outline:") && outline.version.len() == 24);
    let readme = block_of(&ctx, "README.md").unwrap();
    assert_eq!(readme.kind, SegmentKind::File);
    assert_eq!(Some(readme.version.clone()), readme.blob.as_ref().map(|b| b.0.clone()));
    assert_eq!(ctx.segments[0].version, "header:v1");

    // A body-only edit keeps the outline block (and its version); a signature edit changes it.
    let body_edit = CORE.replace("name.to_string()", "name.to_owned()");
    let c2 = f.repo.commit(&[("src/core.rs", Some(&body_edit))], "body").unwrap();
    let o = ContextOptions { full_file_share: 0.0, ..opts(5000, Order::Path) };
    let ctx2 = ContextBuilder::new(10).build(&f.mirror, &c2, &o, &Words).unwrap();
    let outline2 = block_of(&ctx2, "src/core.rs").unwrap();
    assert_eq!(outline2.version, outline.version);
    assert_ne!(outline2.blob, outline.blob);
    let sig_edit = CORE.replace("name: &str", "name: &String");
    let c3 = f.repo.commit(&[("src/core.rs", Some(&sig_edit))], "sig").unwrap();
    let ctx3 = ContextBuilder::new(10).build(&f.mirror, &c3, &o, &Words).unwrap();
    assert_ne!(block_of(&ctx3, "src/core.rs").unwrap().version, outline.version);
}

#[test]
fn fences_outgrow_backticks_in_content() {
    let f = fixture();
    let ctx = build(&f, &opts(5000, Order::Path));
    let s = block_of(&ctx, "docs/fences.md").unwrap();
    let text = ctx.segment_text(s);
    assert!(text.starts_with("### docs/fences.md (full)\n````markdown\n"), "{text}");
    assert!(text.ends_with("\n````\n\n"));
}

#[test]
fn bad_options_and_unknown_commits_are_errors() {
    let f = fixture();
    let b = ContextBuilder::new(10);
    let bad = ContextOptions {
        rules: FileRules { exclude: vec!["a[".into()], ..FileRules::default() },
        ..opts(100, Order::Path)
    };
    let err = b.build(&f.mirror, &f.head, &bad, &Words).unwrap_err();
    assert!(matches!(err, ContextError::BadOptions(_)) && err.is_client_error());
    let missing = CommitId("ab".repeat(20));
    assert!(matches!(b.build(&f.mirror, &missing, &opts(100, Order::Path), &Words), Err(ContextError::NotFound(_))));
}

#[test]
fn options_serialize_with_defaults() {
    let o: ContextOptions = serde_json::from_str(r#"{"budget_tokens": 100, "order": "last_change"}"#).unwrap();
    assert_eq!(o.budget_tokens, 100);
    assert_eq!(o.order, Order::LastChange);
    assert_eq!(o.rules, FileRules::default());
    assert_eq!(o.history_depth, 500);
    let r: FileRules = serde_json::from_str(r#"{"exclude": ["*.md"]}"#).unwrap();
    assert_eq!(r.max_file_bytes, 128 * 1024);
    assert!(r.skip_vendored && r.skip_generated);
}

/// Plain-text files by usefulness: the manifest and the README make it, repository metadata and
/// tool configuration do not (unless the repository's rules include them), whatever the room.
#[test]
fn manifests_and_readme_are_selected_but_metadata_and_tool_config_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let repo = TestRepo::init(dir.path()).unwrap();
    let files: Vec<(&str, Option<&str>)> = vec![
        ("src/lib.rs", Some("pub fn answer() -> u32 { 42 }\n")),
        ("Cargo.toml", Some("[package]\nname = \"demo\"\nversion = \"0.1.0\"\n")),
        ("README.md", Some("# Demo\n")),
        ("docs/guide.md", Some("How to use it.\n")),
        ("scripts/check.sh", Some("cargo test\n")),
        (".editorconfig", Some("root = true\n")),
        (".gitignore", Some("target/\n")),
        (".github/workflows/ci.yml", Some("on: push\n")),
        (".github/FUNDING.yml", Some("github: someone\n")),
        (".cargo/config.toml", Some("[build]\n")),
        ("LICENSE-MIT", Some("MIT License\n")),
        ("CHANGELOG.md", Some("## 0.1.0\n")),
        ("rustfmt.toml", Some("max_width = 120\n")),
    ];
    let head = repo.commit(&files, "initial").unwrap();
    let mirror = Mirror::open_path(repo.path()).unwrap();
    let paths = |o: &ContextOptions| -> Vec<String> {
        let ctx = ContextBuilder::new(100).build(&mirror, &head, o, &Words).unwrap();
        ctx.segments.iter().filter_map(|s| s.path.clone()).collect()
    };
    let o = ContextOptions { order: Order::Path, ..ContextOptions::default() };
    assert_eq!(paths(&o), ["Cargo.toml", "README.md", "docs/guide.md", "scripts/check.sh", "src/lib.rs"]);
    let mut wanted = o.clone();
    wanted.rules.include = vec![".editorconfig".into()];
    assert!(paths(&wanted).contains(&".editorconfig".to_string()));
}
