//! Byte-level BPE (GPT-2's scheme), through Hugging Face's `tokenizers`: trained on a text, or
//! loaded from any `tokenizer.json`. Every UTF-8 text encodes, with no unknown tokens: the base
//! vocabulary is the 256 bytes, each written as one printable character.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tokenizers::decoders::DecoderWrapper;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::models::{ModelWrapper, TrainerWrapper};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{AddedToken, Tokenizer, TokenizerBuilder};

/// The token that separates documents (GPT-2's).
pub const END_OF_TEXT: &str = "<|endoftext|>";

/// Why a BPE tokenizer could not be trained, read or used.
#[derive(Debug, thiserror::Error)]
pub enum BpeError {
    #[error("cannot read tokenizer {}: {message}", path.display())]
    Read { path: PathBuf, message: String },
    #[error("cannot train the BPE tokenizer: {0}")]
    Train(String),
    #[error("the BPE tokenizer failed on the text: {0}")]
    Encode(String),
    #[error(
        "--vocab-size is {0}, but a byte-level BPE needs at least 257 (256 bytes and {END_OF_TEXT})"
    )]
    VocabTooSmall(usize),
}

/// A tokenizer builder over `tokenizers`' dynamic parts (any model, normaliser, ...).
type Builder = TokenizerBuilder<
    ModelWrapper,
    NormalizerWrapper,
    PreTokenizerWrapper,
    PostProcessorWrapper,
    DecoderWrapper,
>;

/// A BPE tokenizer and what cinder needs to know of it.
#[derive(Clone)]
pub struct BpeTokenizer {
    inner: Tokenizer,
    /// Token id -> its bytes, for streaming output (byte-level vocabularies).
    bytes: Option<Vec<Vec<u8>>>,
    end_of_text: Option<u32>,
}

impl std::fmt::Debug for BpeTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BpeTokenizer({} tokens)", self.vocab_size())
    }
}

impl PartialEq for BpeTokenizer {
    fn eq(&self, other: &Self) -> bool {
        self.to_json() == other.to_json()
    }
}

impl BpeTokenizer {
    /// Trains a byte-level BPE of `vocab_size` tokens (including [`END_OF_TEXT`]) on `texts`.
    pub fn train<I, S>(texts: I, vocab_size: usize) -> Result<Self, BpeError>
    where
        I: Iterator<Item = S> + Send,
        S: AsRef<str> + Send,
    {
        if vocab_size < 257 {
            return Err(BpeError::VocabTooSmall(vocab_size));
        }
        let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
            .vocab_size(vocab_size)
            .min_frequency(2)
            .show_progress(false)
            .special_tokens(vec![AddedToken::from(END_OF_TEXT, true)])
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build()
            .into();
        let byte_level = ByteLevel::default().add_prefix_space(false);
        let mut tokenizer = Builder::new()
            .with_model(BPE::default().into())
            .with_normalizer(None)
            .with_pre_tokenizer(Some(byte_level.into()))
            .with_post_processor(Some(byte_level.into()))
            .with_decoder(Some(byte_level.into()))
            .build()
            .map_err(|e| BpeError::Train(e.to_string()))?;
        tokenizer
            .train(&mut trainer, texts)
            .map_err(|e| BpeError::Train(e.to_string()))?;
        Ok(Self::wrap(tokenizer.into()))
    }

    /// A tokenizer whose tokens are `chars`, in order, each its own token (a BPE model without
    /// merges or pre-tokenizer, and a decoder that joins tokens as they are): a character
    /// vocabulary in Hugging Face's format.
    pub fn of_chars(chars: &[char]) -> Result<Self, BpeError> {
        let vocab: tokenizers::models::bpe::Vocab = (0u32..)
            .zip(chars)
            .map(|(id, c)| (c.to_string(), id))
            .collect();
        let model = BPE::builder()
            .vocab_and_merges(vocab, Vec::new())
            .build()
            .map_err(|e| BpeError::Train(e.to_string()))?;
        let tokenizer = Builder::new()
            .with_model(model.into())
            .with_decoder(Some(Fuse::new().into()))
            .build()
            .map_err(|e| BpeError::Train(e.to_string()))?;
        Ok(Self::wrap(tokenizer.into()))
    }

    /// Reads a Hugging Face `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<Self, BpeError> {
        let json = std::fs::read_to_string(path).map_err(|e| BpeError::Read {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        Self::from_json(&json).map_err(|message| BpeError::Read {
            path: path.to_path_buf(),
            message,
        })
    }

    /// Parses the text of a `tokenizer.json`.
    pub fn from_json(json: &str) -> Result<Self, String> {
        let inner: Tokenizer = json
            .parse()
            .map_err(|e| format!("not a tokenizer.json ({e})"))?;
        Ok(Self::wrap(inner))
    }

    fn wrap(inner: Tokenizer) -> Self {
        let end_of_text = inner.token_to_id(END_OF_TEXT);
        let byte_level = matches!(inner.get_decoder(), Some(DecoderWrapper::ByteLevel(_)));
        let bytes = byte_level.then(|| {
            let from_char: HashMap<char, u8> = ByteLevel::alphabet()
                .into_iter()
                .map(|c| (c, byte_of(c)))
                .collect();
            let n = inner.get_vocab_size(true);
            (0..n as u32)
                .map(|id| {
                    let token = inner.id_to_token(id).unwrap_or_default();
                    if inner.get_added_vocabulary().is_special_token(&token) {
                        return token.into_bytes();
                    }
                    token
                        .chars()
                        .map(|c| from_char.get(&c).copied())
                        .collect::<Option<Vec<u8>>>()
                        .unwrap_or_else(|| token.into_bytes())
                })
                .collect()
        });
        Self {
            inner,
            bytes,
            end_of_text,
        }
    }

    /// The `tokenizer.json` text, loadable by Hugging Face's libraries.
    pub fn to_json(&self) -> String {
        self.inner
            .to_string(true)
            .expect("a loaded tokenizer serialises")
    }

    /// Tokens in the vocabulary, special ones included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of [`END_OF_TEXT`], if the vocabulary has it.
    pub fn end_of_text(&self) -> Option<u32> {
        self.end_of_text
    }

    /// Appends the ids of `text` to `ids`. The text is cut into paragraphs of a few kilobytes,
    /// only after a newline that a non-space character follows (where GPT-2's pre-tokenizer
    /// cuts anyway, so the ids are those of the whole text), and they are encoded in parallel.
    pub fn encode_into(&self, text: &str, ids: &mut Vec<u32>) -> Result<(), BpeError> {
        const PART: usize = 16 << 10;
        let mut parts = Vec::new();
        let mut start = 0;
        // The first character boundary at or after byte `at`.
        let boundary = |mut at: usize| {
            at = at.min(text.len());
            while !text.is_char_boundary(at) {
                at += 1;
            }
            at
        };
        let mut i = boundary(PART);
        while i < text.len() {
            // The next newline at or after i whose next character is not whitespace.
            match text[i..].find('\n') {
                Some(nl) => {
                    let after = i + nl + 1;
                    let next = text[after..].chars().next();
                    if next.is_some_and(|c| !c.is_whitespace()) {
                        parts.push(&text[start..after]);
                        start = after;
                        i = boundary(after + PART);
                    } else {
                        i = after;
                    }
                }
                None => break,
            }
        }
        parts.push(&text[start..]);
        let encodings = self
            .inner
            .encode_batch_fast(parts, false)
            .map_err(|e| BpeError::Encode(e.to_string()))?;
        for e in &encodings {
            ids.extend_from_slice(e.get_ids());
        }
        Ok(())
    }

    /// The bytes token `id` stands for (its text for special tokens), `None` outside the
    /// vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        match &self.bytes {
            Some(bytes) => bytes.get(id as usize).cloned(),
            None => self.inner.decode(&[id], false).ok().map(String::into_bytes),
        }
    }
}

/// The byte that GPT-2's byte-to-unicode table writes as `c`: printable Latin-1 characters stand
/// for themselves, the others were shifted to U+0100 and up, in byte order.
fn byte_of(c: char) -> u8 {
    let printable = |b: u32| {
        (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    let code = c as u32;
    if printable(code) {
        return code as u8;
    }
    let shifted = (0u32..256).filter(|&b| !printable(b));
    shifted
        .zip(256u32..)
        .find(|&(_, stand_in)| stand_in == code)
        .map_or(b'?', |(b, _)| b as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> BpeTokenizer {
        let text = "To be, or not to be, that is the question.\n".repeat(50);
        BpeTokenizer::train(text.lines(), 300).unwrap()
    }

    #[test]
    fn encoding_in_parallel_paragraphs_gives_the_ids_of_the_whole_text() {
        let t = tokenizer();
        // Paragraph ends fall on every byte offset modulo a character's width.
        let greek = "Πρῶτος πολίτης·\nἈκούσατέ μου. 東京🦀\n\n".repeat(1500);
        let english = "First Citizen:\n  Before we proceed,\n\n\nhear me speak. ü🦀\n \tAll:\n";
        let shifted = (0..4).map(|shift| "x".repeat(shift) + &greek);
        for text in std::iter::once(english.repeat(2000)).chain(shifted) {
            assert!(text.len() > 100 << 10);
            let mut chunked = Vec::new();
            t.encode_into(&text, &mut chunked).unwrap();
            let whole = t.inner.encode_fast(text.as_str(), false).unwrap();
            assert_eq!(chunked, whole.get_ids());
        }
    }

    #[test]
    fn the_byte_table_is_a_bijection() {
        let bytes: std::collections::HashSet<u8> =
            ByteLevel::alphabet().into_iter().map(byte_of).collect();
        assert_eq!(bytes.len(), 256);
        assert_eq!(byte_of('Ġ'), b' ');
        assert_eq!(byte_of('Ċ'), b'\n');
        assert_eq!(byte_of('a'), b'a');
    }

    #[test]
    fn trains_to_the_asked_size_and_round_trips_json() {
        let t = tokenizer();
        assert!(
            t.vocab_size() <= 300 && t.vocab_size() > 257,
            "{}",
            t.vocab_size()
        );
        assert!(t.end_of_text().is_some());
        let back = BpeTokenizer::from_json(&t.to_json()).unwrap();
        assert_eq!(back, t);
        assert!(BpeTokenizer::train("abc".lines(), 100).is_err());
    }

    #[test]
    fn a_character_vocabulary_keeps_its_ids_and_text() {
        let chars: Vec<char> = "\n !,Tabeéhinorst🦀".chars().collect();
        let t = BpeTokenizer::of_chars(&chars).unwrap();
        let t = BpeTokenizer::from_json(&t.to_json()).unwrap();
        let text = "To be, or not\n to be 🦀 é";
        let mut ids = Vec::new();
        t.encode_into(text, &mut ids).unwrap();
        let want: Vec<u32> = text
            .chars()
            .map(|c| chars.iter().position(|&v| v == c).unwrap() as u32)
            .collect();
        assert_eq!(ids, want);
        assert_eq!(t.vocab_size(), chars.len());
        assert_eq!(t.inner.decode(&ids, false).unwrap(), text);
    }
}
