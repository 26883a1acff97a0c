//! Rendering a model's own chat template.
//!
//! Chat templates are Jinja2 programs written for Hugging Face transformers,
//! which renders them in a sandboxed Jinja2 environment with `trim_blocks` and
//! `lstrip_blocks`, the `loopcontrols` extension, its own `tojson` filter
//! (Python's `json.dumps`), and the globals `raise_exception` and
//! `strftime_now`. [`ChatTemplate`] sets minijinja up the same way so that the
//! rendered prompt is byte-identical to `apply_chat_template(..., tokenize=False)`:
//!
//! - Python string/dict methods (`.strip()`, `.items()`, …) from minijinja-contrib's
//!   `pycompat`; `break`/`continue`;
//! - `tojson` as Python's `json.dumps(x, ensure_ascii=False)` (`chat_template/pyjson.rs`);
//! - `raise_exception(msg)` fails the render with [`ChatTemplateError::Raised`];
//! - `strftime_now(fmt)`: the current UTC time (a subset of strftime codes);
//! - `None`, `True`, `False` print as Python prints them;
//! - maps passed in keep their insertion order (messages, tool schemas,
//!   tool-call arguments), as Python dicts do. Known gap: a dict *literal*
//!   written in the template (`{"name": x, "arguments": y} | tojson`) comes out
//!   with sorted keys unless minijinja's `preserve_order` feature is enabled.
//!
//! The context holds `messages`, `add_generation_prompt`, `tools` (`none` when
//! absent), `documents` (`none`), and `bos_token` / `eos_token` when known.
//!
//! ```
//! use cachet_engine::chat_template::{ChatMessage, ChatTemplate};
//!
//! let template = ChatTemplate::new(
//!     "{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}\n{% endfor %}\
//!      {% if add_generation_prompt %}<|assistant|>{% endif %}",
//!     None,
//!     None,
//! )
//! .unwrap();
//! let text = template
//!     .render(&[ChatMessage::user(" hi ")], true, None)
//!     .unwrap();
//! assert_eq!(text, "<|user|>hi\n<|assistant|>");
//! ```

mod pyjson;
mod strftime;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Enumerator, Object, ObjectExt, ObjectRepr, ValueKind};
use minijinja::{Environment, ErrorKind, Value};
use serde::{Deserialize, Serialize};

/// The name the template is registered under (no extension: no auto-escaping).
const TEMPLATE_NAME: &str = "chat_template";

/// Why a chat template could not be loaded or rendered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChatTemplateError {
    /// The template does not parse.
    #[error("chat template syntax error: {0}")]
    Syntax(#[source] minijinja::Error),
    /// The template called `raise_exception(message)`, usually to reject the
    /// conversation (e.g. roles that do not alternate).
    #[error("chat template rejected the conversation: {0}")]
    Raised(String),
    /// Rendering failed for another reason (an unsupported construct, a type error).
    #[error("chat template render error: {0}")]
    Render(#[source] minijinja::Error),
    /// The messages or tools could not be turned into template values.
    #[error("invalid chat template input: {0}")]
    InvalidInput(String),
    /// A template file or `tokenizer_config.json` could not be read or parsed.
    #[error("cannot load chat template from {path}: {message}")]
    Load {
        /// The file that failed.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
}

/// One message of a conversation, as chat templates expect it.
///
/// Optional fields are left out of the template's view when `None` (so
/// `message.tool_calls is defined` is false), as when a Hugging Face user omits
/// the key. `tool_calls` is passed through as given: templates expect
/// `[{"type": "function", "function": {"name": ..., "arguments": {...}}}]` with
/// `arguments` as an object (OpenAI's wire format has it as a JSON string;
/// parse it before rendering).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text of the message.
    pub content: String,
    /// The tool calls an assistant message made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    /// The name of the speaker or tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// For a `tool` message: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An assistant's reasoning (read by reasoning models' templates, e.g. Qwen3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl ChatMessage {
    /// A message with the given role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into(), ..Self::default() }
    }

    /// A `system` message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }

    /// A `user` message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    /// An `assistant` message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }

    /// A `tool` message answering the call `tool_call_id`.
    pub fn tool(content: impl Into<String>, tool_call_id: impl Into<String>) -> Self {
        Self { tool_call_id: Some(tool_call_id.into()), ..Self::new("tool", content) }
    }
}

/// A compiled chat template, ready to render conversations.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl ChatTemplate {
    /// Compiles `source` (GGUF `tokenizer.chat_template` or `tokenizer_config.json`'s
    /// `chat_template`). `bos_token`/`eos_token` are the texts the template sees
    /// under those names (see [`crate::tokenizer::Tokenizer::bos_token`]).
    ///
    /// Errors: [`ChatTemplateError::Syntax`] when the template does not parse.
    pub fn new(source: &str, bos_token: Option<&str>, eos_token: Option<&str>) -> Result<Self, ChatTemplateError> {
        let mut env = Environment::new();
        let syntax =
            SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build().map_err(ChatTemplateError::Syntax)?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(python_formatter);
        env.add_filter("tojson", pyjson::tojson_filter);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime::strftime_now);
        env.add_template_owned(TEMPLATE_NAME, source.to_string()).map_err(ChatTemplateError::Syntax)?;
        Ok(Self {
            env,
            source: source.to_string(),
            bos_token: bos_token.map(str::to_string),
            eos_token: eos_token.map(str::to_string),
        })
    }

    /// The template's source text (what tells, for instance, how the model writes tool calls).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders a conversation. `add_generation_prompt` appends the opening of
    /// the assistant's turn; `tools` is the list of tool (function) schemas, if any.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
    ) -> Result<String, ChatTemplateError> {
        self.render_with(messages, add_generation_prompt, tools, &serde_json::Map::new())
    }

    /// Like [`ChatTemplate::render`], with extra template variables (for example
    /// Qwen3's `enable_thinking`), as keyword arguments to `apply_chat_template` would be.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, ChatTemplateError> {
        let messages = serde_json::to_value(messages).map_err(|e| ChatTemplateError::InvalidInput(e.to_string()))?;
        let mut context: Vec<(&str, Value)> = vec![
            ("messages", json_to_value(&messages)),
            ("tools", tools.map(json_to_value).unwrap_or(Value::from(()))),
            ("documents", Value::from(())),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
        ];
        if let Some(bos) = &self.bos_token {
            context.push(("bos_token", Value::from(bos.as_str())));
        }
        if let Some(eos) = &self.eos_token {
            context.push(("eos_token", Value::from(eos.as_str())));
        }
        for (key, value) in extra {
            context.retain(|(name, _)| name != key);
            context.push((key.as_str(), json_to_value(value)));
        }
        let template = self.env.get_template(TEMPLATE_NAME).map_err(ChatTemplateError::Render)?;
        template.render(Value::from_pairs(context)).map_err(|err| match raised_message(&err) {
            Some(message) => ChatTemplateError::Raised(message),
            None => ChatTemplateError::Render(err),
        })
    }

    /// The chat template of a Hugging Face model directory: `chat_template.jinja`
    /// if present, else `tokenizer_config.json`'s `chat_template` (a string, or a
    /// list of `{name, template}` from which `default` is taken). `Ok(None)` when
    /// neither has one.
    pub fn source_from_hf_dir(dir: &Path) -> Result<Option<String>, ChatTemplateError> {
        let load_err = |path: &Path, message: String| ChatTemplateError::Load { path: path.to_path_buf(), message };
        let jinja = dir.join("chat_template.jinja");
        match std::fs::read_to_string(&jinja) {
            Ok(source) => return Ok(Some(source)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(load_err(&jinja, e.to_string())),
        }
        let config_path = dir.join("tokenizer_config.json");
        let text = match std::fs::read_to_string(&config_path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(load_err(&config_path, e.to_string())),
        };
        let config: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| load_err(&config_path, e.to_string()))?;
        Ok(match config.get("chat_template") {
            Some(serde_json::Value::String(source)) => Some(source.clone()),
            Some(serde_json::Value::Array(named)) => {
                let template_of =
                    |item: &serde_json::Value| item.get("template").and_then(|t| t.as_str()).map(str::to_string);
                named
                    .iter()
                    .find(|item| item.get("name").and_then(|n| n.as_str()) == Some("default"))
                    .or_else(|| named.first())
                    .and_then(template_of)
            }
            _ => None,
        })
    }
}

/// What `raise_exception` attaches to its error, to tell it from other failures.
#[derive(Debug)]
struct RaisedException(String);

impl std::fmt::Display for RaisedException {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedException {}

/// The template global `raise_exception(message)`.
fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(RaisedException(message)))
}

/// The message of a `raise_exception` call somewhere in `err`'s source chain.
fn raised_message(err: &minijinja::Error) -> Option<String> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = current {
        if let Some(raised) = e.downcast_ref::<RaisedException>() {
            return Some(raised.0.clone());
        }
        current = e.source();
    }
    None
}

/// Prints `none`/`true`/`false` the Python way; everything else as minijinja does.
fn python_formatter(
    out: &mut minijinja::Output,
    state: &mut minijinja::State,
    value: &Value,
) -> Result<(), minijinja::Error> {
    let python = match value.kind() {
        ValueKind::None => "None",
        ValueKind::Bool if value.is_true() => "True",
        ValueKind::Bool => "False",
        _ => return minijinja::escape_formatter(out, state, value),
    };
    out.write_str(python).map_err(minijinja::Error::from)
}

/// A JSON object as a template map that keeps the keys' order.
#[derive(Debug)]
struct OrderedMap(Vec<(Value, Value)>);

impl Object for OrderedMap {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        self.mapped_key_value_enumerator(|this| Box::new(this.0.iter().map(|(k, v)| (k.clone(), v.clone()))))
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.0.len())
    }
}

/// Converts JSON to template values, keeping object key order.
pub(crate) fn json_to_value(json: &serde_json::Value) -> Value {
    use serde_json::Value as Json;
    match json {
        Json::Null => Value::from(()),
        Json::Bool(b) => Value::from(*b),
        Json::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Json::String(s) => Value::from(s.as_str()),
        Json::Array(items) => Value::from(items.iter().map(json_to_value).collect::<Vec<_>>()),
        Json::Object(map) => Value::from_object(OrderedMap(
            map.iter().map(|(k, v)| (Value::from(k.as_str()), json_to_value(v))).collect(),
        )),
    }
}
