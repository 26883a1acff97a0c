//! The text side of one completion: incremental detokenization (never
//! broken UTF-8), stop strings (held back until they can no longer match,
//! never emitted), stop tokens and the token limit.

use crate::generate::{FinishReason, GenerateParams};
use crate::tokenizer::{IncrementalDecoder, Tokenizer, TokenizerError};

/// Holds back text that could be the start of a stop string.
#[derive(Debug, Default)]
pub(crate) struct StopMatcher {
    pub(crate) stops: Vec<String>,
    pub(crate) pending: String,
}

impl StopMatcher {
    /// Adds text; returns what is safe to emit and whether a stop matched.
    pub(crate) fn push(&mut self, text: &str) -> (String, bool) {
        self.pending.push_str(text);
        if let Some(at) = self.stops.iter().filter_map(|s| self.pending.find(s.as_str())).min() {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return (out, true);
        }
        // Keep the longest suffix that is a prefix of some stop string.
        let keep = self
            .stops
            .iter()
            .flat_map(|s| (1..s.len()).filter(|&n| s.is_char_boundary(n)).map(move |n| &s[..n]))
            .filter(|prefix| self.pending.ends_with(prefix))
            .map(str::len)
            .max()
            .unwrap_or(0);
        let cut = self.pending.len() - keep;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        (out, false)
    }

    pub(crate) fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

/// Text produced by one token.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Piece {
    /// Text that became final (possibly empty).
    pub text: String,
    /// Set when this token ended the completion.
    pub finish: Option<FinishReason>,
}

/// Turns sampled tokens into final text and decides when to stop.
#[derive(Debug)]
pub struct Output {
    decoder: IncrementalDecoder,
    stops: StopMatcher,
    stop_ids: Vec<u32>,
    max_tokens: usize,
    produced: usize,
}

impl Output {
    /// For a request with `params`; `eos_ids` end it unless `ignore_eos`.
    pub fn new(params: &GenerateParams, eos_ids: &[u32]) -> Output {
        let mut stop_ids = params.stop_token_ids.clone();
        if !params.ignore_eos {
            stop_ids.extend_from_slice(eos_ids);
        }
        Output {
            decoder: IncrementalDecoder::new(true),
            stops: StopMatcher {
                stops: params.stop.iter().filter(|s| !s.is_empty()).cloned().collect(),
                ..Default::default()
            },
            stop_ids,
            max_tokens: params.max_tokens,
            produced: 0,
        }
    }

    /// Tokens taken so far.
    pub fn produced(&self) -> usize {
        self.produced
    }

    /// Takes the next sampled token.
    pub fn push(&mut self, tok: &Tokenizer, token: u32) -> Result<Piece, TokenizerError> {
        self.produced += 1;
        if self.stop_ids.contains(&token) {
            return Ok(Piece { text: self.flush(tok)?, finish: Some(FinishReason::Stop) });
        }
        let piece = self.decoder.push(tok, token)?;
        let (mut text, stopped) = self.stops.push(&piece);
        if stopped {
            return Ok(Piece { text, finish: Some(FinishReason::Stop) });
        }
        if self.produced >= self.max_tokens {
            text.push_str(&self.flush(tok)?);
            return Ok(Piece { text, finish: Some(FinishReason::Length) });
        }
        Ok(Piece { text, finish: None })
    }

    /// Ends early (e.g. at the context limit): whatever is held back.
    pub fn flush(&mut self, tok: &Tokenizer) -> Result<String, TokenizerError> {
        let rest = self.decoder.finish(tok)?;
        let (mut text, stopped) = self.stops.push(&rest);
        if !stopped {
            text.push_str(&self.stops.finish());
        }
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::StopMatcher;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher { stops: stops.iter().map(|s| s.to_string()).collect(), ..Default::default() };
        let mut out = String::new();
        for p in pieces {
            let (o, stopped) = m.push(p);
            out.push_str(&o);
            if stopped {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stop_strings_across_pieces() {
        assert_eq!(run(&["END"], &["abc E", "N", "D tail"]), ("abc ".into(), true));
        assert_eq!(run(&["END"], &["abc E", "N", "x"]), ("abc ENx".into(), false));
        assert_eq!(run(&["\n\n", "```"], &["fn main", "() {}\n", "\n"]), ("fn main() {}".into(), true));
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        assert_eq!(run(&["é!"], &["café", "!"]), ("caf".into(), true));
    }
}
