//! What the selection shows of manifests and of test files.

use crate::common;

use cachet_context::testing::TestRepo;
use cachet_context::{CommitId, ContextBuilder, ContextOptions, Mirror, Order, RepoContext, SegmentKind};
use common::Words;

fn build(files: &[(&str, Option<&str>)], full_file_share: f64) -> RepoContext {
    let dir = tempfile::tempdir().unwrap();
    let repo = TestRepo::init(dir.path()).unwrap();
    let head = repo.commit(files, "initial").unwrap();
    let mirror = Mirror::open_path(repo.path()).unwrap();
    let o = ContextOptions { order: Order::Path, full_file_share, ..ContextOptions::default() };
    ContextBuilder::new(100).build(&mirror, &head, &o, &Words).unwrap()
}

fn paths(ctx: &RepoContext) -> Vec<&str> {
    ctx.segments.iter().filter_map(|s| s.path.as_deref()).collect()
}

/// A manifest is shown without its registry metadata and tool settings, says what it left out,
/// and is versioned by what it shows; one that holds only tool settings is not shown at all.
#[test]
fn manifests_are_shown_without_metadata_and_tool_settings() {
    let package = "{\n\t\"name\": \"demo\",\n\t\"version\": \"1.0.0\",\n\t\"keywords\": [\n\t\t\"http\",\n\t\t\"fetch\"\n\t],\n\t\"scripts\": {\n\t\t\"test\": \"ava\"\n\t},\n\t\"xo\": {\n\t\t\"semicolon\": false\n\t}\n}\n";
    let files = [
        ("src/index.ts", Some("export function get(url: string): string { return url; }\n")),
        ("package.json", Some(package)),
        ("tools/pyproject.toml", Some("[tool.black]\nline-length = 88\n")),
    ];
    let ctx = build(&files, 0.5);
    assert_eq!(paths(&ctx), ["package.json", "src/index.ts"]);
    let block = ctx.segments.iter().find(|s| s.path.as_deref() == Some("package.json")).unwrap();
    assert_eq!(block.kind, SegmentKind::File);
    assert!(block.version.starts_with("manifest:"), "{}", block.version);
    let text = &ctx.text[block.text.clone()];
    assert_eq!(
        text,
        "### package.json (manifest; left out: keywords, xo)\n```json\n{\n\t\"name\": \"demo\",\n\t\"version\": \"1.0.0\",\n\t\"scripts\": {\n\t\t\"test\": \"ava\"\n\t}\n}\n```\n\n"
    );

    // Editing only what is left out keeps the block, its version and so its cached K/V.
    let edited = package.replace("\"fetch\"", "\"request\"");
    let files2 = [files[0], ("package.json", Some(edited.as_str())), files[2]];
    let ctx2 = build(&files2, 0.5);
    let block2 = ctx2.segments.iter().find(|s| s.path.as_deref() == Some("package.json")).unwrap();
    assert_eq!((&ctx2.text[block2.text.clone()], &block2.version), (text, &block.version));
    assert_ne!(block2.blob, block.blob);
}

/// A test file's outline earns its room with what other files use (helpers, fixtures), not with
/// its own test cases and private helpers.
#[test]
fn test_files_are_outlined_only_for_what_others_use() {
    let files = [
        ("src/client.ts", Some("export function request(url: string): string { return url; }\n")),
        (
            "test/helpers/server.ts",
            Some("export function startTestServer(port: number): string { return String(port); }\n"),
        ),
        (
            "test/client.ts",
            Some(
                "import {request} from '../source/client';\nimport {startTestServer} from './helpers/server';\n\
                 function echoHeaders(value: string): string { return request(startTestServer(1) + value); }\n",
            ),
        ),
        (
            "tests/test_misc.py",
            Some("def local_helper(x):\n    return x\n\ndef test_one():\n    assert local_helper(1)\n"),
        ),
    ];
    // Outlines only (no full files), so that every code file competes for an outline.
    let ctx = build(&files, 0.0);
    let outlines: Vec<&str> =
        ctx.segments.iter().filter(|s| s.kind == SegmentKind::Outline).filter_map(|s| s.path.as_deref()).collect();
    assert_eq!(outlines, ["src/client.ts", "test/helpers/server.ts"]);
}

/// The stability order counts a manifest's edits only when they change what its block shows: ten
/// edits of its keywords leave it before a smaller file that never changed (larger stable blocks
/// first), ten edits of its scripts put it after.
#[test]
fn manifest_edits_of_left_out_keys_do_not_move_it() {
    let dir = tempfile::tempdir().unwrap();
    let repo = TestRepo::init(dir.path()).unwrap();
    let package = |keyword: usize, script: usize| {
        format!(
            "{{\n  \"name\": \"demo\",\n  \"keywords\": [\"k{keyword}\"],\n  \"scripts\": {{\n    \"test\": \"ava --match t{script}\",\n    \"build\": \"tsc --project tsconfig.dist.json\"\n  }}\n}}\n"
        )
    };
    let small = ("src/index.ts", Some("export const a = 1;\n"));
    let mut head = repo.commit(&[small, ("package.json", Some(package(0, 0).as_str()))], "initial").unwrap();
    let mirror = Mirror::open_path(repo.path()).unwrap();
    let order = |at: &CommitId| -> Vec<String> {
        let o = ContextOptions::default();
        let ctx = ContextBuilder::new(100).build(&mirror, at, &o, &Words).unwrap();
        ctx.segments.iter().filter_map(|s| s.path.clone()).collect()
    };
    for i in 1..=10 {
        head = repo.commit(&[("package.json", Some(package(i, 0).as_str()))], "keywords").unwrap();
    }
    assert_eq!(order(&head), ["package.json", "src/index.ts"]);
    for i in 1..=10 {
        head = repo.commit(&[("package.json", Some(package(10, i).as_str()))], "scripts").unwrap();
    }
    assert_eq!(order(&head), ["src/index.ts", "package.json"]);
}
