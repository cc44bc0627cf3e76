//! A run's tokenizer: characters, or byte-level BPE. Text in (already normalised: see
//! [`crate::corpus`]), token ids out, and back, streaming.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::bpe::{BpeError, BpeTokenizer};
use crate::chars::{CharTokenizer, TokenizerError};

/// The file a BPE tokenizer is saved in, beside the record that names it.
pub const TOKENIZER_JSON: &str = "tokenizer.json";

/// How a tokenizer is recorded in a `meta.json`: a character vocabulary inline (a JSON array of
/// characters, as every checkpoint before BPE has it), or a BPE in a `tokenizer.json` beside it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
#[allow(clippy::large_enum_variant)] // one per run or checkpoint: its size does not matter
pub enum TokenizerRecord {
    Chars(CharTokenizer),
    Bpe { bpe: String, vocab_size: usize },
}

impl TokenizerRecord {
    pub fn vocab_size(&self) -> usize {
        match self {
            TokenizerRecord::Chars(t) => t.vocab_size(),
            TokenizerRecord::Bpe { vocab_size, .. } => *vocab_size,
        }
    }

    /// The file, inside the folder of the record, that holds the tokenizer, if any.
    pub fn file(&self) -> Option<&str> {
        match self {
            TokenizerRecord::Chars(_) => None,
            TokenizerRecord::Bpe { bpe, .. } => Some(bpe),
        }
    }

    /// The tokenizer recorded; `json` is the text of [`TokenizerRecord::file`] (read and
    /// checked by the caller), needed for BPE.
    pub fn load(&self, json: Option<&str>) -> Result<Tokenizer, String> {
        match (self, json) {
            (TokenizerRecord::Chars(t), _) => Ok(Tokenizer::Char(t.clone())),
            (TokenizerRecord::Bpe { bpe, .. }, None) => Err(format!("{bpe} is missing")),
            (TokenizerRecord::Bpe { vocab_size, .. }, Some(json)) => {
                let t = BpeTokenizer::from_json(json)?;
                if t.vocab_size() != *vocab_size {
                    return Err(format!(
                        "it has {} tokens, but {vocab_size} are recorded",
                        t.vocab_size()
                    ));
                }
                Ok(Tokenizer::Bpe(t))
            }
        }
    }

    /// Reads the tokenizer recorded for the folder `dir`.
    pub fn load_from(&self, dir: &Path) -> Result<Tokenizer, String> {
        let json = match self.file() {
            Some(name) => Some(
                std::fs::read_to_string(dir.join(name))
                    .map_err(|e| format!("cannot read {}: {e}", dir.join(name).display()))?,
            ),
            None => None,
        };
        self.load(json.as_deref())
    }
}

/// Text that could not be encoded.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error(transparent)]
    Unknown(#[from] TokenizerError),
    #[error(transparent)]
    Bpe(#[from] BpeError),
}

/// The character tokenizer's name, as configs and checkpoints write it.
pub const CHAR: &str = "char";
/// The byte-level BPE's name, likewise.
pub const BPE: &str = "bpe";

/// Characters or BPE.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)] // one per run: its size does not matter
pub enum Tokenizer {
    Char(CharTokenizer),
    Bpe(BpeTokenizer),
}

impl Tokenizer {
    /// [`CHAR`] or [`BPE`].
    pub fn name(&self) -> &'static str {
        match self {
            Tokenizer::Char(_) => CHAR,
            Tokenizer::Bpe(_) => BPE,
        }
    }

    pub fn vocab_size(&self) -> usize {
        match self {
            Tokenizer::Char(t) => t.vocab_size(),
            Tokenizer::Bpe(t) => t.vocab_size(),
        }
    }

    /// How to record this tokenizer in a `meta.json`.
    pub fn record(&self) -> TokenizerRecord {
        match self {
            Tokenizer::Char(t) => TokenizerRecord::Chars(t.clone()),
            Tokenizer::Bpe(t) => TokenizerRecord::Bpe {
                bpe: TOKENIZER_JSON.into(),
                vocab_size: t.vocab_size(),
            },
        }
    }

    /// The text of the file [`TokenizerRecord::file`] names, for a tokenizer recorded in one.
    pub fn file_json(&self) -> Option<String> {
        match self {
            Tokenizer::Char(_) => None,
            Tokenizer::Bpe(t) => Some(t.to_json()),
        }
    }

    /// The tokenizer as a Hugging Face `tokenizer.json`: a BPE's own file; for characters, a
    /// tokenizer with one token per character and the same ids ([`BpeTokenizer::of_chars`]).
    pub fn hugging_face_json(&self) -> Result<String, BpeError> {
        match self {
            Tokenizer::Char(t) => Ok(BpeTokenizer::of_chars(t.chars())?.to_json()),
            Tokenizer::Bpe(t) => Ok(t.to_json()),
        }
    }

    /// The id of the end-of-text token, if the vocabulary has one.
    pub fn end_of_text(&self) -> Option<u32> {
        match self {
            Tokenizer::Char(_) => None,
            Tokenizer::Bpe(t) => t.end_of_text(),
        }
    }

    /// What one token is, for messages: "characters" or "tokens".
    pub fn unit(&self) -> &'static str {
        match self {
            Tokenizer::Char(_) => "characters",
            Tokenizer::Bpe(_) => "tokens",
        }
    }

    /// Appends the ids of `text` to `ids`; on error `ids` is left as it was.
    pub fn encode_into(&self, text: &str, ids: &mut Vec<u32>) -> Result<(), EncodeError> {
        match self {
            Tokenizer::Char(t) => Ok(t.encode_into(text.chars(), ids)?),
            Tokenizer::Bpe(t) => Ok(t.encode_into(text, ids)?),
        }
    }

    /// The ids of `text`.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, EncodeError> {
        let mut ids = Vec::new();
        self.encode_into(text, &mut ids)?;
        Ok(ids)
    }

    /// What goes between two documents: the end-of-text token for BPE, a blank line for
    /// characters (as text, so that it encodes like the rest).
    pub fn document_break(&self) -> DocumentBreak {
        match self {
            Tokenizer::Bpe(t) => match t.end_of_text() {
                Some(id) => DocumentBreak::Token(id),
                None => DocumentBreak::Text("\n\n"),
            },
            Tokenizer::Char(_) => DocumentBreak::Text("\n\n"),
        }
    }

    /// The bytes token `id` stands for; panics on an id outside the vocabulary (a model's
    /// output never is).
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        match self {
            Tokenizer::Char(t) => t.decode(&[id]).into_bytes(),
            Tokenizer::Bpe(t) => t
                .token_bytes(id)
                .unwrap_or_else(|| panic!("token {id} is outside the vocabulary")),
        }
    }

    /// The text of `ids`; bytes that do not decode become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut stream = TextStream::new(self);
        let mut text: String = ids.iter().map(|&id| stream.push(id)).collect();
        text.push_str(&stream.finish());
        text
    }
}

/// What [`Tokenizer::document_break`] puts between documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DocumentBreak {
    Token(u32),
    Text(&'static str),
}

/// Turns token ids into text as they come. A token may end inside a UTF-8 character: its bytes
/// are held back until the character is complete; bytes that can never decode become U+FFFD.
pub struct TextStream<'a> {
    tokenizer: &'a Tokenizer,
    pending: Vec<u8>,
}

impl<'a> TextStream<'a> {
    pub fn new(tokenizer: &'a Tokenizer) -> Self {
        Self {
            tokenizer,
            pending: Vec::new(),
        }
    }

    /// The text that token `id` completes (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        self.push_split(id).1
    }

    /// [`TextStream::push`], with how many of the text's first characters are earlier tokens'
    /// text: bytes held back before `id` that `id`'s bytes did not complete (a character's
    /// start followed by no continuation), each shown as U+FFFD. Token `id`'s own text starts
    /// after them.
    pub fn push_split(&mut self, id: u32) -> (usize, String) {
        let mut held = self.pending.len();
        self.pending.extend(self.tokenizer.token_bytes(id));
        let mut out = String::new();
        let mut earlier = 0;
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(text) => {
                    out.push_str(text);
                    self.pending.clear();
                    return (earlier, out);
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // from_utf8 found these bytes valid: the unwrap_or_default never applies.
                    out.push_str(std::str::from_utf8(&self.pending[..valid]).unwrap_or_default());
                    match e.error_len() {
                        // Bytes that no continuation can make valid.
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            if valid + bad <= held {
                                earlier = out.chars().count();
                            }
                            held = held.saturating_sub(valid + bad);
                            self.pending.drain(..valid + bad);
                        }
                        // The start of a character whose other bytes may come next.
                        None => {
                            self.pending.drain(..valid);
                            return (earlier, out);
                        }
                    }
                }
            }
        }
    }

    /// The end of the stream: bytes still held back never decoded (the stream is empty after).
    pub fn finish(&mut self) -> String {
        if self.pending.is_empty() {
            String::new()
        } else {
            self.pending.clear();
            char::REPLACEMENT_CHARACTER.to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The token that is the single byte `b`.
    fn byte_token(t: &Tokenizer, b: u8) -> u32 {
        (0..t.vocab_size() as u32)
            .find(|&id| t.token_bytes(id) == [b])
            .unwrap()
    }

    fn bpe() -> Tokenizer {
        let text = "To be, or not to be: 🦀 über 東京 e\u{301}\n".repeat(40);
        Tokenizer::Bpe(BpeTokenizer::train(text.lines(), 320).unwrap())
    }

    #[test]
    fn round_trips_over_arbitrary_unicode() {
        let t = bpe();
        let samples = [
            "plain ascii, with  spaces\tand\nnewlines",
            "emoji 🦀🧪👩‍👩‍👧 and flags 🇫🇷",
            "combining: e\u{301} a\u{308}\u{332} Z\u{335}\u{30d}",
            "CJK 東京は日本の首都です, 한국어, ภาษาไทย",
            "rare: \u{10FFFF} \u{0} \u{7f} \u{feff}",
        ];
        for s in samples {
            let ids = t.encode(s).unwrap();
            assert_eq!(t.decode(&ids), s);
            // Streaming, token by token, gives the same text.
            let mut stream = TextStream::new(&t);
            let mut out: String = ids.iter().map(|&id| stream.push(id)).collect();
            out.push_str(&stream.finish());
            assert_eq!(out, s);
        }
    }

    #[test]
    fn a_character_split_across_tokens_is_held_back_until_whole() {
        let t = bpe();
        // Single-byte tokens of "ü" (0xC3 0xBC) and "🦀" (4 bytes) come out at their last byte.
        let byte_id = |b: u8| byte_token(&t, b);
        let mut stream = TextStream::new(&t);
        assert_eq!(stream.push(byte_id(0xC3)), "");
        assert_eq!(stream.push(byte_id(0xBC)), "ü");
        let crab = "🦀".as_bytes();
        for &b in &crab[..3] {
            assert_eq!(stream.push(byte_id(b)), "");
        }
        assert_eq!(stream.push(byte_id(crab[3])), "🦀");
        assert_eq!(stream.finish(), "");
    }

    #[test]
    fn bytes_that_never_decode_become_replacement_characters() {
        let t = bpe();
        let byte_id = |b: u8| byte_token(&t, b);
        let mut stream = TextStream::new(&t);
        // A lone continuation byte, then an 'a'.
        assert_eq!(stream.push(byte_id(0x80)), "\u{fffd}");
        assert_eq!(stream.push(byte_id(b'a')), "a");
        // A character's start, interrupted by an ASCII byte: the U+FFFD is the start's text.
        assert_eq!(stream.push_split(byte_id(0xE6)), (0, String::new()));
        assert_eq!(stream.push_split(byte_id(b'b')), (1, "\u{fffd}b".into()));
        // Two starts, then one continued: the first start's U+FFFD comes before the second's
        // token, whose character is whole with the third.
        assert_eq!(stream.push_split(byte_id(0xD6)), (0, String::new()));
        assert_eq!(stream.push_split(byte_id(0xC3)), (1, "\u{fffd}".into()));
        assert_eq!(stream.push_split(byte_id(0xBC)), (0, "ü".into()));
        // A lone continuation byte of the token's own is its own text.
        assert_eq!(stream.push_split(byte_id(0x80)), (0, "\u{fffd}".into()));
        // An undecodable tail at the end of the stream.
        assert_eq!(stream.push(byte_id(0xF0)), "");
        assert_eq!(stream.push(byte_id(0x9F)), "");
        assert_eq!(stream.finish(), "\u{fffd}");
    }

    #[test]
    fn characters_encode_as_before() {
        let t = Tokenizer::Char(CharTokenizer::from_chars("abc\n".chars()));
        assert_eq!(t.encode("cab\n").unwrap(), vec![3, 1, 2, 0]);
        assert_eq!(t.decode(&[3, 1, 2]), "cab");
        assert!(t.encode("abz").is_err());
        assert_eq!(t.document_break(), DocumentBreak::Text("\n\n"));
    }
}
