//! `POST /tokenize` and `POST /detokenize`, in vLLM's shape: a model's tokens of a text, each
//! with its piece (`token_strs`, OpenAI's `bytes:` form for part of a character), and the text
//! of tokens. The tokenizer is the model's, so the model is loaded as for a completion.

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::api::{ApiError, parse_json};
use crate::app::{App, read_body};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenizeRequest {
    model: String,
    prompt: String,
    /// vLLM's: cinder's tokenizers add none, so this changes nothing.
    #[allow(dead_code)]
    add_special_tokens: Option<bool>,
    /// vLLM's: the pieces are always returned.
    #[allow(dead_code)]
    return_token_strs: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DetokenizeRequest {
    model: String,
    tokens: Vec<u32>,
}

/// `{"model", "prompt"}` to `{"count", "max_model_len", "tokens", "token_strs"}`. The text is
/// read as a prompt is (line endings normalised); a character the model lacks is a 400.
pub async fn tokenize(State(app): State<App>, body: Body) -> Result<Json<Value>, ApiError> {
    let request: TokenizeRequest = parse_json(&read_body(body).await?)?;
    let chars = request.prompt.chars().count();
    if chars > app.limits.max_prompt_chars {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "prompt has {chars} characters, but this server takes up to {} (serve \
                 --max-prompt-chars)",
                app.limits.max_prompt_chars
            ),
        ));
    }
    app.catalog.find(&request.model)?;
    let text: String = cinder_data::normalized_chars(&request.prompt).collect();
    let answer = app
        .queue
        .inspect(request.model, move |model| {
            let tokenizer = &model.tokenizer;
            Ok(match tokenizer.encode(&text) {
                Ok(ids) => Ok(json!({
                    "count": ids.len(),
                    "max_model_len": model.gpt.block_size(),
                    "token_strs": ids
                        .iter()
                        .map(|&id| cinder::sampling::token_text(tokenizer, id))
                        .collect::<Vec<_>>(),
                    "tokens": ids,
                })),
                Err(e) => Err(ApiError::invalid("prompt", format!("prompt: {e}"))),
            })
        })
        .await?;
    answer.map(Json)
}

/// `{"model", "tokens"}` to `{"prompt"}`, the tokens' text; an id outside the tokenizer's
/// vocabulary is a 400.
pub async fn detokenize(State(app): State<App>, body: Body) -> Result<Json<Value>, ApiError> {
    let request: DetokenizeRequest = parse_json(&read_body(body).await?)?;
    app.catalog.find(&request.model)?;
    let tokens = request.tokens;
    let answer = app
        .queue
        .inspect(request.model, move |model| {
            let vocab = model.tokenizer.vocab_size();
            Ok(match tokens.iter().position(|&t| t as usize >= vocab) {
                Some(i) => Err(ApiError::invalid(
                    "tokens",
                    format!(
                        "tokens[{i}] is {}, but this model's tokens are 0 to {}",
                        tokens[i],
                        vocab - 1
                    ),
                )),
                None => Ok(json!({"prompt": model.tokenizer.decode(&tokens)})),
            })
        })
        .await?;
    answer.map(Json)
}
