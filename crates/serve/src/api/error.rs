//! Errors in OpenAI's shape: an HTTP status and `{"error": {"message", "type", "param",
//! "code"}}`. The engine's and the models' errors become one here, and only here: which status,
//! type, code and parameter name (OpenAI's: `prompt`, `model`) goes with each.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::engine::EngineError;
use crate::models::ModelError;

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

    /// 500: the server failed.
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

/// The engine's errors: the queue's 429 (with `Retry-After`), 503 while stopping, 408 past the
/// time limit, a bad prompt's 400 naming `prompt` (the page's attention text: `text`), the
/// models' errors, and 500 when generation fails.
impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        let message = e.to_string();
        match e {
            EngineError::QueueFull { .. } => Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                "queue_full",
                message,
            ),
            EngineError::ShuttingDown => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable_error",
                "shutting_down",
                message,
            ),
            EngineError::TimedOut => Self::new(
                StatusCode::REQUEST_TIMEOUT,
                "timeout_error",
                "request_timeout",
                message,
            ),
            EngineError::BadPrompt { .. } | EngineError::PromptTooLong { .. } => {
                Self::invalid("prompt", message)
            }
            EngineError::BadText(_) => Self::invalid("text", message),
            EngineError::Model(e) => e.into(),
            EngineError::WorkerGone | EngineError::Failed => Self::server(message),
        }
    }
}

/// A model id not offered is a 404 naming `model`; a model that does not load, a 500.
impl From<ModelError> for ApiError {
    fn from(e: ModelError) -> Self {
        let message = e.to_string();
        match e {
            ModelError::NotFound(_) => Self {
                param: Some("model".into()),
                ..Self::new(
                    StatusCode::NOT_FOUND,
                    "invalid_request_error",
                    "model_not_found",
                    message,
                )
            },
            ModelError::Unloadable(_) => Self::server(message),
        }
    }
}
