//! Sampling text: the decoding loop over the model's key/value cache ([`generate`]), the choice
//! of each next token from the logits and what the row has said ([`SamplingParams`]), the prompt's tokens
//! ([`prompt_ids`]), what the model thought of each token ([`token_probs`]), and the text
//! `generate` prints by default ([`sample`]).

pub mod generate;
mod params;
mod probs;

use burn::prelude::*;
use cinder_data::{EncodeError, Tokenizer};
use cinder_model::Gpt;

use generate::GenerateOptions;

pub use params::{BadSampling, DEFAULT_TEMPERATURE, DEFAULT_TOP_K, SamplingParams, Seen, argmax};
pub use probs::{TokenProbs, log_normaliser, token_probs, token_text};

/// The text `generate` continues unless given one: a new line, so that samples start as a text's
/// lines do.
pub const DEFAULT_PROMPT: &str = "\n";

/// Why a prompt cannot be continued.
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    #[error("the prompt does not fit the model: {0}")]
    DoesNotFit(EncodeError),
    #[error("the prompt is empty: give at least one character the model knows")]
    Empty,
}

/// The tokens of `prompt`, read as the training text was (line endings and byte-order marks
/// normalised). With `drop_unknown`, characters a character model does not know are left out
/// rather than refused. A prompt of no tokens is refused: there is nothing to continue.
pub fn prompt_ids(
    tokenizer: &Tokenizer,
    prompt: &str,
    drop_unknown: bool,
) -> Result<Vec<u32>, PromptError> {
    let text: String = cinder_data::normalized_chars(prompt).collect();
    let ids = match (tokenizer.encode(&text), tokenizer) {
        (Ok(ids), _) => ids,
        (Err(_), Tokenizer::Char(chars)) if drop_unknown => {
            let kept = text.chars().filter(|&c| chars.id(c).is_some());
            chars.encode(kept).expect("only known characters are left")
        }
        (Err(e), _) => return Err(PromptError::DoesNotFit(e)),
    };
    if ids.is_empty() {
        return Err(PromptError::Empty);
    }
    Ok(ids)
}

/// `tokens` tokens of `model` after `generate`'s default prompt, with its default temperature
/// and top-k and with `seed`: the text `generate --seed <seed> --max-new-tokens <tokens>` prints.
/// A run samples it at each evaluation (its `samples.jsonl`), on a random stream of its own: the
/// run's losses do not change.
pub fn sample(
    model: &Gpt,
    tokenizer: &Tokenizer,
    tokens: usize,
    seed: u64,
    device: &Device,
) -> String {
    // A vocabulary without the prompt's newline starts from its first token.
    let prompt = tokenizer
        .encode(DEFAULT_PROMPT)
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| vec![0]);
    let opts = GenerateOptions {
        max_new_tokens: tokens,
        num_samples: 1,
        sampling: SamplingParams {
            temperature: DEFAULT_TEMPERATURE,
            top_k: Some(DEFAULT_TOP_K),
            ..SamplingParams::default()
        },
        seed,
        use_cache: true,
        tokens: tokenizer.vocab_size(),
    };
    let new = generate::generate(model, &prompt, &opts, device, |_| {});
    let mut all = prompt;
    all.extend(&new[0]);
    tokenizer.decode(&all)
}
