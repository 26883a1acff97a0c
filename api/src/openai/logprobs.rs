//! `logprobs` and `top_logprobs`: the request fields, and the engine's
//! per-token log-probabilities in the shapes of chat completions
//! (`{"content": [{token, logprob, bytes, top_logprobs}]}`), completions
//! (`{tokens, token_logprobs, top_logprobs, text_offset}`) and the Responses API.
//!
//! The engine computes them from the logits the sampler drew from, after
//! `logit_bias` and the penalties and before temperature, top-k/top-p/min-p and
//! any grammar mask (so a grammar-forced token shows how likely the model
//! found it). Special tokens (the end of the answer) are not listed: they are
//! not part of the text.

use crate::error::ApiError;
use cachet_engine::sampler::TokenLogprobs;
use cachet_engine::tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

/// The most alternatives a token may list (OpenAI's limit).
pub(crate) const MAX_TOP: usize = 20;

/// What a request asks for: `None`, or the number of alternatives per token.
pub(crate) fn requested(logprobs: Option<&Value>, top: Option<&Value>) -> Result<Option<usize>, ApiError> {
    let top =
        match top {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_u64().filter(|&n| n as usize <= MAX_TOP).ok_or_else(|| {
                ApiError::bad_param("top_logprobs", "top_logprobs must be an integer between 0 and 20")
            })? as usize),
        };
    let on = match logprobs {
        None | Some(Value::Null) | Some(Value::Bool(false)) => None,
        Some(Value::Bool(true)) => Some(top.unwrap_or(0)),
        // `/v1/completions` spells it as the number of alternatives.
        Some(Value::Number(n)) => Some(n.as_u64().filter(|&n| n as usize <= MAX_TOP).ok_or_else(|| {
            ApiError::bad_param("logprobs", "logprobs must be true, false or an integer between 0 and 20")
        })? as usize),
        Some(_) => {
            return Err(ApiError::bad_param("logprobs", "logprobs must be true, false or an integer between 0 and 20"))
        }
    };
    if on.is_none() && top.is_some_and(|n| n > 0) {
        return Err(ApiError::bad_param("top_logprobs", "top_logprobs needs logprobs: true"));
    }
    Ok(on)
}

/// One listed token.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Entry {
    pub token: String,
    pub logprob: f32,
    pub top: Vec<(String, f32)>,
}

/// JSON has no infinity: a token the model gave no chance is -9999 (as OpenAI reports it).
fn finite(lp: f32) -> f32 {
    if lp.is_finite() {
        lp.max(-9999.0)
    } else {
        -9999.0
    }
}

/// The text of one token (a partial UTF-8 character decodes to U+FFFD).
fn text(tokenizer: &Tokenizer, id: u32) -> String {
    tokenizer.decode(&[id], false).unwrap_or_default()
}

/// The entry of a generated token, unless it is a special token.
pub(crate) fn entry(tokenizer: &Tokenizer, id: u32, lp: &TokenLogprobs) -> Option<Entry> {
    if tokenizer.is_special(id) {
        return None;
    }
    Some(Entry {
        token: text(tokenizer, id),
        logprob: finite(lp.logprob),
        top: lp.top.iter().map(|&(t, l)| (text(tokenizer, t), finite(l))).collect(),
    })
}

fn token_json(token: &str, logprob: f32) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("token".into(), json!(token));
    m.insert("logprob".into(), json!(logprob));
    m.insert("bytes".into(), json!(token.as_bytes()));
    m
}

/// One token as chat completions and the Responses API list it.
pub(crate) fn chat_token(e: &Entry) -> Value {
    let mut m = token_json(&e.token, e.logprob);
    let top: Vec<Value> = e.top.iter().map(|(t, l)| Value::Object(token_json(t, *l))).collect();
    m.insert("top_logprobs".into(), Value::Array(top));
    Value::Object(m)
}

/// A chat choice's `logprobs`.
pub(crate) fn chat(entries: &[Entry]) -> Value {
    json!({"content": entries.iter().map(chat_token).collect::<Vec<_>>(), "refusal": null})
}

/// A completion choice's `logprobs`; `offset` is where the first token's text starts.
pub(crate) fn completion(entries: &[Entry], mut offset: usize) -> Value {
    let mut text_offset = Vec::with_capacity(entries.len());
    for e in entries {
        text_offset.push(offset);
        offset += e.token.chars().count();
    }
    json!({
        "tokens": entries.iter().map(|e| e.token.clone()).collect::<Vec<_>>(),
        "token_logprobs": entries.iter().map(|e| e.logprob).collect::<Vec<_>>(),
        "top_logprobs": entries.iter().map(|e| {
            e.top.iter().map(|(t, l)| (t.clone(), json!(l))).collect::<Map<String, Value>>()
        }).collect::<Vec<_>>(),
        "text_offset": text_offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(e: ApiError) -> String {
        match e {
            ApiError::BadRequest { param: Some(p), .. } => p.to_string(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn request_fields() {
        assert_eq!(requested(None, None).unwrap(), None);
        assert_eq!(requested(Some(&json!(false)), Some(&json!(0))).unwrap(), None);
        assert_eq!(requested(Some(&json!(true)), None).unwrap(), Some(0));
        assert_eq!(requested(Some(&json!(true)), Some(&json!(20))).unwrap(), Some(20));
        assert_eq!(requested(Some(&json!(5)), None).unwrap(), Some(5), "completions' integer form");
        assert_eq!(param(requested(Some(&json!(true)), Some(&json!(21))).unwrap_err()), "top_logprobs");
        assert_eq!(param(requested(Some(&json!(true)), Some(&json!(-1))).unwrap_err()), "top_logprobs");
        assert_eq!(param(requested(Some(&json!(21)), None).unwrap_err()), "logprobs");
        assert_eq!(param(requested(Some(&json!("yes")), None).unwrap_err()), "logprobs");
        assert_eq!(param(requested(None, Some(&json!(3))).unwrap_err()), "top_logprobs");
    }

    #[test]
    fn shapes() {
        let e = Entry { token: "hé".into(), logprob: -0.5, top: vec![("hé".into(), -0.5), ("a".into(), -1.5)] };
        let c = chat(std::slice::from_ref(&e));
        assert_eq!(c["content"][0]["bytes"], json!([104, 195, 169]));
        assert_eq!(c["content"][0]["top_logprobs"][1]["token"], "a");
        let p = completion(&[e.clone(), e], 3);
        assert_eq!(p["text_offset"], json!([3, 5]));
        assert_eq!(p["top_logprobs"][0]["a"], json!(-1.5));
        assert_eq!(finite(f32::NEG_INFINITY), -9999.0);
    }
}
