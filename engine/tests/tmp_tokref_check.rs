//! TEMPORARY hand-run check against transformers (delete before commit).
use cachet_engine::tokenizer::{GgufTokenizerSpec, IncrementalDecoder, Tokenizer};
use serde_json::Value;
use std::time::Instant;

fn spec_from_meta(meta: &Value) -> GgufTokenizerSpec {
    let strs = |k: &str| -> Vec<String> {
        meta[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    };
    let id = |k: &str| meta.get(k).and_then(Value::as_u64).map(|v| v as u32);
    GgufTokenizerSpec {
        model: meta["tokenizer.ggml.model"].as_str().unwrap().into(),
        pre: meta
            .get("tokenizer.ggml.pre")
            .and_then(Value::as_str)
            .map(Into::into),
        tokens: strs("tokenizer.ggml.tokens"),
        token_types: meta["tokenizer.ggml.token_type"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap() as i32)
            .collect(),
        merges: strs("tokenizer.ggml.merges"),
        bos_token_id: id("tokenizer.ggml.bos_token_id"),
        eos_token_id: id("tokenizer.ggml.eos_token_id"),
        eot_token_id: id("tokenizer.ggml.eot_token_id"),
        pad_token_id: id("tokenizer.ggml.padding_token_id"),
        add_bos_token: meta
            .get("tokenizer.ggml.add_bos_token")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    }
}

#[test]
fn tokref() {
    let t = Instant::now();
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string("/tmp/tokref/gguf_meta.json").unwrap())
            .unwrap();
    let mut spec = spec_from_meta(&meta);
    println!("json parse {:?}", t.elapsed());
    if let Ok(pre) = std::env::var("PRE") {
        spec.pre = Some(pre);
    }
    let t = Instant::now();
    let tok = Tokenizer::from_gguf(spec).unwrap();
    println!("from_gguf {:?}", t.elapsed());
    let t = Instant::now();
    tok.encode("warm", false).unwrap();
    println!("plain copy {:?}", t.elapsed());
    println!("{tok:?}");

    // structure vs transformers' backend tokenizer
    let mine: Value = serde_json::from_str(&tok.inner().to_string(false).unwrap()).unwrap();
    let refj: Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::env::var("REFJSON").unwrap_or("/tmp/tokref/hf_tokenizer.json".into()),
        )
        .unwrap(),
    )
    .unwrap();
    for k in ["normalizer", "pre_tokenizer", "decoder", "added_tokens"] {
        if mine[k] != refj[k] {
            println!("DIFF {k}:\n mine {}\n ref  {}", mine[k], refj[k]);
        } else {
            println!("same {k}");
        }
    }
    for k in [
        "vocab",
        "merges",
        "unk_token",
        "byte_fallback",
        "fuse_unk",
        "ignore_merges",
        "dropout",
    ] {
        if mine["model"][k] != refj["model"][k] {
            println!(
                "DIFF model.{k}: {} vs {}",
                if k == "vocab" || k == "merges" {
                    "(big)".into()
                } else {
                    mine["model"][k].to_string()
                },
                if k == "vocab" || k == "merges" {
                    "(big)".into()
                } else {
                    refj["model"][k].to_string()
                }
            );
        } else {
            println!("same model.{k}");
        }
    }

    let cases: Vec<Value> = serde_json::from_str(
        &std::fs::read_to_string(
            std::env::var("CASES").unwrap_or("/tmp/tokref/tok_cases.json".into()),
        )
        .unwrap(),
    )
    .unwrap();
    let (mut ok, mut bad) = (0, 0);
    let t = Instant::now();
    for c in &cases {
        let text = c["text"].as_str().unwrap();
        let ids: Vec<u32> = c["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let plain: Vec<u32> = c["plain_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let got = tok.encode(text, true).unwrap();
        let got_plain = tok.encode(text, false).unwrap();
        let dec = tok.decode(&ids, false).unwrap();
        let dec_skip = tok.decode(&ids, true).unwrap();
        let dec_plain = tok.decode(&plain, false).unwrap();
        let mut streamed = String::new();
        let mut d = IncrementalDecoder::new(false);
        for &id in &ids {
            let p = d.push(&tok, id).unwrap();
            assert!(!p.contains('\u{fffd}') || text.contains('\u{fffd}'));
            streamed.push_str(&p);
        }
        streamed.push_str(&d.finish(&tok).unwrap());
        let all = got == ids
            && got_plain == plain
            && dec == c["decoded"].as_str().unwrap()
            && dec_skip == c["decoded_skip"].as_str().unwrap()
            && dec_plain == c["decoded_plain"].as_str().unwrap()
            && streamed == dec;
        if all {
            ok += 1
        } else {
            bad += 1;
            println!("MISMATCH {text:?}\n ids  {ids:?}\n got  {got:?}\n plain {plain:?}\n gotp {got_plain:?}\n dec {dec:?} / {:?}", c["decoded"]);
        }
    }
    println!("cases ok={ok} bad={bad} ({:?})", t.elapsed());
    assert_eq!(bad, 0);
}

#[test]
fn tplref() {
    use cachet_engine::chat_template::{ChatMessage, ChatTemplate, ChatTemplateError};
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string("/tmp/tokref/gguf_meta.json").unwrap())
            .unwrap();
    let qwen_src = meta["tokenizer.chat_template"]
        .as_str()
        .unwrap()
        .to_string();
    let tok = Tokenizer::from_gguf(spec_from_meta(&meta)).unwrap();
    let qwen = ChatTemplate::new(
        &qwen_src,
        tok.bos_token().as_deref(),
        tok.eos_token().as_deref(),
    )
    .unwrap();
    let cases: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string("/tmp/tokref/tpl_cases.json").unwrap())
            .unwrap();
    let (mut ok, mut bad) = (0, 0);
    for (i, c) in cases.iter().enumerate() {
        let messages: Vec<ChatMessage> = serde_json::from_value(c["messages"].clone()).unwrap();
        let gen = c["add_generation_prompt"].as_bool().unwrap();
        let tools = c.get("tools");
        let t = if c["t"] == "qwen" {
            None
        } else {
            Some(ChatTemplate::new(c["src"].as_str().unwrap(), Some("<s>"), Some("</s>")).unwrap())
        };
        let template = t.as_ref().unwrap_or(&qwen);
        let got = template.render(&messages, gen, tools);
        let good = match (&got, c["text"].as_str()) {
            (Ok(text), Some(expected)) => {
                let ids_ok = c.get("ids").map_or(true, |ids| {
                    let ids: Vec<u32> = ids
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v.as_u64().unwrap() as u32)
                        .collect();
                    tok.encode(text, true).unwrap() == ids
                });
                text == expected && ids_ok
            }
            (Err(ChatTemplateError::Raised(msg)), None) => {
                c["error"].as_str().unwrap().ends_with(msg.as_str())
            }
            _ => false,
        };
        if good {
            ok += 1
        } else {
            bad += 1;
            println!(
                "MISMATCH case {i} ({})\n got: {got:?}\n exp: {:?} {:?}",
                c["t"],
                c["text"],
                c.get("error")
            );
        }
    }
    println!("template cases ok={ok} bad={bad}");
    assert_eq!(bad, 0);
}
