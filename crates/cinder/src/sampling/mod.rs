//! Sampling text: the decoding loop over the model's key/value cache ([`generate`]), and the
//! choice of each next token from the logits ([`SamplingParams`]).

pub mod generate;
mod params;

pub use params::{DEFAULT_TEMPERATURE, SamplingParams, argmax};
