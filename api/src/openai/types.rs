//! Request and response bodies of the OpenAI-compatible endpoints. Every
//! request field is either honoured or refused with a 400 naming it: fields
//! nobody defined are collected in `unknown` and refused (OpenAI's own
//! "Unrecognized request argument supplied"), never silently dropped.

use cachet_tenants::{SessionId, TaskId};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

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
    #[schema(value_type = Option<Uuid>)]
    pub session_id: Option<SessionId>,
    /// cachet extension: the task (or `X-Cachet-Task`).
    #[serde(default)]
    #[schema(value_type = Option<Uuid>)]
    pub task_id: Option<TaskId>,
    /// cachet extension (as vLLM's and llama-server's): keep generating past the end-of-sequence
    /// token, up to `max_tokens` (for benchmarks).
    #[serde(default)]
    pub ignore_eos: Option<bool>,
    /// cachet extension: `interactive` (default) or `batch`.
    #[serde(default)]
    pub slo: Option<String>,
    #[serde(default)]
    pub logprobs: Option<serde_json::Value>,
    #[serde(default)]
    pub top_logprobs: Option<serde_json::Value>,
    /// Added to the logits of these token ids (`{"id": bias}`, bias in [-100, 100]).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub logit_bias: Option<serde_json::Map<String, serde_json::Value>>,
    /// Whether OpenAI should store the completion: cachet stores none, so only
    /// `false` can be honoured.
    #[serde(default)]
    pub store: Option<bool>,
    /// Tags for stored completions (nothing is stored; accepted, as with `store: false`).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<serde_json::Value>,
    /// `auto` or `default` (cachet has one tier).
    #[serde(default)]
    pub service_tier: Option<String>,
    /// OpenAI's prompt-cache routing hint: cachet's prefix cache needs none
    /// (accepted, with no effect on which prefixes are reused).
    #[serde(default)]
    pub prompt_cache_key: Option<String>,
    /// cachet extension: a grammar the output must match, `{"regex": …}` or `{"lark": …}`
    /// (llguidance's Lark syntax); not with `tools` or `response_format`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub grammar: Option<serde_json::Value>,
}

/// Request fields no endpoint defines, refused by [`reject_unknown`].
pub type Unknown = serde_json::Map<String, serde_json::Value>;

/// Fields of OpenAI's API that cachet does not implement, with what to do instead.
const UNSUPPORTED: [(&str, &str); 8] = [
    ("functions", "use tools"),
    ("function_call", "use tool_choice"),
    ("modalities", "only text is supported"),
    ("audio", "only text is supported"),
    ("prediction", "predicted outputs are not supported"),
    ("web_search_options", "web search is not supported"),
    ("reasoning_effort", "the served model does not reason"),
    ("verbosity", "not supported"),
];

/// A 400 naming the first field of `unknown`.
pub fn reject_unknown(unknown: &Unknown) -> Result<(), crate::error::ApiError> {
    let Some(field) = unknown.keys().next() else { return Ok(()) };
    let message = match UNSUPPORTED.iter().find(|(f, _)| f == field) {
        Some((_, instead)) => format!("{field} is not supported: {instead}"),
        None => format!("Unrecognized request argument supplied: {field}"),
    };
    Err(crate::error::ApiError::bad_param(field.clone(), message))
}

/// Tools and structured output (chat completions and session turns; see `docs/agents.md`).
#[derive(Clone, Debug, Default, Deserialize, ToSchema)]
pub struct ToolRequest {
    /// Functions the model may call (`[{"type": "function", "function": {name, description, parameters}}]`).
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<serde_json::Value>,
    /// `none`, `auto` (default with tools), `required`, or `{"type": "function", "function": {"name": …}}`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<serde_json::Value>,
    /// Whether an answer may make several calls (default true).
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// `{"type": "text" | "json_object"}` or `{"type": "json_schema", "json_schema": {name, schema, strict}}`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub response_format: Option<serde_json::Value>,
}

/// `POST /v1/chat/completions`.
#[derive(Clone, Debug, Deserialize, ToSchema)]
pub struct ChatCompletionRequest {
    pub model: String,
    pub messages: Vec<ChatMessageIn>,
    /// Extra variables for the chat template (vLLM's field), such as Qwen3's `enable_thinking`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(flatten)]
    pub tooling: ToolRequest,
    #[serde(flatten)]
    pub sampling: Sampling,
    #[serde(flatten)]
    #[schema(ignore)]
    pub unknown: Unknown,
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
    #[serde(flatten)]
    #[schema(ignore)]
    pub unknown: Unknown,
}

#[derive(Clone, Debug, Serialize, ToSchema, PartialEq)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

/// Speculative decoding's drafts, in OpenAI's fields for predicted tokens: the engine's own
/// guesses (from the request's prompt and output so far) that the model confirmed, and those it
/// did not. Confirmed ones are counted once in `completion_tokens`; rejected ones not at all.
#[derive(Clone, Debug, Serialize, ToSchema, PartialEq)]
pub struct CompletionTokensDetails {
    pub accepted_prediction_tokens: usize,
    pub rejected_prediction_tokens: usize,
}

#[derive(Clone, Debug, Serialize, ToSchema, PartialEq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
    pub completion_tokens_details: CompletionTokensDetails,
}

impl Usage {
    pub fn from(c: &cachet_engine::runtime::Completion) -> Usage {
        Usage {
            prompt_tokens: c.prompt_tokens,
            completion_tokens: c.output_tokens,
            total_tokens: c.prompt_tokens + c.output_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens: c.cached_tokens },
            completion_tokens_details: CompletionTokensDetails {
                accepted_prediction_tokens: c.accepted_tokens,
                rejected_prediction_tokens: c.drafted_tokens.saturating_sub(c.accepted_tokens),
            },
        }
    }
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ChatMessageOut {
    pub role: &'static str,
    /// The text (null when the answer is only tool calls).
    pub content: Option<String>,
    /// A thinking model's reasoning (its `<think>` block), apart from the content.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Always null: cachet's models do not refuse through a separate channel.
    pub refusal: Option<String>,
}

/// A call the model made: `type` `function` with `function`, or `custom` with `custom`.
#[derive(Clone, Debug, PartialEq, Serialize, ToSchema)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub function: Option<FunctionCall>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub custom: Option<CustomCall>,
}

/// A custom tool and its free-form input.
#[derive(Clone, Debug, PartialEq, Serialize, ToSchema)]
pub struct CustomCall {
    pub name: String,
    pub input: String,
}

/// The function and its arguments (a JSON text).
#[derive(Clone, Debug, PartialEq, Serialize, ToSchema)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ChatChoice {
    pub index: u32,
    pub message: ChatMessageOut,
    pub finish_reason: &'static str,
    #[schema(value_type = Option<Object>)]
    pub logprobs: Option<serde_json::Value>,
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
    pub logprobs: Option<serde_json::Value>,
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
    /// The context window in tokens (prompt and answer together), where vLLM's clients read it.
    pub max_model_len: usize,
    /// The same, where OpenRouter's and LM Studio's clients read it.
    pub context_length: usize,
}

/// The answer of `GET /v1/models`.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}
