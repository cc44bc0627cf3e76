//! What every handler shares, the API's and the page's alike: the server's state, and reading
//! a request's body.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};

use crate::api::{ApiError, Limits};
use crate::engine::Queue;
use crate::models::{Catalog, LoadedInfo};

/// The largest request body taken, in bytes.
pub const BODY_LIMIT: usize = 1 << 20;

/// What the handlers share.
#[derive(Clone)]
pub struct App {
    pub queue: Queue,
    pub catalog: Arc<Catalog>,
    pub loaded: Arc<Mutex<Vec<LoadedInfo>>>,
    pub limits: Limits,
    pub api_key: Option<Arc<str>>,
    /// When the server started, as OpenAI's `created` fields count.
    pub started: u64,
    /// The next completion's number, for its id.
    pub next_id: Arc<AtomicU64>,
}

/// A request's body, up to [`BODY_LIMIT`] bytes (413 past it; 400 if it cannot be read).
pub async fn read_body(body: Body) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, BODY_LIMIT).await.map_err(|e| {
        let over = std::iter::successors(Some(&e as &dyn std::error::Error), |e| e.source())
            .any(|e| e.is::<http_body_util::LengthLimitError>());
        if over {
            ApiError::too_large(BODY_LIMIT)
        } else {
            ApiError::malformed(format!("the request body could not be read: {e}"))
        }
    })
}
