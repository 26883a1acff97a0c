//! Building the tokenizer from GGUF metadata.
//!
//! A GGUF has no `tokenizer.json`; it stores the vocabulary, merges and special
//! ids under llama.cpp's keys. We rebuild exactly the tokenizer that Hugging Face
//! transformers builds from the same file
//! (`transformers/integrations/gguf/gguf_tokenizer_mapping.py`), because that is
//! the reference our ids are checked against:
//!
//! - model `gpt2`: BPE over the byte-level alphabet — no unknown token, no byte
//!   fallback. A token spelled with characters outside that alphabet is
//!   re-spelled as the byte symbols of its UTF-8 (as transformers does);
//! - pre-tokenizer: `Sequence[Split(Regex(<pre regex>), Isolated),
//!   ByteLevel(add_prefix_space=false, use_regex=false)]`, the regex chosen by
//!   `tokenizer.ggml.pre`; without a `pre` (or `default`), GPT-2's
//!   `ByteLevel(use_regex=true)`, which is what transformers leaves in place;
//! - **no normalizer**. Qwen's own `tokenizer.json` has an NFC normalizer, but
//!   the tokenizer transformers builds from the GGUF has none, and that is the
//!   reference; llama.cpp does not normalize either. So text in decomposed form
//!   (e.g. `e` + U+0301) is tokenized as written;
//! - decoder: `ByteLevel`;
//! - token type 3 (CONTROL) tokens become special added tokens
//!   (`normalized=false`), skipping any spelled outside the byte alphabet
//!   (a llama.cpp mislabel, skipped by transformers too); type 4 (USER_DEFINED,
//!   e.g. `<tool_call>`) become non-special added tokens; the BOS/EOS/padding
//!   tokens are made special added tokens if they are not added tokens yet.
//!
//! Deliberate differences from transformers, in cases that do not arise for
//! the Qwen2/Qwen2.5/Qwen3/Llama 3 files we serve: transformers' GPT-2 builder
//! also adds GPT-2's default `<|endoftext|>` as a special token (a new id when
//! the vocabulary lacks it) — we do not; and an unknown `tokenizer.ggml.pre` is
//! an error here, where transformers silently falls back to the GPT-2 split.
//!
//! BPE is built with `continuing_subword_prefix`/`end_of_word_suffix` unset
//! rather than `""` (transformers' spelling): the same merges, without an
//! allocation per character.

use std::fmt;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use super::{DeclaredSpecials, Tokenizer, TokenizerError};
use crate::gguf::GgufFile;

/// Qwen2 / Qwen2.5 / Qwen3 (`tokenizer.ggml.pre = "qwen2"`).
const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5 (`qwen35`): letters and combining marks together.
const QWEN35_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama 3 (`llama-bpe`, `llama3`, …): digits in groups of up to three.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Mistral's tekken.
const TEKKEN_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// GPT-4o / Llama 4.
const GPT4O_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// `tokenizer.ggml.pre` values and their split regexes (transformers' table).
const PRE_TOKENIZER_SPLITS: &[(&str, &str)] = &[
    ("qwen2", QWEN2_SPLIT),
    ("deepseek-r1-qwen", QWEN2_SPLIT),
    ("kormo", QWEN2_SPLIT),
    ("f2llmv2", QWEN2_SPLIT),
    ("megrez", QWEN2_SPLIT),
    ("qwen35", QWEN35_SPLIT),
    ("llama3", LLAMA3_SPLIT),
    ("llama-v3", LLAMA3_SPLIT),
    ("llama-bpe", LLAMA3_SPLIT),
    ("falcon3", LLAMA3_SPLIT),
    ("falcon-h1", LLAMA3_SPLIT),
    ("pixtral", LLAMA3_SPLIT),
    ("midm-2.0", LLAMA3_SPLIT),
    ("lfm2", LLAMA3_SPLIT),
    ("jina-v5-nano", LLAMA3_SPLIT),
    ("dbrx", LLAMA3_SPLIT),
    ("smaug-bpe", LLAMA3_SPLIT),
    ("tekken", TEKKEN_SPLIT),
    ("gpt-4o", GPT4O_SPLIT),
    ("llama4", GPT4O_SPLIT),
    ("kanana2", GPT4O_SPLIT),
    ("talkie", GPT4O_SPLIT),
    ("minimax-m2", GPT4O_SPLIT),
];

/// `pre` values meaning GPT-2's own split.
const GPT2_PRE: &[&str] = &["default", "gpt2", "gpt-2"];

/// For the error message.
pub(super) fn supported_pre_tokenizers() -> String {
    let mut names: Vec<&str> = PRE_TOKENIZER_SPLITS.iter().map(|(name, _)| *name).collect();
    names.extend_from_slice(GPT2_PRE);
    names.join(", ")
}

/// The tokenizer fields of a GGUF file's metadata, as plain data.
///
/// Field names follow the GGUF keys (`tokenizer.ggml.*`).
#[derive(Clone, Default, PartialEq)]
pub struct GgufTokenizerSpec {
    /// `tokenizer.ggml.model`, e.g. `"gpt2"` (byte-level BPE).
    pub model: String,
    /// `tokenizer.ggml.pre`, e.g. `"qwen2"` or `"llama-bpe"`.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: the vocabulary, index = id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`: one per token (see the `TOKEN_*` constants);
    /// may be empty, meaning all normal.
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges`: `"left right"`, best first.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_token_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_token_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id`.
    pub eot_token_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad_token_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos_token: bool,
}

impl fmt::Debug for GgufTokenizerSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufTokenizerSpec")
            .field("model", &self.model)
            .field("pre", &self.pre)
            .field("tokens", &self.tokens.len())
            .field("token_types", &self.token_types.len())
            .field("merges", &self.merges.len())
            .field("bos_token_id", &self.bos_token_id)
            .field("eos_token_id", &self.eos_token_id)
            .field("eot_token_id", &self.eot_token_id)
            .field("pad_token_id", &self.pad_token_id)
            .field("add_bos_token", &self.add_bos_token)
            .finish()
    }
}

impl GgufTokenizerSpec {
    /// Token type: an ordinary vocabulary entry.
    pub const TOKEN_NORMAL: i32 = 1;
    /// Token type: the unknown token.
    pub const TOKEN_UNKNOWN: i32 = 2;
    /// Token type: a control token such as `<|im_start|>` (special).
    pub const TOKEN_CONTROL: i32 = 3;
    /// Token type: a user-defined token such as `<tool_call>` (matched whole, not special).
    pub const TOKEN_USER_DEFINED: i32 = 4;
    /// Token type: an unused padding entry such as `[PAD151665]`.
    pub const TOKEN_UNUSED: i32 = 5;
    /// Token type: a byte token (`<0x0A>`, sentencepiece byte fallback).
    pub const TOKEN_BYTE: i32 = 6;

    /// A spec whose vocabulary is the 256 byte-level symbols (ids 0..=255, in
    /// GPT-2's order, `!` first), with no merges: a base for small test vocabularies.
    pub fn byte_alphabet(model: &str, pre: Option<&str>) -> Self {
        let byte_chars = byte_to_char();
        let mut order: Vec<u8> = Vec::with_capacity(256);
        order.extend((0u8..=255).filter(|&b| is_printable_byte(b)));
        order.extend((0u8..=255).filter(|&b| !is_printable_byte(b)));
        let tokens: Vec<String> = order.into_iter().map(|b| byte_chars[b as usize].to_string()).collect();
        Self {
            model: model.to_string(),
            pre: pre.map(str::to_string),
            token_types: vec![Self::TOKEN_NORMAL; tokens.len()],
            tokens,
            ..Self::default()
        }
    }

    /// Appends a token of the given type and returns its id.
    pub fn push_token(&mut self, token: &str, token_type: i32) -> u32 {
        let id = self.tokens.len() as u32;
        self.tokens.push(token.to_string());
        self.token_types.push(token_type);
        id
    }
}

impl GgufTokenizerSpec {
    /// Reads the `tokenizer.ggml.*` keys of a parsed GGUF file.
    ///
    /// Errors: `tokenizer.ggml.model` or `tokenizer.ggml.tokens` missing, or a
    /// key of the wrong type.
    pub fn from_gguf_file(file: &GgufFile) -> Result<Self, TokenizerError> {
        let invalid = |e: crate::gguf::GgufError| TokenizerError::InvalidSpec(e.to_string());
        let missing = |key: &str| TokenizerError::InvalidSpec(format!("the GGUF file has no {key}"));
        let id = |key: &str| -> Result<Option<u32>, TokenizerError> {
            match file.get_u64(key).map_err(invalid)? {
                None => Ok(None),
                Some(v) => u32::try_from(v)
                    .map(Some)
                    .map_err(|_| TokenizerError::InvalidSpec(format!("{key} = {v} is not a token id"))),
            }
        };
        let token_types = file
            .get_ints("tokenizer.ggml.token_type")
            .map_err(invalid)?
            .unwrap_or_default()
            .into_iter()
            .map(|t| i32::try_from(t).map_err(|_| TokenizerError::InvalidSpec(format!("token type {t}"))))
            .collect::<Result<Vec<i32>, _>>()?;
        Ok(Self {
            model: file
                .get_str("tokenizer.ggml.model")
                .map_err(invalid)?
                .ok_or_else(|| missing("tokenizer.ggml.model"))?
                .to_string(),
            pre: file.get_str("tokenizer.ggml.pre").map_err(invalid)?.map(str::to_string),
            tokens: file
                .get_strings("tokenizer.ggml.tokens")
                .map_err(invalid)?
                .ok_or_else(|| missing("tokenizer.ggml.tokens"))?,
            token_types,
            merges: file.get_strings("tokenizer.ggml.merges").map_err(invalid)?.unwrap_or_default(),
            bos_token_id: id("tokenizer.ggml.bos_token_id")?,
            eos_token_id: id("tokenizer.ggml.eos_token_id")?,
            eot_token_id: id("tokenizer.ggml.eot_token_id")?,
            pad_token_id: id("tokenizer.ggml.padding_token_id")?,
            add_bos_token: file.get_bool("tokenizer.ggml.add_bos_token").map_err(invalid)?.unwrap_or(false),
        })
    }
}

impl Tokenizer {
    /// The tokenizer of a parsed GGUF file ([`GgufTokenizerSpec::from_gguf_file`]
    /// then [`Tokenizer::from_gguf`]).
    pub fn from_gguf_file(file: &GgufFile) -> Result<Self, TokenizerError> {
        Tokenizer::from_gguf(GgufTokenizerSpec::from_gguf_file(file)?)
    }

    /// Builds the tokenizer a GGUF file describes (the header of `tokenizer/gguf.rs` lists
    /// exactly what is built). Takes the spec by value to move the vocabulary.
    ///
    /// Errors: an unsupported `model` or `pre`, inconsistent metadata (token
    /// types not one per token, a special id out of range, a malformed merge, a
    /// merge whose parts or result are not in the vocabulary).
    pub fn from_gguf(spec: GgufTokenizerSpec) -> Result<Self, TokenizerError> {
        if spec.model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel(spec.model));
        }
        let pre_tokenizer = pre_tokenizer(spec.pre.as_deref())?;
        let n_tokens = spec.tokens.len();
        if !spec.token_types.is_empty() && spec.token_types.len() != n_tokens {
            return Err(TokenizerError::InvalidSpec(format!(
                "{} token types for {n_tokens} tokens",
                spec.token_types.len()
            )));
        }
        for (what, id) in [
            ("bos", spec.bos_token_id),
            ("eos", spec.eos_token_id),
            ("eot", spec.eot_token_id),
            ("padding", spec.pad_token_id),
        ] {
            if let Some(id) = id.filter(|&id| id as usize >= n_tokens) {
                return Err(TokenizerError::InvalidSpec(format!(
                    "{what} token id {id} is outside the vocabulary ({n_tokens} tokens)"
                )));
            }
        }

        let byte_chars = byte_to_char();
        let in_alphabet = |token: &str| token.chars().all(is_byte_char);
        let type_of = |id: usize| spec.token_types.get(id).copied();
        let control: Vec<AddedToken> = (0..n_tokens)
            .filter(|&id| type_of(id) == Some(GgufTokenizerSpec::TOKEN_CONTROL))
            .filter(|&id| in_alphabet(&spec.tokens[id]))
            .map(|id| AddedToken::from(spec.tokens[id].clone(), true).normalized(false))
            .collect();
        let user_defined: Vec<AddedToken> = (0..n_tokens)
            .filter(|&id| type_of(id) == Some(GgufTokenizerSpec::TOKEN_USER_DEFINED))
            // transformers adds one only if its spelling is in the vocabulary
            .filter(|&id| in_alphabet(&spec.tokens[id]))
            .map(|id| AddedToken::from(spec.tokens[id].clone(), false).normalized(false))
            .collect();
        let named: Vec<String> = [spec.bos_token_id, spec.eos_token_id, spec.pad_token_id]
            .into_iter()
            .flatten()
            .map(|id| spec.tokens[id as usize].clone())
            .filter(|token| in_alphabet(token))
            .collect();

        let mut merges = Vec::with_capacity(spec.merges.len());
        for (rank, merge) in spec.merges.iter().enumerate() {
            let mut parts = merge.split(' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some(left), Some(right), None) => merges.push((left.to_string(), right.to_string())),
                _ => {
                    return Err(TokenizerError::InvalidSpec(format!(
                        "merge {rank} {merge:?} is not two tokens separated by one space"
                    )))
                }
            }
        }

        // Later duplicates win, as in transformers' dict comprehension.
        let mut vocab = Vocab::with_capacity(n_tokens);
        for (id, token) in spec.tokens.into_iter().enumerate() {
            let key = if in_alphabet(&token) {
                token
            } else {
                token.bytes().map(|b| byte_chars[b as usize]).collect::<String>()
            };
            vocab.insert(key, id as u32);
        }

        let bpe =
            BPE::builder().vocab_and_merges(vocab, merges).build().map_err(|e| TokenizerError::Build(e.to_string()))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(pre_tokenizer));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        let build_err = |e: tokenizers::Error| TokenizerError::Build(e.to_string());
        inner.add_special_tokens(control).map_err(build_err)?;
        inner.add_tokens(user_defined).map_err(build_err)?;
        let already_added = inner.get_added_vocabulary().get_vocab().clone();
        let named: Vec<AddedToken> = named
            .into_iter()
            .filter(|token| !already_added.contains_key(token))
            .map(|token| AddedToken::from(token, true).normalized(false))
            .collect();
        inner.add_special_tokens(named).map_err(build_err)?;

        Tokenizer::from_parts(
            inner,
            DeclaredSpecials {
                bos: spec.bos_token_id,
                eos: spec.eos_token_id,
                eot: spec.eot_token_id,
                pad: spec.pad_token_id,
                extra_eos: Vec::new(),
                add_bos: spec.add_bos_token,
            },
            Some(n_tokens),
        )
    }
}

/// The pre-tokenizer for a `tokenizer.ggml.pre` value.
fn pre_tokenizer(pre: Option<&str>) -> Result<PreTokenizerWrapper, TokenizerError> {
    let pre = pre.unwrap_or("default");
    if GPT2_PRE.contains(&pre) {
        return Ok(ByteLevel::new(false, true, true).into());
    }
    let Some(&(_, regex)) = PRE_TOKENIZER_SPLITS.iter().find(|(name, _)| *name == pre) else {
        return Err(TokenizerError::UnsupportedPreTokenizer(pre.to_string()));
    };
    let split = Split::new(SplitPattern::Regex(regex.to_string()), SplitDelimiterBehavior::Isolated, false)
        .map_err(|e| TokenizerError::Build(format!("pre-tokenizer regex for {pre:?}: {e}")))?;
    Ok(Sequence::new(vec![split.into(), ByteLevel::new(false, true, false).into()]).into())
}

/// Bytes GPT-2 spells as themselves: `!`..=`~`, `¡`..=`¬`, `®`..=`ÿ`.
fn is_printable_byte(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// GPT-2's `bytes_to_unicode`: printable bytes map to themselves, the other 68
/// to U+0100.. in byte order.
pub(super) fn byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 0x100u32;
    for b in 0..=255u8 {
        table[b as usize] = if is_printable_byte(b) {
            char::from(b)
        } else {
            let c = char::from_u32(next).unwrap_or(char::REPLACEMENT_CHARACTER);
            next += 1;
            c
        };
    }
    table
}

/// Whether `c` is one of the 256 byte-level symbols.
fn is_byte_char(c: char) -> bool {
    let code = c as u32;
    (code < 0x100 && is_printable_byte(code as u8)) || (0x100..0x100 + 68).contains(&code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_alphabet_matches_gpt2_bytes_to_unicode() {
        let table = byte_to_char();
        assert_eq!(table[b' ' as usize], 'Ġ');
        assert_eq!(table[b'\n' as usize], 'Ċ');
        assert_eq!(table[b'\t' as usize], 'ĉ');
        assert_eq!(table[0xAD], 'Ń');
        assert_eq!(table[b'a' as usize], 'a');
        let distinct: std::collections::HashSet<char> = table.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
        assert!(table.iter().all(|&c| is_byte_char(c)));
        assert!(!is_byte_char(' '));
        assert!(!is_byte_char('é') || table.contains(&'é'));
        let spec = GgufTokenizerSpec::byte_alphabet("gpt2", None);
        assert_eq!(spec.tokens[0], "!");
        assert_eq!(spec.tokens.len(), 256);
    }

    #[test]
    fn reads_the_spec_from_a_gguf_file() {
        use crate::gguf::{GgufWriter, Value, ValueType};
        let (spec, _) = crate::tokenizer::tests::tiny_spec();
        let mut writer = GgufWriter::new();
        writer
            .metadata("tokenizer.ggml.model", Value::String(spec.model.clone()))
            .metadata("tokenizer.ggml.pre", Value::String("qwen2".into()))
            .metadata("tokenizer.ggml.tokens", Value::strings(&spec.tokens))
            .metadata(
                "tokenizer.ggml.token_type",
                Value::Array(ValueType::I32, spec.token_types.iter().map(|&t| Value::I32(t)).collect()),
            )
            .metadata("tokenizer.ggml.merges", Value::strings(&spec.merges))
            .metadata("tokenizer.ggml.bos_token_id", Value::U32(spec.bos_token_id.unwrap()))
            .metadata("tokenizer.ggml.eos_token_id", Value::U32(spec.eos_token_id.unwrap()))
            .metadata("tokenizer.ggml.padding_token_id", Value::U32(spec.pad_token_id.unwrap()))
            .metadata("tokenizer.ggml.add_bos_token", Value::Bool(false));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        writer.write(&path).unwrap();
        let file = GgufFile::open(&path).unwrap();
        assert_eq!(GgufTokenizerSpec::from_gguf_file(&file).unwrap(), spec);

        let mut writer = GgufWriter::new();
        writer.metadata("tokenizer.ggml.model", Value::String("gpt2".into()));
        writer.write(&path).unwrap();
        let err = GgufTokenizerSpec::from_gguf_file(&GgufFile::open(&path).unwrap()).unwrap_err();
        assert!(err.to_string().contains("tokenizer.ggml.tokens"), "{err}");
    }

    #[test]
    fn unknown_pre_tokenizer_is_an_error() {
        let spec = GgufTokenizerSpec::byte_alphabet("gpt2", Some("made-up"));
        let err = Tokenizer::from_gguf(spec).unwrap_err();
        assert!(matches!(err, TokenizerError::UnsupportedPreTokenizer(ref p) if p == "made-up"));
        assert!(err.to_string().contains("qwen2"), "{err}");
    }

    #[test]
    fn every_listed_pre_tokenizer_builds() {
        for pre in PRE_TOKENIZER_SPLITS.iter().map(|(n, _)| *n).chain(GPT2_PRE.iter().copied()) {
            let spec = GgufTokenizerSpec::byte_alphabet("gpt2", Some(pre));
            let tokenizer = Tokenizer::from_gguf(spec).unwrap();
            let ids = tokenizer.encode("Hello, wörld 123!\n", true).unwrap();
            assert_eq!(tokenizer.decode(&ids, false).unwrap(), "Hello, wörld 123!\n");
        }
    }
}
