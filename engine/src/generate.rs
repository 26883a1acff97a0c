//! Generating one completion on a model with its own KV pool: chunked
//! prefill, then decoding token by token with streaming text, stop tokens,
//! stop strings and limits. (Serving many requests at once is the
//! scheduler's job; this is the single-request path behind `cachet generate`.)

use crate::chat_template::ChatMessage;
use crate::kv_pool::{KvPool, PoolSize, SlotId};
use crate::loader::LoadedModel;
use crate::model::{ForwardScratch, LogitsFor, SeqChunk};
use crate::output::Output;
use crate::sampler::{Sampler, SamplingParams};
use crate::EngineError;
use cachet_kernels::backend::{Backend, BackendError};
use std::time::{Duration, Instant};

/// What to generate.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateParams {
    pub sampling: SamplingParams,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Generation ends before any of these strings (which are not emitted).
    pub stop: Vec<String>,
    /// Generation ends at any of these tokens (in addition to EOS).
    pub stop_token_ids: Vec<u32>,
    /// Keep going past the model's end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Report each generated token's log-probability and this many most likely
    /// alternatives (`None`: no log-probabilities). See [`crate::sampler::TokenLogprobs`].
    pub logprobs: Option<usize>,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            sampling: SamplingParams::default(),
            max_tokens: 256,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            logprobs: None,
        }
    }
}

pub use cachet_words::FinishReason;

/// A finished completion.
#[derive(Clone, Debug)]
pub struct Generation {
    /// Generated tokens, including a final stop token.
    pub tokens: Vec<u32>,
    /// Generated text, without stop tokens and strings.
    pub text: String,
    pub finish_reason: FinishReason,
    pub prompt_tokens: usize,
    /// Prompt processing until the first token was sampled.
    pub prefill_time: Duration,
    /// Everything after the first token.
    pub decode_time: Duration,
}

impl Generation {
    /// Prompt tokens per second.
    pub fn prefill_tps(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_time.as_secs_f64().max(1e-9)
    }

    /// Generated tokens per second after the first.
    pub fn decode_tps(&self) -> f64 {
        self.tokens.len().saturating_sub(1) as f64 / self.decode_time.as_secs_f64().max(1e-9)
    }
}

/// A model, its KV pool and scratch space, generating one request at a time.
pub struct Generator<B: Backend> {
    backend: B,
    loaded: LoadedModel<B>,
    pool: KvPool<B>,
    scratch: ForwardScratch<B>,
    logits: Vec<f32>,
    /// Most prompt tokens per forward pass.
    pub prefill_chunk: usize,
}

impl<B: Backend> std::fmt::Debug for Generator<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generator").field("model", &self.loaded).field("pool", &self.pool).finish()
    }
}

impl<B: Backend> Generator<B> {
    /// Allocates a KV pool of `pool` for the model.
    pub fn new(backend: B, loaded: LoadedModel<B>, pool: PoolSize) -> Result<Generator<B>, BackendError> {
        let pool = KvPool::new(&backend, loaded.model.config(), pool)?;
        let scratch = ForwardScratch::new(&backend);
        Ok(Generator { backend, loaded, pool, scratch, logits: Vec::new(), prefill_chunk: 512 })
    }

    /// The model and its tokenizer.
    pub fn model(&self) -> &LoadedModel<B> {
        &self.loaded
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The KV pool.
    pub fn pool(&self) -> &KvPool<B> {
        &self.pool
    }

    /// The token ids of a conversation rendered with the model's chat
    /// template, ready for the assistant's turn.
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, EngineError> {
        let template = self
            .loaded
            .chat_template
            .as_ref()
            .ok_or_else(|| EngineError::InvalidRequest("the model has no chat template".into()))?;
        let text = template.render(messages, true, None).map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
        self.loaded.tokenizer.encode(&text, true).map_err(|e| EngineError::Tokenizer(e.to_string()))
    }

    /// Generates a completion of `prompt`, calling `on_text` with each piece
    /// of text as soon as it is final.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation, EngineError> {
        params.sampling.validate().map_err(|e| EngineError::InvalidRequest(e.0))?;
        let config = self.loaded.model.config();
        let limit = config.max_context.min(self.pool.capacity());
        if prompt.is_empty() {
            return Err(EngineError::InvalidRequest("the prompt is empty".into()));
        }
        if prompt.len() >= limit {
            return Err(EngineError::ContextTooLong { tokens: prompt.len() + 1, limit });
        }
        let mut slots = Vec::new();
        let result = self.run(prompt, params, limit, &mut slots, on_text);
        let freed = self.pool.free(&slots);
        let generation = result?;
        freed.map_err(|e| EngineError::BadBatch(e.to_string()))?;
        Ok(generation)
    }

    fn run(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        limit: usize,
        slots: &mut Vec<SlotId>,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation, EngineError> {
        let start = Instant::now();
        let vocab = self.loaded.model.config().vocab_size;
        let mut sampler = Sampler::new(params.sampling.clone(), prompt);
        let mut output = Output::new(params, &self.loaded.tokenizer.eos_ids());
        let tok_err = |e: crate::tokenizer::TokenizerError| EngineError::Tokenizer(e.to_string());

        slots.reserve(prompt.len() + params.max_tokens.min(limit));
        self.pool.allocate_into(prompt.len(), slots)?;
        for chunk_start in (0..prompt.len()).step_by(self.prefill_chunk.max(1)) {
            let end = (chunk_start + self.prefill_chunk.max(1)).min(prompt.len());
            let logits = if end == prompt.len() { LogitsFor::Last } else { LogitsFor::None };
            self.step(&prompt[chunk_start..end], chunk_start, slots, logits)?;
        }
        let prefill_time = start.elapsed();
        let decode_start = Instant::now();
        let mut tokens = Vec::new();
        let mut text = String::new();
        let mut emit = |piece: &str, text: &mut String| {
            if !piece.is_empty() {
                on_text(piece);
                text.push_str(piece);
            }
        };
        let finish_reason = loop {
            if params.max_tokens == 0 {
                break FinishReason::Length;
            }
            let token = sampler.sample(&mut self.logits[..vocab]);
            tokens.push(token);
            let piece = output.push(&self.loaded.tokenizer, token).map_err(tok_err)?;
            emit(&piece.text, &mut text);
            if let Some(reason) = piece.finish {
                break reason;
            }
            let pos = prompt.len() + tokens.len() - 1;
            if pos + 1 >= limit {
                emit(&output.flush(&self.loaded.tokenizer).map_err(tok_err)?, &mut text);
                break FinishReason::Length;
            }
            self.pool.allocate_into(1, slots)?;
            self.step(&[token], pos, slots, LogitsFor::Last)?;
        };
        Ok(Generation {
            tokens,
            text,
            finish_reason,
            prompt_tokens: prompt.len(),
            prefill_time,
            decode_time: decode_start.elapsed(),
        })
    }

    /// The logits after the last token of `prompt` (scoring; nothing is kept).
    pub fn prompt_logits(&mut self, prompt: &[u32]) -> Result<Vec<f32>, EngineError> {
        let limit = self.loaded.model.config().max_context.min(self.pool.capacity());
        if prompt.is_empty() || prompt.len() > limit {
            return Err(EngineError::ContextTooLong { tokens: prompt.len(), limit });
        }
        let slots = self.pool.allocate(prompt.len())?;
        let result = self.step(prompt, 0, &slots, LogitsFor::Last);
        let freed = self.pool.free(&slots);
        result?;
        freed.map_err(|e| EngineError::BadBatch(e.to_string()))?;
        Ok(self.logits.clone())
    }

    fn step(
        &mut self,
        tokens: &[u32],
        start_pos: usize,
        slots: &[SlotId],
        logits: LogitsFor,
    ) -> Result<(), EngineError> {
        let end = start_pos + tokens.len();
        let seqs = [SeqChunk { tokens, start_pos, slots: SlotId::raw(&slots[..end]), logits }];
        self.loaded.model.forward(&self.backend, self.pool.storage_mut(), &seqs, &mut self.scratch, &mut self.logits)
    }
}
