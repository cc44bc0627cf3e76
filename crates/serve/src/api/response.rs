//! The objects a completion is answered with: whole, or as stream chunks.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::engine::Finish;

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

/// Seconds since the Unix epoch, as OpenAI's `created` fields count.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
