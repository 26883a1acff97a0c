//! Entry points of the fuzz targets (`fuzz/`, run with cargo-fuzz by `scripts/fuzz.sh`) and of
//! the replay of their committed corpus (`tests/tests/fuzz_corpus.rs`, part of the test suite).
//! Each takes arbitrary bytes and must return, whatever they hold: an `Err` is fine, a panic, a
//! hang or an unbounded allocation is a bug. Not an API for anything else.

use crate::openai::responses::ResponseRequest;
use crate::openai::tools::{self, parse::ToolSet, ToolFields};
use crate::openai::types::{ChatCompletionRequest, CompletionRequest};
use cachet_engine::chat_template::{ChatMessage, ChatTemplate};
use cachet_engine::gguf::GgufFile;
use cachet_engine::tokenizer::{IncrementalDecoder, Tokenizer};
use serde_json::Value;
use std::sync::{Arc, OnceLock};

/// The default model file, where the tokenizer and chat template targets find the real
/// tokenizer and template (`CACHET_FUZZ_MODEL` overrides; without it they use a tiny vocabulary
/// and a ChatML template).
fn model() -> Option<&'static GgufFile> {
    static MODEL: OnceLock<Option<GgufFile>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let path = std::env::var_os("CACHET_FUZZ_MODEL").map(std::path::PathBuf::from).unwrap_or_else(|| {
                crate::models::models_dir().join(crate::models::ModelSpec::default_model().file_name)
            });
            GgufFile::open(&path).ok()
        })
        .as_ref()
}

fn tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        if let Some(t) = model().and_then(|m| Tokenizer::from_gguf_file(m).ok()) {
            return t;
        }
        let dir = tempfile::tempdir().expect("a temporary folder");
        let path = dir.path().join("tiny.gguf");
        cachet_engine::testing::Tiny::random(cachet_engine::testing::TinyArch::Qwen2, 1, false)
            .write_gguf(cachet_kernels::quant::DType::F32, &path)
            .expect("the tiny model");
        Tokenizer::from_gguf_file(&GgufFile::open(&path).expect("its GGUF")).expect("its tokenizer")
    })
}

const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

fn template() -> &'static ChatTemplate {
    static TEMPLATE: OnceLock<ChatTemplate> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let source = model().and_then(|m| m.get_str("tokenizer.chat_template").ok().flatten()).unwrap_or(CHATML);
        ChatTemplate::new(source, None, Some("<|im_end|>")).expect("the chat template compiles")
    })
}

/// The GGUF reader: headers, metadata, tensor table and every tensor's bytes, then the
/// tokenizer and chat template a file describes.
pub fn gguf(data: &[u8]) {
    let Ok(file) = GgufFile::parse(Arc::new(data.to_vec())) else { return };
    for (key, _) in file.metadata() {
        let _ = file.get_str(key);
        let _ = file.get_u64(key);
        let _ = file.get_strings(key);
        let _ = file.get_ints(key);
    }
    for info in file.tensors() {
        let _ = file.tensor(&info.name);
    }
    if let Ok(t) = Tokenizer::from_gguf_file(&file) {
        let _ = t.encode("fn main() { println!(\"hi\"); }", true);
    }
    if let Ok(Some(source)) = file.get_str("tokenizer.chat_template") {
        if let Ok(t) = ChatTemplate::new(source, None, None) {
            let _ = t.render(&[ChatMessage::user("hi")], true, None);
        }
    }
}

/// The tokenizer: text (special tokens parsed or not) and token ids (decoded whole and one at a
/// time, as a stream is).
pub fn tokenizer_bytes(data: &[u8]) {
    let t = tokenizer();
    let text = String::from_utf8_lossy(data);
    for special in [true, false] {
        if let Ok(ids) = t.encode(&text, special) {
            let _ = t.decode(&ids, false);
        }
    }
    let vocab = t.vocab_size() as u32 + 8;
    let ids: Vec<u32> = data.chunks(2).map(|c| u32::from(c[0]) << 8 | u32::from(*c.get(1).unwrap_or(&0))).collect();
    let ids: Vec<u32> = ids.iter().map(|&i| i % vocab).collect();
    let _ = t.decode(&ids, true);
    let mut stream = IncrementalDecoder::new(false);
    for &id in &ids {
        let _ = stream.push(t, id);
    }
    let _ = stream.finish(t);
}

/// The chat template: arbitrary messages (a JSON list) with or without tools.
pub fn chat_template(data: &[u8]) {
    let Ok(value) = serde_json::from_slice::<Value>(data) else { return };
    let (messages, tools) = match &value {
        Value::Object(o) => (o.get("messages").cloned().unwrap_or_default(), o.get("tools").cloned()),
        other => (other.clone(), None),
    };
    let Ok(messages) = serde_json::from_value::<Vec<ChatMessage>>(messages) else { return };
    for add in [true, false] {
        let _ = template().render(&messages, add, tools.as_ref());
    }
}

/// The OpenAI request parsers: a chat completion's messages and tools (planned as for a Qwen
/// model's template), a completion, a Responses API request's input and tools.
pub fn openai_request(data: &[u8]) {
    if let Ok(body) = serde_json::from_slice::<ChatCompletionRequest>(data) {
        let _ = crate::openai::chat::messages(&body);
        let _ = tools::plan(ToolFields::of(&body.tooling, body.sampling.grammar.as_ref()), template().source());
    }
    let _ = serde_json::from_slice::<CompletionRequest>(data);
    if let Ok(r) = serde_json::from_slice::<ResponseRequest>(data) {
        let _ = crate::openai::responses::conversation(r.instructions.as_deref(), &r.input);
        let _ = crate::openai::responses::chat_tools(r.tools.as_ref());
        let _ = crate::openai::responses::chat_tool_choice(r.tool_choice.as_ref());
        let _ = crate::openai::responses::response_format(r.text.as_ref());
    }
}

/// The push webhook: its signature header (the first line) checked against a secret, and its
/// payload (the rest).
pub fn webhook_payload(data: &[u8]) {
    let (signature, body) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (std::str::from_utf8(&data[..i]).ok(), &data[i + 1..]),
        None => (None, data),
    };
    let _ = crate::routes::webhooks::verify("whsec_fuzz", body, signature);
    let _ = serde_json::from_slice::<crate::routes::webhooks::Push>(body);
}

/// The tool-call parser: a tool list (JSON, up to the first NUL byte) and a model's output (the
/// rest), parsed whole and as a stream in chunks of a size the input chooses.
pub fn tool_calls(data: &[u8]) {
    let (tools, text) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&b"[]"[..], data),
    };
    let tools: Vec<(String, Value)> = match serde_json::from_slice::<Vec<Value>>(tools) {
        Ok(list) => list
            .into_iter()
            .filter_map(|t| {
                Some((t.get("name")?.as_str()?.to_string(), t.get("parameters").cloned().unwrap_or_default()))
            })
            .collect(),
        Err(_) => vec![(
            "read_file".into(),
            serde_json::json!({"type": "object", "properties": {"path": {"type": "string"}}}),
        )],
    };
    let set = ToolSet { tools, custom: vec!["apply_patch".into()] };
    let text = String::from_utf8_lossy(text);
    let _ = tools::parse::parse_all(&set, &text);
    let chunk = 1 + text.len() % 7;
    let mut parser = tools::parse::CallParser::new(set);
    let chars: Vec<char> = text.chars().collect();
    for piece in chars.chunks(chunk) {
        let _ = parser.push(&piece.iter().collect::<String>());
    }
    let _ = parser.finish();
}
