//! Data for cinder: text in, batches of token ids out. Nothing here knows about Burn.
//!
//! - [`corpus`]: reading a text file (memory-mapped, checked for UTF-8, BOM and CRLF handled).
//! - [`identity`]: a text's size and checksum, to tell whether it changed.
//! - [`tokenizer`]: the character vocabulary and encoding/decoding.
//! - [`split`]: the encoded text cut into training and validation parts.
//! - [`batcher`]: seeded random windows drawn from a split.

pub mod batcher;
pub mod corpus;
pub mod identity;
pub mod split;
pub mod tokenizer;

pub use batcher::{Batch, Batcher};
pub use corpus::{Corpus, CorpusError, normalized_chars};
pub use identity::{IdentityHasher, TextIdentity};
pub use split::{Split, SplitError, Splits};
pub use tokenizer::{CharTokenizer, TokenizerError};
