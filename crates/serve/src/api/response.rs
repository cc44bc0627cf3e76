//! The objects a completion is answered with: whole, or as stream chunks.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::engine::{Finish, TokenLogprob};

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

    /// A whole (not streamed) completion: each choice's text, why it ended, and its tokens'
    /// log-probabilities if asked for.
    pub fn completion(&self, choices: &[Choice], usage: Usage) -> Value {
        let choices = choices
            .iter()
            .enumerate()
            .map(|(index, c)| {
                json!({"text": c.text, "index": index, "logprobs": c.logprobs.as_deref().map(logprobs),
                    "finish_reason": c.finish})
            })
            .collect();
        let mut object = self.object(Value::Array(choices));
        object["usage"] = usage.json();
        object
    }

    /// A stream chunk: text for choice `index` (with its tokens' log-probabilities if asked
    /// for), or its end; with the usage so far if given.
    pub fn chunk(
        &self,
        index: usize,
        text: &str,
        tokens: Option<&[TokenLogprob]>,
        finish: Option<Finish>,
        usage: Option<Usage>,
    ) -> Value {
        let mut object = self.object(json!([
            {"text": text, "index": index, "logprobs": tokens.map(logprobs), "finish_reason": finish}
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

/// A whole choice: its text, why it ended, and its tokens' log-probabilities if asked for.
#[derive(Debug, Clone)]
pub struct Choice {
    pub text: String,
    pub finish: Finish,
    pub logprobs: Option<Vec<TokenLogprob>>,
}

/// OpenAI's `logprobs` object of `tokens`: `tokens`, `token_logprobs` (null for a text's first
/// token), `top_logprobs` (a token-to-log-probability object each; null for the first) and
/// `text_offset` (where each token's text starts in the choice's text, in characters).
pub fn logprobs(tokens: &[TokenLogprob]) -> Value {
    let top = |t: &TokenLogprob| {
        t.logprob.map(|_| {
            let entries = t
                .top
                .iter()
                .map(|(text, lp)| (text.clone(), json!(shortest(*lp))));
            Value::Object(entries.collect())
        })
    };
    json!({
        "tokens": tokens.iter().map(|t| &t.text).collect::<Vec<_>>(),
        "token_logprobs": tokens.iter().map(|t| t.logprob.map(shortest)).collect::<Vec<_>>(),
        "top_logprobs": tokens.iter().map(top).collect::<Vec<_>>(),
        "text_offset": tokens.iter().map(|t| t.offset).collect::<Vec<_>>(),
    })
}

/// `x` written with the fewest digits that read back as the same f32 (-0.2, not
/// -0.20000000298023224).
fn shortest(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(f64::from(x))
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

/// Seconds since the Unix epoch, as OpenAI's `created` fields count.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
