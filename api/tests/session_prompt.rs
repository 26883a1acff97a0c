//! With the real Qwen tokenizer: a session prompt tokenized piece by piece
//! (frames with special tokens, context blocks, history, this turn) has
//! exactly the tokens of its whole text, so provenance spans are exact and a
//! block's tokens never depend on what follows it. Needs the default model
//! (`cachet models pull`); without it the test prints a line and passes,
//! unless `REQUIRE_MODEL=1`.

use cachet_api::context::PlainTokens;
use cachet_api::sessions::prompt::{assemble, block, Kind, Message, Piece, Render};
use cachet_context::testing::TestRepo;
use cachet_context::{ContextBuilder, ContextOptions, Mirror, RepoContext, SegmentKind};
use cachet_engine::chat_template::ChatTemplate;
use cachet_engine::gguf::GgufFile;
use cachet_engine::tokenizer::Tokenizer;
use std::path::PathBuf;

fn real_model() -> Option<(Tokenizer, ChatTemplate)> {
    let path = cachet_engine::testing::default_model()?;
    let file = GgufFile::open(&path).unwrap();
    let tokenizer = Tokenizer::from_gguf_file(&file).unwrap();
    let source = file.get_str("tokenizer.chat_template").unwrap().unwrap().to_string();
    let template =
        ChatTemplate::new(&source, tokenizer.bos_token().as_deref(), tokenizer.eos_token().as_deref()).unwrap();
    Some((tokenizer, template))
}

const FILES: &[(&str, &str)] = &[
    ("README.md", "# Shop\n\nA tiny shop.   Trailing spaces   \n\n\n"),
    ("src/lib.rs", "pub mod cart;\n\n/// Prices in cents.\npub struct Price(pub u64);\n\nimpl Price {\n    pub const ZERO: Price = Price(0);\n    pub fn cents(&self) -> u64 { self.0 }\n}\n"),
    ("src/cart.rs", "use crate::Price;\n\npub trait Total {\n    fn total(&self) -> Price;\n}\n\npub struct Cart { items: Vec<Price> }\n\nimpl Total for Cart {\n    fn total(&self) -> Price {\n        Price(self.items.iter().map(Price::cents).sum())\n    }\n}\n"),
    ("tools/report.py", "import json\n\n\nclass Report:\n    \"\"\"A report.\"\"\"\n\n    def __init__(self, rows):\n        self.rows = rows\n\n    def to_json(self) -> str:\n        return json.dumps(self.rows)\n\n\ndef main():\n    print(Report([]).to_json())\n"),
    ("web/cart.ts", "export interface Item { price: number }\n\nexport class Cart {\n  items: Item[] = [];\n  total(): number {\n    return this.items.reduce((s, i) => s + i.price, 0);\n  }\n}\n"),
    ("web/util.js", "export function sum(xs) {\n  return xs.reduce((a, b) => a + b, 0);\n}\n\nexport const ZERO = 0;\n"),
    ("svc/main.go", "package main\n\nimport \"fmt\"\n\ntype Cart struct {\n\tItems []int\n}\n\nfunc (c *Cart) Total() int {\n\tt := 0\n\tfor _, i := range c.Items {\n\t\tt += i\n\t}\n\treturn t\n}\n\nfunc main() { fmt.Println((&Cart{}).Total()) }\n"),
    ("notes.txt", "\n\n  leading blank lines and indentation\n\ttabs\n"),
];

fn context(tok: &Tokenizer, mirror: &Mirror, budget: usize) -> RepoContext {
    let head = mirror.resolve("HEAD").unwrap();
    let opts = ContextOptions { budget_tokens: budget, ..ContextOptions::default() };
    ContextBuilder::new(1000).build(mirror, &head, &opts, &PlainTokens(tok)).unwrap()
}

fn assert_blocks_tokenize_alone(tok: &Tokenizer, ctx: &RepoContext) {
    assert_eq!(ctx.tokens, tok.encode(&ctx.text, false).unwrap(), "block tokens differ from whole-text tokens");
    for s in &ctx.segments {
        let text = &ctx.text[s.text.clone()];
        assert!(!text.starts_with(char::is_whitespace) && text.ends_with('\n'), "block shape: {text:?}");
        assert_eq!(&ctx.tokens[s.tokens.clone()], tok.encode(text, false).unwrap().as_slice());
    }
}

#[test]
fn session_prompt_tokens_are_the_whole_texts_tokens() {
    let Some((tok, template)) = real_model() else { return };
    let dir = tempfile::tempdir().unwrap();
    let repo = TestRepo::init(dir.path().join("shop")).unwrap();
    let files: Vec<(&str, Option<&str>)> = FILES.iter().map(|(p, c)| (*p, Some(*c))).collect();
    repo.commit(&files, "first").unwrap();
    let mirror = Mirror::open_path(repo.path()).unwrap();
    for budget in [64, 300, 4096] {
        let ctx = context(&tok, &mirror, budget);
        assert!(ctx.tokens.len() <= budget);
        assert_blocks_tokenize_alone(&tok, &ctx);
    }
    let ctx = context(&tok, &mirror, 4096);
    assert!(ctx.segments.iter().any(|s| s.kind == SegmentKind::File));

    let context_pieces: Vec<Piece> = ctx
        .segments
        .iter()
        .map(|s| Piece {
            kind: Kind::File,
            text: ctx.text[s.text.clone()].to_string(),
            tokens: Some(ctx.tokens[s.tokens.clone()].to_vec()),
            path: s.path.clone(),
            blob: None,
            version: None,
            turn: None,
        })
        .collect();
    let messages = vec![
        Message::new("system", vec![Piece::text(Kind::System, "You are a careful coding assistant.")]),
        Message::new("system", context_pieces.clone()),
        Message::new("user", vec![Piece::text(Kind::HistoryUser, "Why does total() return Price?")]),
        Message::new("assistant", vec![Piece::text(Kind::HistoryAssistant, "Because `Price` wraps cents.\n\n")]),
        Message::new(
            "user",
            vec![
                Piece::text(Kind::TurnFile, block("src/cart.rs", FILES[2].1)),
                Piece::text(Kind::ToolOutput, block("Tool output: cargo test", "test cart ... FAILED\n  left: 1")),
                Piece::text(Kind::Question, "Fix the failing test."),
            ],
        ),
    ];
    let prompt = assemble(&template, &tok, &messages, Render::with_tools(None)).unwrap();
    assert_eq!(prompt.tokens, tok.encode(&prompt.text, true).unwrap(), "piecewise tokens differ: {}", prompt.text);
    assert!(prompt.text.starts_with("<|im_start|>system\nYou are a careful"));
    assert!(prompt.text.ends_with("Fix the failing test.<|im_end|>\n<|im_start|>assistant\n"));

    // With tools (rendered after the system message's content, which here ends with the
    // repository context), a call in the history and its results (text the client chose,
    // with whitespace at both ends): still exactly the whole text's tokens.
    let mut system = vec![Piece::text(Kind::System, "You are a careful coding assistant.\n\n")];
    system.extend(context_pieces);
    let tools = serde_json::json!([{"type": "function", "function": {"name": "run", "description": "Run a command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}}]);
    let tool = |id: &str, text: &str| Message::tool(vec![Piece::text(Kind::ToolResult, text)], Some(id.into()));
    let messages = vec![
        Message::new("system", system),
        Message::new("user", vec![Piece::text(Kind::HistoryUser, "Run the tests.")]),
        Message::new(
            "assistant",
            vec![Piece::text(
                Kind::HistoryAssistant,
                "<tool_call>\n{\"name\": \"run\", \"arguments\": {\"cmd\": \"cargo test\"}}\n</tool_call>",
            )],
        ),
        tool("call_1", "\n  test cart ... FAILED\n\n"),
        tool("call_2", "exit status: 101"),
        Message::new("user", vec![Piece::text(Kind::Question, "Fix it.")]),
    ];
    let prompt = assemble(&template, &tok, &messages, Render::with_tools(Some(&tools))).unwrap();
    assert_eq!(prompt.tokens, tok.encode(&prompt.text, true).unwrap(), "piecewise tokens differ: {}", prompt.text);
    let tools_at = prompt.text.find("# Tools").unwrap();
    assert!(prompt.text.find("### ").unwrap() < tools_at, "the repository context comes before the tools");
    assert!(prompt.text.contains("<tool_response>\n\n  test cart ... FAILED\n\n\n</tool_response>"));
}

/// This repository itself: real Rust code, docs and scripts.
#[test]
fn this_repositorys_context_blocks_tokenize_alone() {
    let Some((tok, _)) = real_model() else { return };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let Ok(mirror) = Mirror::open_path(&root) else {
        eprintln!("skipping: {} is not a git checkout", root.display());
        return;
    };
    let ctx = context(&tok, &mirror, 8192);
    assert!(ctx.tokens.len() <= 8192 && ctx.tokens.len() > 4096, "{}", ctx.tokens.len());
    assert_blocks_tokenize_alone(&tok, &ctx);
}

/// A conversation bound to a repository through the OpenAI API (`openai::binding`): the client's
/// own system prompt and tools first, the repository context as a system message of its own, an
/// assistant turn that only made a call (empty content, `tool_calls`), its result, and the next
/// question — still exactly the whole text's tokens, in the real template.
#[test]
fn a_bound_conversation_keeps_the_clients_prompt_first_and_its_tokens_exact() {
    let Some((tok, template)) = real_model() else { return };
    let dir = tempfile::tempdir().unwrap();
    let repo = TestRepo::init(dir.path().join("shop")).unwrap();
    let files: Vec<(&str, Option<&str>)> = FILES.iter().map(|(p, c)| (*p, Some(*c))).collect();
    repo.commit(&files, "first").unwrap();
    let ctx = context(&tok, &Mirror::open_path(repo.path()).unwrap(), 4096);
    let context_pieces: Vec<Piece> = ctx
        .segments
        .iter()
        .map(|s| Piece {
            tokens: Some(ctx.tokens[s.tokens.clone()].to_vec()),
            ..Piece::text(Kind::File, &ctx.text[s.text.clone()])
        })
        .collect();
    let tools = serde_json::json!([{"type": "function", "function": {"name": "run", "description": "Run a command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}}]);
    let mut call = Message::new("assistant", Vec::new());
    call.fields.tool_calls = Some(serde_json::json!([{"id": "call_1", "type": "function",
        "function": {"name": "run", "arguments": {"cmd": "cargo test"}}}]));
    let messages = vec![
        Message::new("system", vec![Piece::text(Kind::Instructions, "You are a coding agent. Use the tools.")]),
        Message::new("system", context_pieces),
        Message::new("user", vec![Piece::text(Kind::HistoryUser, "Run the tests.")]),
        call,
        Message::tool(vec![Piece::text(Kind::HistoryTool, "test cart ... FAILED\n")], Some("call_1".into())),
        Message::new("user", vec![Piece::text(Kind::HistoryUser, "Fix it.")]),
    ];
    let render = Render { tools: Some(&tools), kwargs: None, generation_prompt: true };
    let prompt = assemble(&template, &tok, &messages, render).unwrap();
    assert_eq!(prompt.tokens, tok.encode(&prompt.text, true).unwrap(), "piecewise tokens differ: {}", prompt.text);
    let text = &prompt.text;
    assert!(text.starts_with("<|im_start|>system\nYou are a coding agent."), "{text}");
    assert!(text.find("# Tools").unwrap() < text.find("### ").unwrap(), "the tools come before the context: {text}");
    assert!(text.contains(r#"{"name": "run", "arguments": {"cmd": "cargo test"}}"#), "{text}");
    // The context's blocks kept their own tokens (the spans a push evicts are exact).
    let blocks = prompt.segments.iter().filter(|s| s.kind == Kind::File && !s.tokens.is_empty()).count();
    assert_eq!(blocks, ctx.segments.len());
}
