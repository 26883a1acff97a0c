//! Text ⇄ token ids.
//!
//! [`Tokenizer`] wraps a [`tokenizers::Tokenizer`] and is built one of two ways:
//!
//! - from a GGUF file's tokenizer metadata ([`Tokenizer::from_gguf`] with a
//!   [`GgufTokenizerSpec`]): byte-level BPE rebuilt exactly the way Hugging Face
//!   transformers rebuilds it from the same file (details in `tokenizer/gguf.rs`);
//! - from a Hugging Face `tokenizer.json` ([`Tokenizer::from_file`]), with the
//!   special ids taken from the neighbouring `tokenizer_config.json`,
//!   `config.json` and `generation_config.json` where present.
//!
//! Encoding never adds BOS/EOS by itself: prompts come from the chat template,
//! which writes its own special tokens (Hugging Face's `apply_chat_template`
//! tokenizes with `add_special_tokens=False` too). [`Tokenizer::add_bos_token`]
//! tells a caller building a raw (non-chat) prompt whether the model wants one.
//!
//! [`IncrementalDecoder`] turns a stream of generated ids into text pieces that
//! are always whole UTF-8 characters.
//!
//! ```
//! use cachet_engine::tokenizer::{GgufTokenizerSpec, Tokenizer};
//!
//! // A toy byte-level vocabulary: the 256 byte symbols, one merge and a control token.
//! let mut spec = GgufTokenizerSpec::byte_alphabet("gpt2", Some("qwen2"));
//! spec.push_token("hi", 1);
//! spec.merges.push("h i".to_string());
//! let end = spec.push_token("<|im_end|>", 3);
//! spec.eos_token_id = Some(end);
//!
//! let tokenizer = Tokenizer::from_gguf(spec).unwrap();
//! let ids = tokenizer.encode("hi<|im_end|>", true).unwrap();
//! assert_eq!(ids, vec![256, end]);
//! assert_eq!(tokenizer.decode(&ids, true).unwrap(), "hi");
//! assert_eq!(tokenizer.eos_ids(), vec![end]);
//! ```

mod gguf;
mod hf;
mod incremental;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::OnceLock;

use tokenizers::Model as _;

pub use gguf::GgufTokenizerSpec;
pub use incremental::IncrementalDecoder;

/// Names of control tokens that end generation in the model families we serve,
/// in addition to the file's own EOS/EOT ids.
const END_OF_TURN_TOKENS: [&str; 5] = ["<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end|>"];

/// Why a tokenizer could not be built, or could not encode or decode.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// The GGUF `tokenizer.ggml.model` is not one we can build.
    #[error("unsupported GGUF tokenizer model {0:?} (supported: \"gpt2\", byte-level BPE)")]
    UnsupportedModel(String),
    /// The GGUF `tokenizer.ggml.pre` names a pre-tokenizer we do not know.
    #[error("unsupported GGUF pre-tokenizer {0:?} (supported: {supported})", supported = gguf::supported_pre_tokenizers())]
    UnsupportedPreTokenizer(String),
    /// The tokenizer metadata is inconsistent (lengths, ids, merges).
    #[error("invalid tokenizer metadata: {0}")]
    InvalidSpec(String),
    /// The `tokenizers` library refused to build the tokenizer.
    #[error("cannot build the tokenizer: {0}")]
    Build(String),
    /// A tokenizer or config file could not be read or parsed.
    #[error("cannot load {path}: {message}")]
    Load {
        /// The file that failed.
        path: std::path::PathBuf,
        /// What went wrong.
        message: String,
    },
    /// Encoding failed inside the `tokenizers` library.
    #[error("cannot encode text: {0}")]
    Encode(String),
    /// Decoding failed inside the `tokenizers` library.
    #[error("cannot decode ids: {0}")]
    Decode(String),
    /// An id outside the vocabulary was given to decode.
    #[error("token id {id} is outside the vocabulary (size {vocab_size})")]
    UnknownTokenId {
        /// The offending id.
        id: u32,
        /// The size of the id space.
        vocab_size: usize,
    },
}

/// The special ids a tokenizer source declares (GGUF metadata or HF configs).
#[derive(Debug, Clone, Default)]
pub(crate) struct DeclaredSpecials {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub pad: Option<u32>,
    /// Further ids declared as ending generation (e.g. `generation_config.json`'s list).
    pub extra_eos: Vec<u32>,
    pub add_bos: bool,
}

/// A tokenizer for one model: encode, decode and its special tokens.
///
/// Cheap to share behind an `Arc`; all methods take `&self` and it is `Send + Sync`.
#[derive(Clone)]
pub struct Tokenizer {
    /// Splits special tokens out of the text (for rendered chat templates).
    inner: tokenizers::Tokenizer,
    /// A copy that leaves special tokens as plain text (for untrusted text);
    /// built on first use, because it duplicates the vocabulary in memory.
    plain: OnceLock<tokenizers::Tokenizer>,
    /// Size of the id space: one past the largest id.
    vocab_size: usize,
    bos: Option<u32>,
    eos: Option<u32>,
    eos_ids: Vec<u32>,
    /// Ids of the special added tokens, sorted.
    special_ids: Vec<u32>,
    add_bos: bool,
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eos_ids", &self.eos_ids)
            .field("special_ids", &self.special_ids.len())
            .field("add_bos", &self.add_bos)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Wraps a built `tokenizers::Tokenizer` and resolves its special tokens.
    /// `id_space` is the number of ids when the source knows it (a GGUF's token
    /// count); otherwise it is one past the largest id in the vocabulary.
    pub(crate) fn from_parts(
        inner: tokenizers::Tokenizer,
        declared: DeclaredSpecials,
        id_space: Option<usize>,
    ) -> Result<Self, TokenizerError> {
        let added = inner.get_added_tokens_decoder();
        let max_added = added.keys().map(|&id| id as usize + 1).max().unwrap_or(0);
        let model_ids = id_space
            .unwrap_or_else(|| inner.get_model().get_vocab().values().map(|&id| id as usize + 1).max().unwrap_or(0));
        let vocab_size = model_ids.max(max_added);
        let mut special_ids: Vec<u32> = added.iter().filter(|(_, token)| token.special).map(|(&id, _)| id).collect();
        special_ids.sort_unstable();

        for (what, id) in [("bos", declared.bos), ("eos", declared.eos), ("eot", declared.eot), ("pad", declared.pad)] {
            if let Some(id) = id {
                if id as usize >= vocab_size {
                    return Err(TokenizerError::InvalidSpec(format!(
                        "{what} token id {id} is outside the vocabulary (size {vocab_size})"
                    )));
                }
            }
        }

        let mut eos_ids = Vec::new();
        let mut push = |id: u32| {
            if (id as usize) < vocab_size && !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        };
        declared.eos.into_iter().for_each(&mut push);
        declared.eot.into_iter().for_each(&mut push);
        declared.extra_eos.iter().copied().for_each(&mut push);
        for name in END_OF_TURN_TOKENS {
            if let Some(id) = inner.token_to_id(name) {
                if special_ids.binary_search(&id).is_ok() {
                    push(id);
                }
            }
        }

        Ok(Self {
            inner,
            plain: OnceLock::new(),
            vocab_size,
            bos: declared.bos,
            eos: declared.eos,
            eos_ids,
            special_ids,
            add_bos: declared.add_bos,
        })
    }

    /// Encodes `text` to token ids, without adding BOS/EOS.
    ///
    /// With `parse_special` set, special tokens written in the text (such as
    /// `<|im_start|>`) become their ids: use it for text the server rendered,
    /// like a chat template's output. Without it, special tokens are encoded as
    /// the plain text they spell: use it for untrusted content, so a user cannot
    /// inject control tokens. Non-special added tokens (GGUF "user-defined"
    /// tokens such as `<tool_call>`) are matched whole either way, as llama.cpp
    /// and Hugging Face's `split_special_tokens=True` do.
    ///
    /// The first call with `parse_special == false` copies the tokenizer once
    /// (tens of MB for a 150k vocabulary), since `tokenizers` keeps that switch
    /// on the tokenizer rather than per call.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let tokenizer = if parse_special {
            &self.inner
        } else {
            self.plain.get_or_init(|| {
                let mut plain = self.inner.clone();
                plain.set_encode_special_tokens(true);
                plain
            })
        };
        let encoding = tokenizer.encode_fast(text, false).map_err(|e| TokenizerError::Encode(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Decodes ids to text; with `skip_special`, special tokens are left out.
    ///
    /// Byte sequences that are not valid UTF-8 become U+FFFD, as in Hugging Face.
    /// An id outside the vocabulary is an error.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(TokenizerError::UnknownTokenId { id, vocab_size: self.vocab_size });
        }
        self.inner.decode(ids, skip_special).map_err(|e| TokenizerError::Decode(e.to_string()))
    }

    /// Size of the id space (one past the largest id). The model's embedding
    /// table may be larger (padding rows).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The id of a token given in its vocabulary spelling (e.g. `"<|im_end|>"`, `"Ġthe"`).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The vocabulary spelling of an id (byte-level symbols for BPE tokens).
    pub fn token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The ids that end generation: EOS, EOT, any extra ones the configs
    /// declare, and `<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, `<|eom_id|>`,
    /// `<|end|>` when they exist as special tokens. No duplicates; EOS first.
    pub fn eos_ids(&self) -> Vec<u32> {
        self.eos_ids.clone()
    }

    /// The declared end-of-sequence id.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// The declared beginning-of-sequence id.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// The BOS token's text (passed to chat templates as `bos_token`).
    pub fn bos_token(&self) -> Option<String> {
        self.bos.and_then(|id| self.token(id))
    }

    /// The EOS token's text (passed to chat templates as `eos_token`).
    pub fn eos_token(&self) -> Option<String> {
        self.eos.and_then(|id| self.token(id))
    }

    /// Whether a raw (non-chat) prompt should start with BOS, as the model's
    /// metadata says (`tokenizer.ggml.add_bos_token` / `add_bos_token`).
    pub fn add_bos_token(&self) -> bool {
        self.add_bos
    }

    /// Whether `id` is a special token (control tokens such as `<|im_start|>`).
    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.binary_search(&id).is_ok()
    }

    /// The first special token spelled in `text`: its byte range. (Text the server
    /// renders, such as a chat template's framing, is split there.)
    pub fn find_special(&self, text: &str) -> Option<std::ops::Range<usize>> {
        self.special_ids
            .iter()
            .filter_map(|&id| self.inner.id_to_token(id))
            .filter(|t| !t.is_empty())
            .filter_map(|t| text.find(&t).map(|at| at..at + t.len()))
            .min_by_key(|r| (r.start, std::cmp::Reverse(r.end)))
    }

    /// The underlying `tokenizers` tokenizer (parses special tokens).
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}
