//! Loading a Hugging Face `tokenizer.json` and the special ids around it.
//!
//! Special ids come from, in order of preference:
//! - `tokenizer_config.json`: `bos_token` / `eos_token` / `pad_token` (a string
//!   or an `AddedToken` object with `content`), `add_bos_token`. A key present
//!   with `null` means "none" and is not looked up further, as in transformers;
//! - `config.json`: `bos_token_id` / `eos_token_id` / `pad_token_id` (an
//!   `eos_token_id` list adds every entry to the end-of-generation ids);
//! - `generation_config.json`: `eos_token_id` (int or list), added to the
//!   end-of-generation ids.
//!
//! Truncation and padding configured in `tokenizer.json` are switched off: the
//! engine always wants every token of a prompt.

use std::path::Path;

use serde_json::Value;

use super::{DeclaredSpecials, Tokenizer, TokenizerError};

impl Tokenizer {
    /// Loads a Hugging Face `tokenizer.json`, reading the special ids from the
    /// `tokenizer_config.json`, `config.json` and `generation_config.json` next
    /// to it when they exist (the header of `tokenizer/hf.rs` gives the order).
    ///
    /// Errors: the file is missing or not a valid `tokenizer.json`, a config
    /// file that exists is not valid JSON, or a declared special id is outside
    /// the vocabulary.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, TokenizerError> {
        let path = path.as_ref();
        let load_err = |message: String| TokenizerError::Load { path: path.to_path_buf(), message };
        let mut inner = tokenizers::Tokenizer::from_file(path).map_err(|e| load_err(e.to_string()))?;
        inner.with_truncation(None).map_err(|e| load_err(e.to_string()))?;
        inner.with_padding(None);

        let dir = path.parent().unwrap_or(Path::new("."));
        let tokenizer_config = read_optional_json(&dir.join("tokenizer_config.json"))?;
        let config = read_optional_json(&dir.join("config.json"))?;
        let generation_config = read_optional_json(&dir.join("generation_config.json"))?;
        let declared =
            declared_specials(&inner, tokenizer_config.as_ref(), config.as_ref(), generation_config.as_ref());
        Tokenizer::from_parts(inner, declared, None)
    }
}

/// Reads a JSON file if it exists.
fn read_optional_json(path: &Path) -> Result<Option<Value>, TokenizerError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(TokenizerError::Load { path: path.to_path_buf(), message: e.to_string() }),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| TokenizerError::Load { path: path.to_path_buf(), message: e.to_string() })
}

/// Resolves the special ids from the config files.
fn declared_specials(
    inner: &tokenizers::Tokenizer,
    tokenizer_config: Option<&Value>,
    config: Option<&Value>,
    generation_config: Option<&Value>,
) -> DeclaredSpecials {
    // `Some(None)`: the tokenizer config names no such token; `None`: it does not say.
    let named = |key: &str| -> Option<Option<u32>> {
        let value = tokenizer_config?.get(key)?;
        let content = match value {
            Value::String(s) => Some(s.as_str()),
            Value::Object(map) => map.get("content").and_then(Value::as_str),
            _ => None,
        };
        Some(content.and_then(|token| inner.token_to_id(token)))
    };
    let ids = |config: Option<&Value>, key: &str| -> Vec<u32> {
        match config.and_then(|c| c.get(key)) {
            Some(Value::Number(n)) => n.as_u64().and_then(|v| u32::try_from(v).ok()).into_iter().collect(),
            Some(Value::Array(items)) => {
                items.iter().filter_map(|v| v.as_u64().and_then(|v| u32::try_from(v).ok())).collect()
            }
            _ => Vec::new(),
        }
    };
    let config_eos = ids(config, "eos_token_id");
    let mut extra_eos = config_eos.clone();
    extra_eos.extend(ids(generation_config, "eos_token_id"));

    DeclaredSpecials {
        bos: named("bos_token").unwrap_or_else(|| ids(config, "bos_token_id").first().copied()),
        eos: named("eos_token").unwrap_or_else(|| config_eos.first().copied()),
        eot: None,
        pad: named("pad_token").unwrap_or_else(|| ids(config, "pad_token_id").first().copied()),
        extra_eos,
        add_bos: tokenizer_config.and_then(|c| c.get("add_bos_token")).and_then(Value::as_bool).unwrap_or(false),
    }
}
