//! What a completion request asks the engine for, and what the engine tells it back.

use std::time::Instant;

use cinder::sampling::SamplingParams;

use super::error::EngineError;

/// What a completion request asks the worker for.
#[derive(Debug, Clone)]
pub struct Job {
    pub model: String,
    pub prompts: Vec<String>,
    /// Choices per prompt.
    pub n: usize,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub seed: u64,
    pub stop: Vec<String>,
    /// Log-probabilities of each token and of this many alternatives (OpenAI's `logprobs`).
    pub logprobs: Option<usize>,
    /// The prompt comes first in each choice's text, with its tokens' log-probabilities if
    /// `logprobs` asks (OpenAI's `echo`).
    pub echo: bool,
    /// When the request must be over (its time limit from when it arrived): a choice still
    /// generating then ends the request with an error.
    pub deadline: Instant,
}

impl Job {
    /// Its rows in a batch: each prompt's `n` choices.
    pub fn rows(&self) -> usize {
        self.prompts.len() * self.n
    }
}

/// A token of a choice's text and what the model thought of it, as OpenAI's `logprobs` show it.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token as text ([`cinder::sampling::token_text`]).
    pub text: String,
    /// Its log-probability; none for a text's first token, which nothing predicts.
    pub logprob: Option<f32>,
    /// The most likely tokens (with the token itself), most likely first.
    pub top: Vec<(String, f32)>,
    /// Where its text starts in the choice's text, in characters.
    pub offset: usize,
}

/// Why a choice ended, in OpenAI's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Finish {
    /// A stop string was met.
    Stop,
    /// `max_tokens` were generated, or the server is stopping.
    Length,
}

/// What the worker reports about a job, in this order: `Started` (or `Failed`), `Text` and
/// `Finished` for each choice (indexed prompt by prompt, `n` per prompt), then `Done` (or
/// `Failed`, past the time limit).
#[derive(Debug)]
pub enum Event {
    Started {
        prompt_tokens: usize,
    },
    /// Text of choice `index`, once `written` tokens of the request (every choice's) are, with
    /// its tokens' log-probabilities if the request asked for them.
    Text {
        index: usize,
        text: String,
        written: usize,
        logprobs: Vec<TokenLogprob>,
    },
    Finished {
        index: usize,
        reason: Finish,
    },
    Done {
        completion_tokens: usize,
    },
    Failed(EngineError),
}
