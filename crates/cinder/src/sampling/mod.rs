//! Sampling text: the decoding loop over the model's key/value cache ([`generate`]), the choice
//! of each next token from the logits ([`SamplingParams`]), and the prompt's tokens
//! ([`prompt_ids`]).

pub mod generate;
mod params;

use cinder_data::{EncodeError, Tokenizer};

pub use params::{DEFAULT_TEMPERATURE, DEFAULT_TOP_K, SamplingParams, argmax};

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
