//! `inspect`'s attention maps of a short text, for the page: a task the worker runs
//! ([`super::Queue::inspect`]).

use cinder::inspect::AttentionMaps;
use cinder::sampling::prompt_ids;

use super::error::EngineError;
use crate::models::Loaded;

/// Tokens of text whose attention maps a request may ask for.
pub const MAX_ATTENTION_TOKENS: usize = 64;

/// `inspect`'s attention maps of the first [`MAX_ATTENTION_TOKENS`] tokens of `text` (at most
/// the model's context) under `model`.
pub fn attention(model: &Loaded, text: &str) -> Result<AttentionMaps, EngineError> {
    let mut ids = prompt_ids(&model.tokenizer, text, false).map_err(EngineError::BadText)?;
    ids.truncate(MAX_ATTENTION_TOKENS.min(model.gpt.block_size()));
    let tokens = ids
        .iter()
        .map(|&id| String::from_utf8_lossy(&model.tokenizer.token_bytes(id)).into_owned())
        .collect();
    Ok(AttentionMaps::compute(
        &model.gpt,
        &ids,
        tokens,
        &model.device,
    ))
}
