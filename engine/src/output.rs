//! The text side of one completion: incremental detokenization (never
//! broken UTF-8), stop strings (held back until they can no longer match,
//! never emitted), stop tokens and the token limit.

use crate::generate::{FinishReason, GenerateParams};
use crate::tokenizer::{IncrementalDecoder, Tokenizer, TokenizerError};

/// Holds back text that could be the start of a stop string.
///
/// Linear in the text: each stop string keeps how much of it the text now ends with (its
/// Knuth–Morris–Pratt state), so a byte costs amortised O(1) per stop string, whatever their
/// lengths — the matcher runs on the engine thread, once per token of every request.
#[derive(Debug, Default)]
pub(crate) struct StopMatcher {
    stops: Vec<Stop>,
    pending: String,
}

#[derive(Debug)]
struct Stop {
    text: Vec<u8>,
    /// `fail[i]`: the length of the longest proper prefix of `text[..=i]` that is also its suffix.
    fail: Vec<usize>,
    /// How many bytes of `text` the text so far ends with (always less than its length).
    matched: usize,
}

impl Stop {
    fn new(text: &str) -> Stop {
        let text = text.as_bytes().to_vec();
        let mut fail = vec![0; text.len()];
        let mut k = 0;
        for i in 1..text.len() {
            while k > 0 && text[i] != text[k] {
                k = fail[k - 1];
            }
            if text[i] == text[k] {
                k += 1;
            }
            fail[i] = k;
        }
        Stop { text, fail, matched: 0 }
    }

    /// Takes one byte; true when the text now ends with the whole stop string.
    fn step(&mut self, b: u8) -> bool {
        let mut k = self.matched;
        while k > 0 && self.text[k] != b {
            k = self.fail[k - 1];
        }
        if self.text[k] == b {
            k += 1;
        }
        if k == self.text.len() {
            self.matched = self.fail[k - 1];
            return true;
        }
        self.matched = k;
        false
    }
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub(crate) fn new<'a>(stops: impl IntoIterator<Item = &'a str>) -> StopMatcher {
        let stops = stops.into_iter().filter(|s| !s.is_empty()).map(Stop::new).collect();
        StopMatcher { stops, pending: String::new() }
    }

    /// Adds text; returns what is safe to emit and whether a stop matched (the text before the
    /// earliest-starting stop string that is complete by the end of `text`).
    pub(crate) fn push(&mut self, text: &str) -> (String, bool) {
        let base = self.pending.len();
        self.pending.push_str(text);
        let mut first: Option<usize> = None;
        for (i, &b) in text.as_bytes().iter().enumerate() {
            for s in &mut self.stops {
                if s.step(b) {
                    let start = base + i + 1 - s.text.len();
                    first = Some(first.map_or(start, |f| f.min(start)));
                }
            }
        }
        if let Some(at) = first {
            // A stop string starts at a character boundary of the text (it is whole UTF-8).
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return (out, true);
        }
        // Keep the longest suffix that is a prefix of some stop string.
        let keep = self.stops.iter().map(|s| s.matched).max().unwrap_or(0);
        let mut cut = self.pending.len() - keep;
        while !self.pending.is_char_boundary(cut) {
            cut -= 1;
        }
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
            stops: StopMatcher::new(params.stop.iter().map(String::as_str)),
            stop_ids,
            max_tokens: params.max_tokens,
            produced: 0,
        }
    }

    /// Tokens taken so far.
    pub fn produced(&self) -> usize {
        self.produced
    }

    /// Whether `token` ends the output by itself (an end-of-sequence or stop token id).
    pub fn stops_at(&self, token: u32) -> bool {
        self.stop_ids.contains(&token)
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
        let mut m = StopMatcher::new(stops.iter().copied());
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
        // Overlapping and self-overlapping stop strings.
        assert_eq!(run(&["aab"], &["aaa", "ab"]), ("aa".into(), true));
        assert_eq!(run(&["abab"], &["xaba", "bab"]), ("x".into(), true));
        assert_eq!(run(&["bc", "abcd"], &["xabcd"]), ("x".into(), true));
        assert_eq!(run(&["bc", "abcd"], &["xab", "cd"]), ("x".into(), true));
        assert_eq!(run(&["bc", "abcd"], &["xabc", "d"]), ("xa".into(), true));
        // Held back while it may still match, released when it cannot.
        assert_eq!(run(&["aab"], &["aa", "c"]), ("aac".into(), false));
        // A multi-byte character is never split when held back.
        assert_eq!(run(&["éa"], &["xé", "b"]), ("xéb".into(), false));
    }

    /// Every piece the matcher emits, and whether it stopped, is what a naive matcher over the
    /// whole text gives: the text before the earliest stop string, else all of it.
    #[test]
    fn agrees_with_a_naive_matcher() {
        let alphabet = ["a", "b", "ab", "é", "ba"];
        let mut seed = 7u64;
        let mut next = |n: usize| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) as usize % n
        };
        for _ in 0..2_000 {
            let stops: Vec<String> =
                (0..1 + next(3)).map(|_| (0..1 + next(4)).map(|_| alphabet[next(5)]).collect()).collect();
            let pieces: Vec<String> = (0..next(8)).map(|_| (0..next(3)).map(|_| alphabet[next(5)]).collect()).collect();
            let refs: Vec<&str> = stops.iter().map(String::as_str).collect();
            let pieces_ref: Vec<&str> = pieces.iter().map(String::as_str).collect();
            let (got, stopped) = run(&refs, &pieces_ref);
            // The naive answer: the first piece after which some stop is in the text, cut at
            // the earliest start of the stops in it.
            let mut text = String::new();
            let mut want = None;
            for p in &pieces {
                text.push_str(p);
                if let Some(at) = stops.iter().filter_map(|s| text.find(s.as_str())).min() {
                    want = Some(text[..at].to_string());
                    break;
                }
            }
            match want {
                Some(w) => assert_eq!((got, stopped), (w, true), "{stops:?} {pieces:?}"),
                None => assert_eq!((got, stopped), (text, false), "{stops:?} {pieces:?}"),
            }
        }
    }

    /// 32 stop strings of 120,000 bytes against 2,000 pieces of spaces: linear, not
    /// quadratic (the old matcher compared every prefix of every stop on every piece).
    #[test]
    fn long_stop_strings_cost_linear_time() {
        let long = " ".repeat(119_999) + "x";
        let stops: Vec<&str> = (0..32).map(|_| long.as_str()).collect();
        let mut m = StopMatcher::new(stops);
        let mut emitted = 0;
        for _ in 0..2_000 {
            let (out, stopped) = m.push("  ");
            assert!(!stopped);
            emitted += out.len();
        }
        // Everything is held back (all of it could still begin a stop string).
        assert_eq!(emitted, 0);
        assert_eq!(m.finish().len(), 4_000);
    }
}
