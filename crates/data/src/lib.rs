//! Data for cinder: text in, batches of token ids out. Nothing here knows about Burn.
//!
//! - [`corpus`]: reading a text file (memory-mapped, checked for UTF-8, BOM and CRLF handled).
//! - [`identity`]: a text's size and checksum, to tell whether it changed.
//! - [`chars`]: the character vocabulary; [`bpe`]: byte-level BPE (Hugging Face's `tokenizers`).
//! - [`tokenizer`]: either of them, encoding and (streaming) decoding.
//! - [`source`]: the documents of a run (files or a folder), walked in pieces, cut in two.
//! - [`prepared`]: a text encoded once into token files that training memory-maps.
//! - [`split`]: the encoded text cut into training and validation parts.
//! - [`batcher`]: seeded random windows drawn from a split.

pub mod batcher;
pub mod bpe;
pub mod chars;
pub mod corpus;
pub mod identity;
pub mod prepared;
pub mod source;
pub mod split;
pub mod tokenizer;

pub use batcher::{Batch, Batcher};
pub use bpe::{BpeError, BpeTokenizer};
pub use chars::{CharTokenizer, TokenizerError};
pub use corpus::{Corpus, CorpusError, normalized_chars};
pub use identity::{IdentityHasher, TextIdentity};
pub use source::{Piece, SourceError, Sources};
pub use split::{Ids, Split, SplitError, Splits, Store};
pub use tokenizer::{DocumentBreak, EncodeError, TextStream, Tokenizer};
