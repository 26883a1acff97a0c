//! `cachet bench --grammar`: what constrained decoding costs.
//!
//! - Decode speed through the engine loop, with a tool-call grammar (the named
//!   `write_file` tool of a 20-tool agent set, so the answer is a long JSON string
//!   argument) and without, at each `--batch`, in alternating rounds; the prompt
//!   is the same chat prompt (tools rendered) and is cached before each round, so
//!   the round times decoding. A request's rate is taken over the tokens every
//!   request of its round produced (tokens 2..=K, K the round's shortest output:
//!   a grammar may end some answers early, and fewer sequences decode faster);
//!   the table gives the median over requests and rounds.
//! - Grammar compile time for the 20-tool set (the `auto` grammar the API
//!   builds): cold (cache cleared) and cached, and the one-off cost of the
//!   tokenizer view llguidance needs.

use super::bench::median;
use crate::openai::tools::{self, ToolFields};
use anyhow::Context;
use cachet_engine::chat_template::ChatMessage;
use cachet_engine::constraint::GrammarSource;
use cachet_engine::generate::GenerateParams;
use cachet_engine::kv_pool::PoolSize;
use cachet_engine::radix::TenantKey;
use cachet_engine::runtime::{self, EngineConfig, EngineHandle, Request};
use cachet_engine::sampler::SamplingParams;
use cachet_kernels::backend::Backend;
use serde_json::{json, Value};
use std::time::Instant;

/// Twenty tools of the kind coding agents send.
pub fn agent_tools() -> Value {
    let f = |name: &str, description: &str, properties: Value, required: Value| {
        json!({"type": "function", "function": {"name": name, "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required}}})
    };
    let s = |d: &str| json!({"type": "string", "description": d});
    json!([
        f(
            "read_file",
            "Read a file",
            json!({"path": s("path"), "offset": {"type": "integer", "minimum": 0},
            "limit": {"type": "integer", "minimum": 1}}),
            json!(["path"])
        ),
        f(
            "write_file",
            "Write a file",
            json!({"path": s("path"), "content": s("the whole new content")}),
            json!(["path", "content"])
        ),
        f(
            "edit_file",
            "Replace text in a file",
            json!({"path": s("path"), "old_string": s("text to replace"),
            "new_string": s("replacement"), "replace_all": {"type": "boolean"}}),
            json!(["path", "old_string", "new_string"])
        ),
        f(
            "run_shell_command",
            "Run a command",
            json!({"command": s("command"), "directory": s("cwd"),
            "timeout_ms": {"type": "integer", "minimum": 1, "maximum": 600000}}),
            json!(["command"])
        ),
        f(
            "list_directory",
            "List a directory",
            json!({"path": s("path"), "ignore": {"type": "array", "items": s("glob")}}),
            json!(["path"])
        ),
        f("glob", "Find files", json!({"pattern": s("glob"), "path": s("root")}), json!(["pattern"])),
        f(
            "grep",
            "Search file contents",
            json!({"pattern": s("regex"), "path": s("root"), "include": s("glob"),
            "case_sensitive": {"type": "boolean"}}),
            json!(["pattern"])
        ),
        f("web_fetch", "Fetch a URL", json!({"url": s("url"), "prompt": s("what to extract")}), json!(["url"])),
        f(
            "todo_write",
            "Update the task list",
            json!({"todos": {"type": "array", "items": {"type": "object",
            "properties": {"id": s("id"), "content": s("task"), "status": {"enum": ["pending", "in_progress", "completed"]}},
            "required": ["id", "content", "status"]}}}),
            json!(["todos"])
        ),
        f("save_memory", "Remember a fact", json!({"fact": s("fact")}), json!(["fact"])),
        f("git_status", "Show the working tree status", json!({}), json!([])),
        f("git_diff", "Show a diff", json!({"staged": {"type": "boolean"}, "path": s("path")}), json!([])),
        f("git_commit", "Commit", json!({"message": s("message"), "all": {"type": "boolean"}}), json!(["message"])),
        f("run_tests", "Run tests", json!({"filter": s("filter"), "package": s("package")}), json!([])),
        f(
            "lint",
            "Run the linter",
            json!({"fix": {"type": "boolean"}, "paths": {"type": "array", "items": s("path")}}),
            json!([])
        ),
        f("format", "Format files", json!({"paths": {"type": "array", "items": s("path")}}), json!(["paths"])),
        f(
            "symbol_search",
            "Find a symbol",
            json!({"name": s("name"), "kind": {"enum": ["function", "struct", "trait", "module"]}}),
            json!(["name"])
        ),
        f(
            "open_pr",
            "Open a pull request",
            json!({"title": s("title"), "body": s("body"), "draft": {"type": "boolean"}}),
            json!(["title", "body"])
        ),
        f(
            "ask_user",
            "Ask the user",
            json!({"question": s("question"), "options": {"type": "array", "items": s("option"),
            "maxItems": 4}}),
            json!(["question"])
        ),
        f(
            "finish",
            "Report the task done",
            json!({"summary": s("summary"), "success": {"type": "boolean"}}),
            json!(["summary", "success"])
        ),
    ])
}

/// One round: `batch` requests at once. Each request's decode rate is taken over the tokens
/// every request of the round produced (a grammar may end some early, and a smaller batch
/// decodes faster): tokens 1..=K after the first, K the round's shortest output.
fn round(
    engine: &EngineHandle,
    prompt: &[u32],
    batch: usize,
    gen: usize,
    grammar: Option<&cachet_engine::constraint::Grammar>,
    round: usize,
) -> anyhow::Result<(Vec<f64>, usize)> {
    let streams: Vec<_> = (0..batch)
        .map(|i| {
            let params = GenerateParams {
                max_tokens: gen,
                ignore_eos: grammar.is_none(),
                sampling: SamplingParams {
                    temperature: 0.7,
                    seed: Some((round * 64 + i) as u64),
                    ..Default::default()
                },
                ..Default::default()
            };
            let mut r = Request::new(TenantKey::new("bench"), prompt.to_vec(), params);
            r.grammar = grammar.cloned();
            engine.submit(r)
        })
        .collect();
    // Token arrival times, read as they come (one thread per request).
    let times: anyhow::Result<Vec<Vec<Instant>>> = std::thread::scope(|scope| {
        let readers: Vec<_> = streams
            .into_iter()
            .map(|mut s| {
                scope.spawn(move || {
                    let mut t = Vec::new();
                    while let Some(event) = s.blocking_next() {
                        match event {
                            runtime::Event::Token { .. } => t.push(Instant::now()),
                            runtime::Event::Done(_) => return Ok(t),
                            runtime::Event::Error(e) => return Err(e),
                        }
                    }
                    Ok(t)
                })
            })
            .collect();
        readers
            .into_iter()
            .map(|r| -> anyhow::Result<Vec<Instant>> { Ok(r.join().map_err(|_| anyhow::anyhow!("a reader failed"))??) })
            .collect()
    });
    let times = times?;
    let shortest = times.iter().map(Vec::len).min().unwrap_or(0);
    let rates = times
        .iter()
        .filter(|_| shortest > 1)
        .map(|t| (shortest - 1) as f64 / (t[shortest - 1] - t[0]).as_secs_f64().max(1e-9))
        .collect();
    Ok((rates, shortest))
}

pub fn run<B: Backend + 'static>(args: &super::bench::BenchArgs, path: &std::path::Path, b: B) -> anyhow::Result<()> {
    let loaded = cachet_engine::loader::load(path, &b).with_context(|| format!("loading {}", path.display()))?;
    let name = loaded.name.clone();
    let template = loaded.chat_template.as_ref().context("the model has no chat template")?;
    let tools_json = agent_tools();
    let named = json!({"type": "function", "function": {"name": "write_file"}});
    let fields = ToolFields { tools: Some(&tools_json), tool_choice: Some(&named), ..ToolFields::default() };
    let plan = tools::plan(fields, template.source()).map_err(|e| anyhow::anyhow!("{e}"))?;
    let auto = tools::plan(ToolFields { tool_choice: None, ..fields }, template.source())
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let messages = [ChatMessage::user(
        "Write bst.py: a binary search tree in Python with insert, delete, search and in-order traversal, \
         every method with a docstring and type hints.",
    )];
    let text = template.render(&messages, true, plan.template_tools.as_ref())?;
    let prompt = loaded.tokenizer.encode(&text, true)?;
    let max_batch = args.batch.iter().copied().max().unwrap_or(1);
    let cfg = EngineConfig {
        pool: PoolSize::Tokens((max_batch * (args.gen + 8) + 2 * prompt.len()).max(4096)),
        overload_factor: 0.0,
        ..EngineConfig::default()
    };
    let engine = runtime::start(b, loaded, cfg)?;

    // Compile times.
    let grammars = engine.grammars();
    let view = grammars.warm_up()?;
    let auto_source = auto.grammar.clone().context("a grammar")?;
    let mut cold = Vec::new();
    for _ in 0..args.reps.max(1) {
        grammars.clear_cache();
        let t = Instant::now();
        grammars.compile(&auto_source)?;
        cold.push(t.elapsed().as_secs_f64());
    }
    let mut cached = Vec::new();
    for _ in 0..args.reps.max(1) {
        let t = Instant::now();
        grammars.compile(&auto_source)?;
        cached.push(t.elapsed().as_secs_f64());
    }
    let write_file = grammars.compile(plan.grammar.as_ref().context("a grammar")?)?;
    let GrammarSource::Lark(lark) = &auto_source else { anyhow::bail!("a Lark grammar") };

    // The prompt, cached once: each round then times decoding.
    let warm = GenerateParams { max_tokens: 1, ignore_eos: true, ..Default::default() };
    engine.submit(Request::new(TenantKey::new("bench"), prompt.clone(), warm)).collect_blocking().result?;

    let mut rows = Vec::new();
    let before = engine.snapshot_blocking().unwrap_or_default();
    for &batch in &args.batch {
        let (mut free, mut constrained, mut shortest) = (Vec::new(), Vec::new(), usize::MAX);
        for r in 0..args.reps.max(1) {
            // Alternate which goes first.
            let order = if r % 2 == 0 { [false, true] } else { [true, false] };
            for with in order {
                let g = with.then_some(&write_file);
                let (rates, short) = round(&engine, &prompt, batch, args.gen, g, r)?;
                if with {
                    constrained.push(median(rates));
                    shortest = shortest.min(short);
                } else {
                    free.push(median(rates));
                }
            }
        }
        rows.push((batch, median(free), median(constrained), shortest));
    }
    let after = engine.snapshot_blocking().unwrap_or_default();
    let masks = (after.grammar_masks - before.grammar_masks).max(1) as f64;
    let steps = (after.grammar_steps - before.grammar_steps).max(1) as f64;
    let mask_ms = (after.grammar_mask_seconds - before.grammar_mask_seconds) / masks * 1e3;
    let wait_ms = (after.grammar_wait_seconds - before.grammar_wait_seconds) / steps * 1e3;
    if args.json {
        println!(
            "{}",
            json!({"model": name, "prompt_tokens": prompt.len(), "gen": args.gen,
                "mask_ms_per_sequence_step": mask_ms, "wait_ms_per_step": wait_ms,
                "decode": rows.iter().map(|(b, f, c, s)| json!({"batch": b, "unconstrained_tps": f, "constrained_tps": c,
                    "ratio": c / f, "shortest_constrained_output": s})).collect::<Vec<_>>(),
                "compile": {"tools": 20, "grammar_bytes": lark.len(), "tokenizer_view_s": view.as_secs_f64(),
                    "cold_s": cold, "cached_s": cached}})
        );
        return Ok(());
    }
    println!(
        "model: {name} · prompt {} tokens (20 tools rendered) · {} decode steps · {} rounds",
        prompt.len(),
        args.gen,
        args.reps.max(1)
    );
    println!("| sequences | unconstrained tok/s per sequence | write_file call grammar | ratio |");
    println!("|---:|---:|---:|---:|");
    for (batch, f, c, _) in &rows {
        println!("| {batch} | {f:.1} | {c:.1} | {:.2} |", c / f);
    }
    println!(
        "masks: {mask_ms:.3} ms per sequence and step, computed beside the forward pass; a step waited \
         {wait_ms:.3} ms for them after its forward pass (averages over all rounds)"
    );
    let short = rows.iter().map(|r| r.3).min().unwrap_or(0);
    if short < args.gen {
        println!("(a grammar ended an answer after {short} tokens: rates of such rounds are over their first {short})");
    }
    println!("\ngrammar of 20 tools (auto, {} bytes of Lark): tokenizer view {:.0} ms once; compile cold {:.1} ms, cached {:.3} ms (medians)",
        lark.len(), view.as_secs_f64() * 1e3, median(cold) * 1e3, median(cached) * 1e3);
    Ok(())
}
