//! OpenAI's completions API as cinder speaks it: the request and what is checked in it, the
//! response and stream chunk objects, and errors in OpenAI's shape
//! (`{"error": {"message", "type", "param", "code"}}`).

use std::time::{Duration, Instant};

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use cinder::sampling::SamplingParams;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::engine::{Finish, Job};

/// Prompts one request may hold.
pub const MAX_PROMPTS: usize = 16;

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

/// An error answered to a client: an HTTP status and OpenAI's error object.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, code: &'static str, message: String) -> Self {
        Self {
            status,
            message,
            kind,
            param: None,
            code: Some(code),
        }
    }

    /// 400: `param` has a value that cannot be served.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.to_string()),
            ..Self::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "invalid_value",
                message.into(),
            )
        }
    }

    /// 400: the body is not JSON at all.
    pub fn malformed(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "invalid_json",
            message.into(),
        )
    }

    /// 401: a missing or wrong API key.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid_api_key",
            "this server needs its API key: send the header `Authorization: Bearer <key>`".into(),
        )
    }

    /// 404: no model has this id.
    pub fn no_model(id: &str) -> Self {
        Self {
            param: Some("model".into()),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "model_not_found",
                format!("there is no model {id:?} here: GET /v1/models lists them"),
            )
        }
    }

    /// 404: no such route.
    pub fn no_route(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "unknown_url",
            format!(
                "there is no {method} {path} here: the API is POST /v1/completions, GET /v1/models and GET /health"
            ),
        )
    }

    /// 413: the body is over the limit.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "request_too_large",
            format!("the request body is over this server's limit of {limit} bytes"),
        )
    }

    /// 429: the queue is full.
    pub fn busy(queued: usize) -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "queue_full",
            format!("{queued} requests are waiting already: try again shortly"),
        )
    }

    /// 408: the request ran past the server's time limit (`--timeout`).
    pub fn timeout() -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "timeout_error",
            "request_timeout",
            "the request ran past this server's time limit (serve --timeout): ask for fewer \
             tokens or choices"
                .into(),
        )
    }

    /// 500: the generation worker is gone.
    pub fn worker_gone() -> Self {
        Self::server("the generation worker stopped: see the server's log".into())
    }

    /// 503: the server is stopping.
    pub fn stopping() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable_error",
            "shutting_down",
            "the server is shutting down".into(),
        )
    }

    /// 500: the server failed (a checkpoint that does not load).
    pub fn server(message: String) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "internal_error",
            message,
        )
    }

    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            let headers = response.headers_mut();
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
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
struct StreamOptions {
    include_usage: Option<bool>,
    /// vLLM's extension: with `include_usage`, every chunk carries the usage so far.
    continuous_usage_stats: Option<bool>,
}

/// `POST /v1/completions`'s body. Fields OpenAI has and cinder cannot serve are read so that
/// they can be refused by name; others are ignored, as OpenAI's own clients add some.
#[derive(Debug, Deserialize)]
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
}

/// A checked completion request.
#[derive(Debug)]
pub struct Completion {
    pub job: Job,
    pub stream: bool,
    pub include_usage: bool,
    /// Every chunk carries the usage so far (vLLM's `continuous_usage_stats`, with
    /// `include_usage`).
    pub continuous_usage: bool,
}

/// Reads and checks a completion request's body; every refusal is a 400 naming its `param`.
pub fn parse_completion(body: &[u8], limits: &Limits) -> Result<Completion, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::malformed(format!("the body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::malformed("the body must be a JSON object"));
    }
    let r: CompletionRequest = serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let param = path.split(['.', '[']).next().unwrap_or("").to_string();
        let message = e.into_inner().to_string();
        if param.is_empty() || param == "?" {
            // A field missing at the top level: serde names it in the message.
            let missing = message
                .strip_prefix("missing field `")
                .and_then(|m| m.split('`').next())
                .unwrap_or("");
            return ApiError::invalid(missing, message.clone());
        }
        ApiError::invalid(&param, format!("{param}: {message}"))
    })?;

    let unsupported = |param: &str, what: &str| {
        Err(ApiError::invalid(
            param,
            format!("{param}: {what} is not supported by cinder"),
        ))
    };
    if r.echo == Some(true) {
        return unsupported("echo", "echoing the prompt");
    }
    if r.logprobs.is_some_and(|l| !l.is_null()) {
        return unsupported("logprobs", "returning log-probabilities");
    }
    if r.logit_bias.is_some_and(|b| !b.is_empty()) {
        return unsupported("logit_bias", "biasing tokens");
    }
    if r.best_of.is_some_and(|b| b > 1) {
        return unsupported("best_of", "best_of above 1");
    }
    if r.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return unsupported("suffix", "a suffix (insertion)");
    }
    for (param, value) in [
        ("presence_penalty", r.presence_penalty),
        ("frequency_penalty", r.frequency_penalty),
    ] {
        if value.is_some_and(|v| v != 0.0) {
            return unsupported(param, "a penalty");
        }
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
    if !(1..=limits.max_tokens as i64).contains(&max_tokens) {
        return Err(ApiError::invalid(
            "max_tokens",
            format!(
                "max_tokens is {max_tokens}, but it must be 1 to {}",
                limits.max_tokens
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
    let top_p = r.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid(
            "top_p",
            format!("top_p is {top_p}, but it must be in (0, 1]"),
        ));
    }
    if let Some(k) = r.top_k
        && k < 1
    {
        return Err(ApiError::invalid(
            "top_k",
            format!("top_k is {k}, but it must be at least 1"),
        ));
    }
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
    let include_usage = options.and_then(|o| o.include_usage).unwrap_or(false);
    let continuous_usage =
        include_usage && options.and_then(|o| o.continuous_usage_stats) == Some(true);
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
            sampling: SamplingParams {
                temperature: temperature as f32,
                top_k: r.top_k.map(|k| k as usize),
                top_p: (top_p < 1.0).then_some(top_p as f32),
            },
            seed,
            stop,
            deadline: Instant::now() + limits.timeout,
        },
        stream,
        include_usage,
        continuous_usage,
    })
}

/// The fields every completion object and chunk begins with.
pub struct Header {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Header {
    fn object(&self, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    /// A whole (not streamed) completion.
    pub fn completion(&self, texts: &[(String, Finish)], usage: Usage) -> Value {
        let choices = texts
            .iter()
            .enumerate()
            .map(|(index, (text, finish))| {
                json!({"text": text, "index": index, "logprobs": null, "finish_reason": finish})
            })
            .collect();
        let mut object = self.object(Value::Array(choices));
        object["usage"] = usage.json();
        object
    }

    /// A stream chunk: text for choice `index`, or its end; with the usage so far if given.
    pub fn chunk(
        &self,
        index: usize,
        text: &str,
        finish: Option<Finish>,
        usage: Option<Usage>,
    ) -> Value {
        let mut object = self.object(json!([
            {"text": text, "index": index, "logprobs": null, "finish_reason": finish}
        ]));
        if let Some(usage) = usage {
            object["usage"] = usage.json();
        }
        object
    }

    /// The stream's last chunk when usage was asked for: no choices, the usage.
    pub fn usage_chunk(&self, usage: Usage) -> Value {
        let mut object = self.object(json!([]));
        object["usage"] = usage.json();
        object
    }
}

/// Tokens read and written for a request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

impl Usage {
    fn json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        })
    }
}
