//! Tokenizer tests on a tiny hand-made byte-level vocabulary.

use super::*;

/// Ids of the tiny vocabulary's extra tokens.
pub(super) struct TinyIds {
    pub the: u32,
    pub endoftext: u32,
    pub im_start: u32,
    pub im_end: u32,
    pub tool_call: u32,
    pub unused: u32,
    pub spaced: u32,
}

/// The 256 byte symbols, a few merges, control / user-defined / unused tokens.
pub(super) fn tiny_spec() -> (GgufTokenizerSpec, TinyIds) {
    let mut spec = GgufTokenizerSpec::byte_alphabet("gpt2", Some("qwen2"));
    for (token, merge) in [
        ("Ġt", "Ġ t"),
        ("he", "h e"),
        ("Ġthe", "Ġt he"),
        ("ĠĠ", "Ġ Ġ"),
        ("ĠĠĠĠ", "ĠĠ ĠĠ"),
        ("in", "i n"),
        ("ĊĊ", "Ċ Ċ"),
    ] {
        spec.push_token(token, GgufTokenizerSpec::TOKEN_NORMAL);
        spec.merges.push(merge.to_string());
    }
    let the = spec.tokens.iter().position(|t| t == "Ġthe").unwrap() as u32;
    let endoftext = spec.push_token("<|endoftext|>", GgufTokenizerSpec::TOKEN_CONTROL);
    let im_start = spec.push_token("<|im_start|>", GgufTokenizerSpec::TOKEN_CONTROL);
    let im_end = spec.push_token("<|im_end|>", GgufTokenizerSpec::TOKEN_CONTROL);
    let tool_call = spec.push_token("<tool_call>", GgufTokenizerSpec::TOKEN_USER_DEFINED);
    let unused = spec.push_token("[PAD999]", GgufTokenizerSpec::TOKEN_UNUSED);
    // A control token spelled outside the byte alphabet (a real space): not added.
    let spaced = spec.push_token("<| spaced |>", GgufTokenizerSpec::TOKEN_CONTROL);
    spec.bos_token_id = Some(endoftext);
    spec.eos_token_id = Some(im_end);
    spec.pad_token_id = Some(endoftext);
    let ids = TinyIds { the, endoftext, im_start, im_end, tool_call, unused, spaced };
    (spec, ids)
}

pub(super) fn tiny() -> (Tokenizer, TinyIds) {
    let (spec, ids) = tiny_spec();
    (Tokenizer::from_gguf(spec).unwrap(), ids)
}

fn byte_id(tokenizer: &Tokenizer, symbol: &str) -> u32 {
    tokenizer.token_id(symbol).unwrap()
}

#[test]
fn bpe_merges_and_byte_symbols() {
    let (tok, ids) = tiny();
    let got = tok.encode("in the", true).unwrap();
    let in_id = tok.token_id("in").unwrap();
    assert_eq!(got, vec![in_id, ids.the]);
    // Bytes without merges come out one symbol each; 'é' is two bytes.
    let got = tok.encode("é", true).unwrap();
    assert_eq!(got, vec![byte_id(&tok, "Ã"), byte_id(&tok, "©")]);
    assert_eq!(tok.decode(&got, false).unwrap(), "é");
    assert_eq!(tok.encode("", true).unwrap(), Vec::<u32>::new());
}

#[test]
fn qwen2_split_keeps_runs_of_spaces_and_newlines() {
    let (tok, _) = tiny();
    let four = tok.token_id("ĠĠĠĠ").unwrap();
    let space = byte_id(&tok, "Ġ");
    // "\s+(?!\S)": a run of five spaces before a word leaves the last one to the word.
    let got = tok.encode("     x", true).unwrap();
    assert_eq!(got, vec![four, space, byte_id(&tok, "x")]);
    let nn = tok.token_id("ĊĊ").unwrap();
    assert_eq!(tok.encode("\n\n", true).unwrap(), vec![nn]);
    for text in ["a  b\t\tc\r\n  d   ", "x = 1;\n    return x\n", "12345 don't", "你好 👩‍💻"] {
        let ids = tok.encode(text, true).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), text);
    }
}

#[test]
fn special_tokens_parse_only_when_asked() {
    let (tok, ids) = tiny();
    let text = "<|im_start|>user\nhi<|im_end|>";
    let parsed = tok.encode(text, true).unwrap();
    assert_eq!(parsed.first(), Some(&ids.im_start));
    assert_eq!(parsed.last(), Some(&ids.im_end));

    let plain = tok.encode(text, false).unwrap();
    assert!(!plain.contains(&ids.im_start) && !plain.contains(&ids.im_end));
    assert!(plain.iter().all(|&id| !tok.is_special(id)));
    assert_eq!(tok.decode(&plain, true).unwrap(), text);
    // The plain copy is built once and reused; parsing still works afterwards.
    assert_eq!(tok.encode(text, true).unwrap(), parsed);

    // User-defined tokens are matched whole in both modes, and are not special.
    for parse_special in [true, false] {
        let got = tok.encode("a<tool_call>b", parse_special).unwrap();
        assert_eq!(got, vec![byte_id(&tok, "a"), ids.tool_call, byte_id(&tok, "b")]);
    }
}

#[test]
fn decode_skips_only_special_tokens() {
    let (tok, ids) = tiny();
    let seq = [ids.im_start, ids.the, ids.tool_call, ids.im_end, ids.endoftext];
    assert_eq!(tok.decode(&seq, true).unwrap(), " the<tool_call>");
    assert_eq!(tok.decode(&seq, false).unwrap(), "<|im_start|> the<tool_call><|im_end|><|endoftext|>");
}

#[test]
fn decode_rejects_ids_outside_the_vocabulary() {
    let (tok, _) = tiny();
    let n = tok.vocab_size() as u32;
    let err = tok.decode(&[0, n], false).unwrap_err();
    assert!(matches!(err, TokenizerError::UnknownTokenId { id, .. } if id == n));
    assert!(tok.decode(&[u32::MAX], true).is_err());
}

#[test]
fn special_ids_and_end_of_generation() {
    let (tok, ids) = tiny();
    assert_eq!(tok.vocab_size(), ids.spaced as usize + 1);
    assert_eq!(tok.bos_id(), Some(ids.endoftext));
    assert_eq!(tok.eos_id(), Some(ids.im_end));
    assert_eq!(tok.eos_ids(), vec![ids.im_end, ids.endoftext]);
    assert_eq!(tok.bos_token().as_deref(), Some("<|endoftext|>"));
    assert_eq!(tok.eos_token().as_deref(), Some("<|im_end|>"));
    assert!(tok.is_special(ids.im_start) && tok.is_special(ids.endoftext));
    assert!(!tok.is_special(ids.tool_call));
    assert!(!tok.is_special(ids.unused));
    assert!(!tok.is_special(ids.the));
    assert!(!tok.add_bos_token());
    // Spelled outside the byte alphabet: not a special token; its vocabulary
    // entry is re-spelled in byte symbols, like any such token.
    assert!(!tok.is_special(ids.spaced));
    assert_eq!(tok.token_id("<|ĠspacedĠ|>"), Some(ids.spaced));
    assert_eq!(tok.token_id("<| spaced |>"), None);
}

#[test]
fn eot_is_an_end_of_generation_id() {
    let (mut spec, ids) = tiny_spec();
    spec.eot_token_id = Some(ids.im_start);
    spec.eos_token_id = Some(ids.endoftext);
    let tok = Tokenizer::from_gguf(spec).unwrap();
    assert_eq!(tok.eos_ids(), vec![ids.endoftext, ids.im_start, ids.im_end]);
}

#[test]
fn duplicate_tokens_later_wins_like_transformers() {
    let (mut spec, _) = tiny_spec();
    let first = spec.tokens.iter().position(|t| t == "he").unwrap() as u32;
    let dup = spec.push_token("he", GgufTokenizerSpec::TOKEN_NORMAL);
    let n = spec.tokens.len();
    let tok = Tokenizer::from_gguf(spec).unwrap();
    assert_eq!(tok.vocab_size(), n);
    assert_eq!(tok.token_id("he"), Some(dup));
    assert_eq!(tok.encode("he", true).unwrap(), vec![dup]);
    // The shadowed id is a hole: it decodes to nothing, as in transformers.
    assert_eq!(tok.decode(&[first, dup], false).unwrap(), "he");
}

#[test]
fn no_nfc_normalization() {
    // The reference (transformers from GGUF) has no normalizer: composed and
    // decomposed 'é' tokenize differently and both round-trip.
    let (tok, _) = tiny();
    let composed = tok.encode("\u{e9}", true).unwrap();
    let decomposed = tok.encode("e\u{301}", true).unwrap();
    assert_ne!(composed, decomposed);
    assert_eq!(tok.decode(&decomposed, false).unwrap(), "e\u{301}");
}

#[test]
fn bad_specs_are_errors() {
    let (mut spec, _) = tiny_spec();
    spec.model = "llama".into();
    assert!(matches!(
        Tokenizer::from_gguf(spec),
        Err(TokenizerError::UnsupportedModel(m)) if m == "llama"
    ));

    let (mut spec, _) = tiny_spec();
    spec.token_types.pop();
    assert!(matches!(Tokenizer::from_gguf(spec), Err(TokenizerError::InvalidSpec(_))));

    let (mut spec, _) = tiny_spec();
    spec.eos_token_id = Some(10_000);
    assert!(matches!(Tokenizer::from_gguf(spec), Err(TokenizerError::InvalidSpec(_))));

    let (mut spec, _) = tiny_spec();
    spec.merges.push("abc".into());
    assert!(matches!(Tokenizer::from_gguf(spec), Err(TokenizerError::InvalidSpec(_))));

    let (mut spec, _) = tiny_spec();
    spec.merges.push("x q".into()); // "xq" is not in the vocabulary
    let err = Tokenizer::from_gguf(spec).unwrap_err();
    assert!(matches!(err, TokenizerError::Build(_)), "{err}");
}

#[test]
fn loads_tokenizer_json_with_hf_configs() {
    let (tok, ids) = tiny();
    let dir = tempfile::tempdir().unwrap();
    // A tokenizer.json that truncates at 2 tokens: loading must switch that off.
    let mut json: serde_json::Value = serde_json::from_str(&tok.inner().to_string(false).unwrap()).unwrap();
    json["truncation"] = serde_json::json!({
        "direction": "Right", "max_length": 2, "strategy": "LongestFirst", "stride": 0
    });
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, json.to_string()).unwrap();
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"bos_token": null, "eos_token": {"content": "<|im_end|>", "__type": "AddedToken"}, "add_bos_token": false}"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        format!(r#"{{"bos_token_id": {}, "eos_token_id": {}}}"#, ids.endoftext, ids.endoftext),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("generation_config.json"),
        format!(r#"{{"eos_token_id": [{}, {}]}}"#, ids.im_end, ids.im_start),
    )
    .unwrap();

    let loaded = Tokenizer::from_file(&path).unwrap();
    let text = "<|im_start|>user\n  in the <tool_call> é<|im_end|>";
    assert_eq!(loaded.encode(text, true).unwrap(), tok.encode(text, true).unwrap());
    assert_eq!(loaded.encode(text, false).unwrap(), tok.encode(text, false).unwrap());
    assert_eq!(loaded.bos_id(), None, "tokenizer_config says null");
    assert_eq!(loaded.eos_id(), Some(ids.im_end), "tokenizer_config wins over config.json");
    assert_eq!(loaded.eos_ids(), vec![ids.im_end, ids.endoftext, ids.im_start]);
    assert!(loaded.is_special(ids.im_start) && !loaded.is_special(ids.tool_call));
}

#[test]
fn from_file_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("tokenizer.json");
    assert!(matches!(Tokenizer::from_file(&missing), Err(TokenizerError::Load { .. })));
    std::fs::write(&missing, "{ not json").unwrap();
    assert!(matches!(Tokenizer::from_file(&missing), Err(TokenizerError::Load { .. })));

    let (tok, _) = tiny();
    std::fs::write(&missing, tok.inner().to_string(false).unwrap()).unwrap();
    std::fs::write(dir.path().join("config.json"), "[1, 2").unwrap();
    let err = Tokenizer::from_file(&missing).unwrap_err();
    assert!(err.to_string().contains("config.json"), "{err}");
}
