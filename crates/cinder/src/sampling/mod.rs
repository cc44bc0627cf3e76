//! Sampling text: the decoding loop over the model's key/value cache ([`generate`]), and the
//! choice of each next token from the logits ([`SamplingParams`]).

pub mod generate;
mod params;

pub use params::{DEFAULT_TEMPERATURE, DEFAULT_TOP_K, SamplingParams, argmax};

/// The text `generate` continues unless given one: a new line, so that samples start as a text's
/// lines do.
pub const DEFAULT_PROMPT: &str = "\n";
