//! Request and response bodies of the OpenAI-compatible endpoints. Unknown
//! request fields are ignored (clients send many); fields cachet does not
//! implement are refused with a 400 naming them, never silently dropped.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// `stop`: one string or several.
#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

#[derive(Clone, Debug, Deserialize, ToSchema)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Message content: a string, or text parts.
#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Clone, Debug, Deserialize, ToSchema)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Clone, Debug, Deserialize, ToSchema)]
pub struct ChatMessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub tool_calls: Option<serde_json::Value>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

/// Sampling fields shared by both endpoints.
#[derive(Clone, Debug, Default, Deserialize, ToSchema)]
pub struct Sampling {
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub max_completion_tokens: Option<u32>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub seed: Option<i64>,
    #[serde(default)]
    pub stop: Option<Stop>,
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    /// Narrows prefix-cache reuse to this end user (within the tenant).
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub n: Option<u32>,
    /// cachet extension: top-k.
    #[serde(default)]
    pub top_k: Option<u32>,
    /// cachet extension: min-p.
    #[serde(default)]
    pub min_p: Option<f32>,
    /// cachet extension: Hugging Face style repetition penalty.
    #[serde(default)]
    pub repetition_penalty: Option<f32>,
    /// cachet extension: the session this request belongs to (or the
    /// `X-Cachet-Session` header); keeps its prefix warm between turns.
    #[serde(default)]
    pub session_id: Option<Uuid>,
    /// cachet extension: the task (or `X-Cachet-Task`).
    #[serde(default)]
    pub task_id: Option<Uuid>,
    /// cachet extension (as vLLM's and llama-server's): keep generating past the end-of-sequence
    /// token, up to `max_tokens` (for benchmarks).
    #[serde(default)]
    pub ignore_eos: Option<bool>,
    /// cachet extension: `interactive` (default) or `batch`.
    #[serde(default)]
    pub slo: Option<String>,
    #[serde(default)]
    pub logprobs: Option<serde_json::Value>,
}

/// `POST /v1/chat/completions`.
#[derive(Clone, Debug, Deserialize, ToSchema)]
pub struct ChatCompletionRequest {
    pub model: String,
    pub messages: Vec<ChatMessageIn>,
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<serde_json::Value>,
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// `prompt` of `/v1/completions`: text or token ids, one of each at most.
#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

/// `POST /v1/completions`.
#[derive(Clone, Debug, Deserialize, ToSchema)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: Prompt,
    /// Fill in the middle: the text after the insertion point.
    #[serde(default)]
    pub suffix: Option<String>,
    #[serde(default)]
    pub echo: Option<bool>,
    #[serde(flatten)]
    pub sampling: Sampling,
}

#[derive(Clone, Debug, Serialize, ToSchema, PartialEq)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

#[derive(Clone, Debug, Serialize, ToSchema, PartialEq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

impl Usage {
    pub fn from(c: &cachet_engine::runtime::Completion) -> Usage {
        Usage {
            prompt_tokens: c.prompt_tokens,
            completion_tokens: c.output_tokens,
            total_tokens: c.prompt_tokens + c.output_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens: c.cached_tokens },
        }
    }
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ChatMessageOut {
    pub role: &'static str,
    pub content: String,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ChatChoice {
    pub index: u32,
    pub message: ChatMessageOut,
    pub finish_reason: &'static str,
    #[schema(value_type = Option<Object>)]
    pub logprobs: Option<()>,
}

/// The answer of `POST /v1/chat/completions` (not streaming).
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: i64,
    pub model: String,
    pub system_fingerprint: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    pub finish_reason: &'static str,
    #[schema(value_type = Option<Object>)]
    pub logprobs: Option<()>,
}

/// The answer of `POST /v1/completions` (not streaming).
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct TextCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: i64,
    pub model: String,
    pub system_fingerprint: String,
    pub choices: Vec<CompletionChoice>,
    pub usage: Usage,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: i64,
    pub owned_by: &'static str,
}

/// The answer of `GET /v1/models`.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}
