use super::*;
use crate::tokenizer::{GgufTokenizerSpec, Tokenizer};

/// Byte tokens, a few merges, a user-defined `<tool_call>` (as Qwen's), and two
/// end-of-turn control tokens.
fn tokenizer() -> Arc<Tokenizer> {
    let mut spec = GgufTokenizerSpec::byte_alphabet("gpt2", Some("qwen2"));
    spec.push_token("he", GgufTokenizerSpec::TOKEN_NORMAL);
    spec.merges.push("h e".into());
    spec.push_token("<tool_call>", GgufTokenizerSpec::TOKEN_USER_DEFINED);
    spec.push_token("<|endoftext|>", GgufTokenizerSpec::TOKEN_CONTROL);
    let end = spec.push_token("<|im_end|>", GgufTokenizerSpec::TOKEN_CONTROL);
    spec.eos_token_id = Some(end);
    Arc::new(Tokenizer::from_gguf(spec).unwrap())
}

/// The model has a few more logits than the tokenizer has tokens (padding rows).
const MODEL_VOCAB: usize = 270;

fn grammars() -> Grammars {
    Grammars::new(tokenizer(), MODEL_VOCAB)
}

/// Feeds `text`'s tokens one by one, each checked against the mask; then whether
/// the output may end there (an end-of-sequence id allowed).
fn run(g: &Grammar, tok: &Tokenizer, text: &str) -> Result<bool, MatchError> {
    let mut c = g.start();
    for t in tok.encode(text, false).unwrap() {
        let mask = c.mask()?;
        let mut logits = vec![0.0f32; MODEL_VOCAB];
        if !c.apply(&mask, &mut logits) {
            return Err(MatchError("nothing allowed".into()));
        }
        if logits[t as usize] == f32::NEG_INFINITY {
            return Err(MatchError(format!("token {t} ({:?}) not allowed", tok.decode(&[t], false).unwrap())));
        }
        c.commit(t)?;
    }
    if c.finished() {
        return Ok(true);
    }
    let mask = c.mask()?;
    let mut logits = vec![0.0f32; MODEL_VOCAB];
    c.apply(&mask, &mut logits);
    let end = tok.eos_ids();
    assert!(end.len() >= 2, "both end-of-turn ids count as EOS: {end:?}");
    let allowed: Vec<bool> = end.iter().map(|&e| logits[e as usize] == 0.0).collect();
    assert!(allowed.iter().all(|&a| a == allowed[0]), "every EOS id is treated alike");
    Ok(allowed[0])
}

#[test]
fn json_schema_allows_exactly_the_valid_documents() {
    let (g, tok) = (grammars(), tokenizer());
    let schema = r#"{"type":"object","properties":{"n":{"type":"integer","minimum":0,"maximum":99},
        "tag":{"enum":["a","b"]}},"required":["n"],"additionalProperties":false,
        "x-guidance":{"whitespace_flexible":false,"item_separator":", ","key_separator":": "}}"#;
    let grammar = g.compile(&GrammarSource::JsonSchema(schema.into())).unwrap();
    assert_eq!(run(&grammar, &tok, r#"{"n": 42, "tag": "b"}"#), Ok(true));
    assert_eq!(run(&grammar, &tok, r#"{"n": 7}"#), Ok(true));
    assert_eq!(run(&grammar, &tok, r#"{"n": 4"#), Ok(false), "incomplete: may not end yet");
    assert!(run(&grammar, &tok, r#"{"n": 100}"#).is_err(), "out of range");
    assert!(run(&grammar, &tok, r#"{"tag": "a"}"#).is_err(), "required n missing");
    assert!(run(&grammar, &tok, r#"{"n": 1, "x": 2}"#).is_err(), "no additional properties");
    assert!(run(&grammar, &tok, r#"{"n":1}"#).is_err(), "separators as configured");
}

#[test]
fn regex_and_lark_grammars() {
    let (g, tok) = (grammars(), tokenizer());
    let rx = g.compile(&GrammarSource::Regex("(yes|no)[0-9]{2}".into())).unwrap();
    assert_eq!(run(&rx, &tok, "yes12"), Ok(true));
    assert_eq!(run(&rx, &tok, "no0"), Ok(false));
    assert!(run(&rx, &tok, "maybe").is_err());
    let lark = g.compile(&GrammarSource::Lark("start: \"he\" NUM\nNUM: /[0-9]+/".into())).unwrap();
    assert_eq!(run(&lark, &tok, "he42"), Ok(true));
    assert!(run(&lark, &tok, "hex").is_err());
}

#[test]
fn a_lazy_grammar_leaves_text_free_until_its_trigger() {
    let (g, tok) = (grammars(), tokenizer());
    let lark = r#"
start: TEXT | (call_hd call)+ TAIL
TEXT: /(.|\n)*/
TAIL: /\s*/
call_hd[lazy]: TEXT "<tool_call>"
call: "\n" %json {"type": "object", "properties": {"name": {"const": "f"}}, "required": ["name"],
      "additionalProperties": false, "x-guidance": {"whitespace_flexible": false}} "\n</tool_call>"
"#;
    let grammar = g.compile(&GrammarSource::Lark(lark.into())).unwrap();
    assert_eq!(run(&grammar, &tok, "any { text } at all"), Ok(true));
    assert_eq!(run(&grammar, &tok, "hm <tool_call>\n{\"name\":\"f\"}\n</tool_call>"), Ok(true));
    assert_eq!(run(&grammar, &tok, "hm <tool_call>\n{\"name\":\"f\"}\n</tool_call>\n"), Ok(true));
    assert!(run(&grammar, &tok, "hm <tool_call>\n{\"name\":\"g\"}").is_err(), "a started call follows its schema");
    assert!(run(&grammar, &tok, "<tool_call>\nfree text").is_err(), "no free text inside a call");
    assert_eq!(run(&grammar, &tok, "<tool_call>\n{\"name\":\"f\"}"), Ok(false), "an open call cannot end");
}

#[test]
fn bad_grammars_are_errors_that_name_the_problem() {
    let g = grammars();
    let err = |s: GrammarSource| g.compile(&s).unwrap_err();
    assert!(matches!(err(GrammarSource::JsonSchema("{not json".into())), GrammarError::Invalid(_)));
    let e = err(GrammarSource::JsonSchema(r#"{"type": "frobnicate"}"#.into()));
    assert!(e.to_string().contains("frobnicate"), "{e}");
    let e = err(GrammarSource::Lark("start: undefined_rule".into()));
    assert!(e.to_string().contains("undefined_rule"), "{e}");
    let e = err(GrammarSource::Regex("(unclosed".into()));
    assert!(matches!(e, GrammarError::Invalid(_)), "{e}");
    let huge = GrammarSource::Regex("a".repeat(MAX_GRAMMAR_BYTES + 1));
    assert!(matches!(err(huge), GrammarError::TooLarge { .. }));
}

#[test]
fn compiled_grammars_are_cached_by_their_text() {
    let g = grammars();
    let s = GrammarSource::Regex("[a-z]+".into());
    assert!(!g.is_cached(&s));
    g.compile(&s).unwrap();
    g.compile(&s).unwrap();
    assert!(g.is_cached(&s));
    assert_eq!(g.stats(), GrammarStats { compiled: 1, cache_hits: 1 });
    g.clear_cache();
    g.compile(&s).unwrap();
    assert_eq!(g.stats().compiled, 2);
}

#[test]
fn masks_cover_the_models_padding_rows_and_keep_special_tokens_out_of_text() {
    let (g, tok) = (grammars(), tokenizer());
    let grammar = g.compile(&GrammarSource::Regex("[a-z ]*".into())).unwrap();
    let mut c = grammar.start();
    let mask = c.mask().unwrap();
    let mut logits = vec![1.0f32; MODEL_VOCAB];
    assert!(c.apply(&mask, &mut logits));
    let tool_call = tok.token_id("<tool_call>").unwrap() as usize;
    assert_eq!(logits[tool_call], f32::NEG_INFINITY);
    assert!(logits[tok.vocab_size()..].iter().all(|&l| l == f32::NEG_INFINITY), "rows past the tokenizer");
    let a = tok.encode("a", false).unwrap()[0] as usize;
    assert_eq!(logits[a], 1.0, "allowed logits are left as they were");
}

#[test]
fn a_grammar_whose_lexer_cannot_be_built_fails_at_compile_and_is_not_kept() {
    let g = grammars();
    for i in 0..2 {
        let bad = GrammarSource::Regex(format!("(a{{1000}}){{1000}}z{i}"));
        let err = g.compile(&bad).unwrap_err();
        assert!(matches!(err, GrammarError::Invalid(_)), "{err:?}");
        assert!(!err.to_string().contains('\n'), "one line: {err}");
        assert!(!g.is_cached(&bad));
    }
    assert_eq!(g.stats().compiled, 0);
    // A grammar that allows only the empty output is fine.
    let empty = GrammarSource::Regex(String::new());
    let grammar = g.compile(&empty).unwrap();
    assert_eq!(grammar.check(&[]), Ok(true));
}

#[test]
fn a_grammar_that_fails_while_in_use_leaves_the_cache() {
    let g = grammars();
    let source = GrammarSource::Regex("(yes|no)".into());
    let grammar = g.compile(&source).unwrap();
    assert!(g.is_cached(&source));
    let mut c = grammar.start();
    // A token the grammar does not allow, fed anyway: the matcher fails, and the grammar is
    // no longer kept (its shared state may be what failed).
    let z = tokenizer().encode("z", false).unwrap()[0];
    assert!(c.commit(z).is_err());
    assert!(!g.is_cached(&source));
    // It compiles again when asked.
    g.compile(&source).unwrap();
    assert!(g.is_cached(&source));
}

#[test]
#[cfg(target_os = "linux")]
fn the_first_mask_budget_counts_this_threads_cpu_time() {
    // The budget's clock is the calling thread's CPU clock: a reading of it lies between two
    // readings of CLOCK_THREAD_CPUTIME_ID (one clock, so the order holds whatever the machine's load).
    let thread_cpu = || {
        let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `t` is a valid out-pointer.
        assert_eq!(unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) }, 0);
        Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
    };
    let clock = ThreadCpuClock::current().expect("Linux has per-thread CPU clocks");
    let before = thread_cpu();
    let read = clock.at_start + clock.elapsed();
    let after = thread_cpu();
    assert!(before <= read && read <= after, "{before:?} {read:?} {after:?}");
}
