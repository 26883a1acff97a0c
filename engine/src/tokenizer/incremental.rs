//! Streaming detokenization.
//!
//! A token is not a unit of text: a byte-level BPE token can hold part of a
//! UTF-8 character (an emoji often spans several tokens), and some decoders
//! change how a token reads depending on what precedes it (sentencepiece's
//! leading-space strip). [`IncrementalDecoder`] uses the prefix/read-offset
//! technique of TGI and vLLM: it keeps a small window of ids, decodes the window
//! after each new id, and emits the part of the text past what it already
//! emitted — but only up to a trailing run of U+FFFD, which is what an
//! incomplete character decodes to; those characters wait for the next ids.
//! When the window's text ends cleanly, the window is cut so that it keeps only
//! the ids of the last emitted piece (context for the next decode). Each step
//! decodes a few ids, not the whole sequence.
//!
//! Invariant: the pieces returned by [`IncrementalDecoder::push`] followed by
//! [`IncrementalDecoder::finish`] concatenate to `decode(all ids)`. For the
//! byte-level decoder this holds exactly, because the window is only ever cut
//! after a complete character, where UTF-8 decoding restarts.

use super::{Tokenizer, TokenizerError};

const REPLACEMENT: char = char::REPLACEMENT_CHARACTER;

/// Turns generated ids, one at a time, into text pieces that never end inside
/// a UTF-8 character.
///
/// It holds no reference to the tokenizer, so it can live in a sequence's
/// state; pass the same [`Tokenizer`] to every call.
///
/// ```
/// use cachet_engine::tokenizer::{GgufTokenizerSpec, IncrementalDecoder, Tokenizer};
///
/// let tokenizer = Tokenizer::from_gguf(GgufTokenizerSpec::byte_alphabet("gpt2", None)).unwrap();
/// let ids = tokenizer.encode("é!", false).unwrap(); // 'é' is two byte tokens
/// let mut decoder = IncrementalDecoder::new(true);
/// assert_eq!(decoder.push(&tokenizer, ids[0]).unwrap(), ""); // half a character: held back
/// assert_eq!(decoder.push(&tokenizer, ids[1]).unwrap(), "é");
/// assert_eq!(decoder.push(&tokenizer, ids[2]).unwrap(), "!");
/// assert_eq!(decoder.finish(&tokenizer).unwrap(), "");
/// ```
#[derive(Debug, Clone, Default)]
pub struct IncrementalDecoder {
    skip_special: bool,
    /// The window: ids of the last emitted piece, then the pending ids.
    ids: Vec<u32>,
    /// `ids[..read]` are the context ids of the last emitted piece.
    read: usize,
    /// Bytes of `decode(ids)` already emitted (the context's text included).
    emitted: usize,
}

impl IncrementalDecoder {
    /// A decoder for one generated sequence; `skip_special` as in [`Tokenizer::decode`].
    pub fn new(skip_special: bool) -> Self {
        Self { skip_special, ..Self::default() }
    }

    /// Adds one id and returns the text that became complete (possibly empty).
    ///
    /// An id outside the vocabulary is an error and leaves the decoder unchanged.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String, TokenizerError> {
        self.ids.push(id);
        let text = match tokenizer.decode(&self.ids, self.skip_special) {
            Ok(text) => text,
            Err(e) => {
                self.ids.pop();
                return Err(e);
            }
        };
        let stable = text.trim_end_matches(REPLACEMENT).len();
        let piece = text.get(self.emitted..stable).unwrap_or("").to_string();
        if stable < text.len() {
            // An incomplete character at the end: emit what precedes it, keep the window.
            self.emitted = self.emitted.max(stable);
            return Ok(piece);
        }
        // Clean end: the pending ids become the context of the next step.
        let context = tokenizer.decode(&self.ids[self.read..], self.skip_special)?;
        self.ids.drain(..self.read);
        self.read = self.ids.len();
        self.emitted = context.len();
        Ok(piece)
    }

    /// Returns whatever is still held back (an incomplete character decodes to
    /// U+FFFD, as in [`Tokenizer::decode`]) and resets the decoder.
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<String, TokenizerError> {
        let text = tokenizer.decode(&self.ids, self.skip_special)?;
        let rest = text.get(self.emitted..).unwrap_or("").to_string();
        *self = Self::new(self.skip_special);
        Ok(rest)
    }

    /// Number of ids currently held in the window (for tests and diagnostics).
    pub fn window_len(&self) -> usize {
        self.ids.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::gguf::byte_to_char;
    use crate::tokenizer::tests::tiny;

    /// Pushes every id, checks no piece carries a held-back character, and
    /// returns the pieces (the last one from `finish`).
    fn stream(tokenizer: &Tokenizer, ids: &[u32], skip_special: bool) -> Vec<String> {
        let mut decoder = IncrementalDecoder::new(skip_special);
        let mut pieces: Vec<String> = ids.iter().map(|&id| decoder.push(tokenizer, id).unwrap()).collect();
        pieces.push(decoder.finish(tokenizer).unwrap());
        pieces
    }

    #[test]
    fn multi_byte_characters_are_held_until_complete() {
        let (tok, _) = tiny();
        // No merges for these: every UTF-8 byte is its own token.
        let text = "你好 👩‍💻 ok é";
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(ids.len(), text.len());
        let pieces = stream(&tok, &ids, true);
        assert!(pieces.iter().all(|p| !p.contains(REPLACEMENT)), "{pieces:?}");
        assert_eq!(pieces.concat(), text);
        // '你' is three bytes: nothing for two tokens, then the whole character.
        assert_eq!(&pieces[..3], ["", "", "你"]);
        // The woman emoji is four bytes.
        let emoji_start = "你好 ".len();
        assert_eq!(&pieces[emoji_start..emoji_start + 4], ["", "", "", "👩"]);
    }

    #[test]
    fn concatenation_equals_decode_for_arbitrary_ids() {
        let (tok, ids) = tiny();
        let symbols = byte_to_char();
        let specials = [ids.im_start, ids.im_end, ids.tool_call, ids.the, ids.unused];
        let mut rng = cachet_kernels::testing::Lcg::new(0x2545_f491);
        let mut next = || rng.next_u32();
        for round in 0..300 {
            let len = (next() % 24) as usize;
            let seq: Vec<u32> = (0..len)
                .map(|_| match next() % 10 {
                    0 => specials[(next() % specials.len() as u32) as usize],
                    // Bytes of multi-byte characters, complete or not.
                    1..=5 => {
                        let byte = 0x80 + next() % 0x78;
                        tok.token_id(&symbols[byte as usize].to_string()).unwrap()
                    }
                    _ => next() % 256,
                })
                .collect();
            for skip_special in [true, false] {
                let pieces = stream(&tok, &seq, skip_special);
                assert_eq!(pieces.concat(), tok.decode(&seq, skip_special).unwrap(), "round {round}, ids {seq:?}");
            }
        }
    }

    #[test]
    fn window_stays_small() {
        let (tok, _) = tiny();
        let ids = tok.encode(&"in the loop, ü → 你 ".repeat(200), false).unwrap();
        let mut decoder = IncrementalDecoder::new(false);
        let mut out = String::new();
        for &id in &ids {
            out.push_str(&decoder.push(&tok, id).unwrap());
            assert!(decoder.window_len() <= 8, "window {}", decoder.window_len());
        }
        out.push_str(&decoder.finish(&tok).unwrap());
        assert_eq!(out, tok.decode(&ids, false).unwrap());
    }

    #[test]
    fn finish_flushes_an_incomplete_character() {
        let (tok, _) = tiny();
        let ids = tok.encode("a😀", false).unwrap();
        let mut decoder = IncrementalDecoder::new(false);
        assert_eq!(decoder.push(&tok, ids[0]).unwrap(), "a");
        assert_eq!(decoder.push(&tok, ids[1]).unwrap(), "");
        assert_eq!(decoder.push(&tok, ids[2]).unwrap(), "");
        // Two of four bytes: decodes to one U+FFFD, like `decode` does.
        assert_eq!(decoder.finish(&tok).unwrap(), "\u{fffd}");
        assert_eq!(tok.decode(&ids[..3], false).unwrap(), "a\u{fffd}");
        // After finish the decoder starts afresh.
        assert_eq!(decoder.window_len(), 0);
    }

    #[test]
    fn bad_id_is_an_error_and_changes_nothing() {
        let (tok, _) = tiny();
        let ids = tok.encode("é", false).unwrap();
        let mut decoder = IncrementalDecoder::new(false);
        assert_eq!(decoder.push(&tok, ids[0]).unwrap(), "");
        assert!(decoder.push(&tok, u32::MAX).is_err());
        assert_eq!(decoder.push(&tok, ids[1]).unwrap(), "é");
    }
}
