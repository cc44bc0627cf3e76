//! A completion request: its body read, and every value checked against what this server
//! serves; a refusal is a 400 naming the parameter to fix.

use std::time::{Duration, Instant};

use cinder::sampling::SamplingParams;
use serde::Deserialize;
use serde_json::Value;

use super::error::ApiError;
use crate::engine::Job;

/// Prompts one request may hold.
pub const MAX_PROMPTS: usize = 16;

/// The most alternatives `logprobs` may ask for (OpenAI's limit).
pub const MAX_LOGPROBS: usize = 5;

/// Characters of one stop string.
pub const MAX_STOP_CHARS: usize = 256;

/// What the server allows in one request.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_tokens: usize,
    pub max_n: usize,
    pub max_prompts: usize,
    /// Characters in one prompt.
    pub max_prompt_chars: usize,
    /// Rows decoded together (`serve --max-batch`): a request's prompts times `n` at most.
    pub max_rows: usize,
    /// From arrival to the last token.
    pub timeout: Duration,
}

/// A string or an array of strings.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s],
            Self::Many(v) => v,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    include_usage: Option<bool>,
    /// vLLM's extension: with `include_usage`, every chunk carries the usage so far.
    continuous_usage_stats: Option<bool>,
}

/// `POST /v1/completions`'s body: OpenAI's fields and the extensions `top_k`, `min_p` and
/// `repetition_penalty` (vLLM's and llama.cpp's). Fields OpenAI has and cinder cannot serve are
/// read so that they can be refused by name; any other field is a 400 naming it, as OpenAI's API
/// answers, so that a misspelt sampler is never silently off.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CompletionRequest {
    model: String,
    prompt: Option<OneOrMany>,
    max_tokens: Option<i64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
    seed: Option<i64>,
    stop: Option<OneOrMany>,
    n: Option<i64>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    echo: Option<bool>,
    logprobs: Option<Value>,
    logit_bias: Option<serde_json::Map<String, Value>>,
    best_of: Option<i64>,
    suffix: Option<String>,
    presence_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
    min_p: Option<f64>,
    repetition_penalty: Option<f64>,
    /// OpenAI's end-user id: accepted, and not used.
    #[allow(dead_code)]
    user: Option<String>,
}

/// A checked completion request.
#[derive(Debug)]
pub struct Completion {
    pub job: Job,
    /// Whether each choice carries its tokens' log-probabilities.
    pub logprobs: bool,
    pub stream: bool,
    pub usage: StreamUsage,
}

/// Where a stream sends the usage.
#[derive(Debug, Clone, Copy)]
pub struct StreamUsage {
    /// In a last chunk (`stream_options.include_usage`).
    pub at_end: bool,
    /// On every chunk too, so far (vLLM's `continuous_usage_stats`, with `include_usage`).
    pub on_every_chunk: bool,
}

/// Reads a request's JSON body as `T`; a body that is not a JSON object is a 400, and so is a
/// field unknown, missing or of the wrong kind, naming it.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::malformed(format!("the body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::malformed("the body must be a JSON object"));
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let param = path.split(['.', '[']).next().unwrap_or("").to_string();
        let message = e.into_inner().to_string();
        if message.starts_with("unknown field `") {
            // A field this server does not know: the path names it (`stream_options.x`).
            return ApiError::invalid(&path, message);
        }
        if param.is_empty() || param == "?" {
            // A field missing at the top level: serde names it in the message.
            let missing = message
                .strip_prefix("missing field `")
                .and_then(|m| m.split('`').next())
                .unwrap_or("");
            return ApiError::invalid(missing, message.clone());
        }
        ApiError::invalid(&param, format!("{param}: {message}"))
    })
}

/// Reads and checks a completion request's body; every refusal is a 400 naming its `param`.
pub fn parse_completion(body: &[u8], limits: &Limits) -> Result<Completion, ApiError> {
    let r: CompletionRequest = parse_json(body)?;

    let unsupported = |param: &str, what: &str| {
        Err(ApiError::invalid(
            param,
            format!("{param}: {what} is not supported by cinder"),
        ))
    };
    let echo = r.echo.unwrap_or(false);
    let logprobs = match r.logprobs {
        None | Some(Value::Null) => None,
        Some(n) => match n.as_u64().filter(|&n| n <= MAX_LOGPROBS as u64) {
            Some(n) => Some(n as usize),
            None => {
                return Err(ApiError::invalid(
                    "logprobs",
                    format!("logprobs is {n}, but it must be 0 to {MAX_LOGPROBS} (or null)"),
                ));
            }
        },
    };
    if r.logit_bias.is_some_and(|b| !b.is_empty()) {
        return unsupported("logit_bias", "biasing tokens");
    }
    match r.best_of {
        Some(b) if b > 1 => return unsupported("best_of", "best_of above 1"),
        Some(b) if b < 1 => {
            return Err(ApiError::invalid(
                "best_of",
                format!("best_of is {b}, but it must be at least 1 (and cinder serves only 1)"),
            ));
        }
        _ => {}
    }
    if r.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return unsupported("suffix", "a suffix (insertion)");
    }

    // No prompt, or an empty one: sample from the start, as `generate` does.
    let prompts = r
        .prompt
        .map_or_else(|| vec![String::new()], OneOrMany::into_vec);
    if prompts.is_empty() || prompts.len() > limits.max_prompts {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "prompt holds {} strings, but this server takes 1 to {}",
                prompts.len(),
                limits.max_prompts
            ),
        ));
    }
    if let Some((i, p)) = prompts
        .iter()
        .enumerate()
        .find(|(_, p)| p.chars().count() > limits.max_prompt_chars)
    {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "prompt {i} has {} characters, but this server takes up to {} (serve \
                 --max-prompt-chars)",
                p.chars().count(),
                limits.max_prompt_chars
            ),
        ));
    }
    let max_tokens = r.max_tokens.unwrap_or(16);
    // With echo, 0 scores the prompt without generating.
    let least = if echo { 0 } else { 1 };
    if !(least..=limits.max_tokens as i64).contains(&max_tokens) {
        return Err(ApiError::invalid(
            "max_tokens",
            format!(
                "max_tokens is {max_tokens}, but it must be {least} to {}{}",
                limits.max_tokens,
                if echo { "" } else { " (0 only with echo)" }
            ),
        ));
    }
    let n = r.n.unwrap_or(1);
    if !(1..=limits.max_n as i64).contains(&n) {
        return Err(ApiError::invalid(
            "n",
            format!("n is {n}, but it must be 1 to {}", limits.max_n),
        ));
    }
    if prompts.len() * n as usize > limits.max_rows {
        return Err(ApiError::invalid(
            "n",
            format!(
                "{} prompts times n = {n} is {} choices, but this server decodes at most {} at once \
                 (serve --max-batch)",
                prompts.len(),
                prompts.len() * n as usize,
                limits.max_rows
            ),
        ));
    }
    let temperature = r.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::invalid(
            "temperature",
            format!("temperature is {temperature}, but it must be 0 (greedy) to 2"),
        ));
    }
    // OpenAI's samplers at OpenAI's defaults; the checks are `generate`'s.
    let top_p = r.top_p.unwrap_or(1.0);
    let sampling = SamplingParams {
        temperature: temperature as f32,
        // vLLM's -1 is off.
        top_k: match r.top_k {
            None | Some(-1) => None,
            Some(k) if k < 1 => {
                return Err(ApiError::invalid(
                    "top_k",
                    format!("top_k is {k}, but it must be at least 1 (or -1: off)"),
                ));
            }
            Some(k) => Some(k as usize),
        },
        top_p: (top_p != 1.0).then_some(top_p as f32),
        min_p: r.min_p.map(|p| p as f32),
        presence_penalty: r.presence_penalty.unwrap_or(0.0) as f32,
        frequency_penalty: r.frequency_penalty.unwrap_or(0.0) as f32,
        repetition_penalty: r.repetition_penalty.unwrap_or(1.0) as f32,
    };
    sampling
        .check()
        .map_err(|e| ApiError::invalid(e.param, e.to_string()))?;
    let stop = r.stop.map(OneOrMany::into_vec).unwrap_or_default();
    if stop.len() > 4
        || stop
            .iter()
            .any(|s| s.is_empty() || s.chars().count() > MAX_STOP_CHARS)
    {
        return Err(ApiError::invalid(
            "stop",
            format!("stop holds up to 4 strings of 1 to {MAX_STOP_CHARS} characters"),
        ));
    }
    let stream = r.stream.unwrap_or(false);
    let options = r.stream_options.as_ref();
    let at_end = options.and_then(|o| o.include_usage).unwrap_or(false);
    let usage = StreamUsage {
        at_end,
        on_every_chunk: at_end && options.and_then(|o| o.continuous_usage_stats) == Some(true),
    };
    let seed = match r.seed {
        Some(seed) => seed as u64,
        None => rand::random(),
    };
    Ok(Completion {
        job: Job {
            model: r.model,
            prompts,
            n: n as usize,
            max_tokens: max_tokens as usize,
            sampling,
            seed,
            stop,
            logprobs,
            echo,
            deadline: Instant::now() + limits.timeout,
        },
        logprobs: logprobs.is_some(),
        stream,
        usage,
    })
}
