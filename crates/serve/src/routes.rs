//! The HTTP side: routes, the API key, the log line of each request, and how a completion's
//! events become a response (whole, or server-sent events).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tower_http::set_header::SetResponseHeaderLayer;

use crate::api::{ApiError, Header, Limits, Usage, parse_completion};
use crate::engine::{Event, Finish, Queue};
use crate::models::{Catalog, LoadedInfo};
use crate::web;

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
    pub started: u64,
    pub next_id: Arc<AtomicU64>,
}

pub fn router(app: App) -> Router {
    web::routes()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .fallback(|method: Method, uri: Uri| async move {
            ApiError::no_route(method.as_str(), uri.path())
        })
        .method_not_allowed_fallback(|method: Method, uri: Uri| async move {
            ApiError {
                status: StatusCode::METHOD_NOT_ALLOWED,
                ..ApiError::no_route(method.as_str(), uri.path())
            }
        })
        .layer(axum::middleware::from_fn_with_state(app.clone(), guard))
        // The page may load and ask only this server: nothing reaches the network.
        .layer(SetResponseHeaderLayer::if_not_present(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        ))
        .layer(SetResponseHeaderLayer::overriding(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ))
        .layer(SetResponseHeaderLayer::if_not_present(
            header::CACHE_CONTROL,
            HeaderValue::from_static("no-store"),
        ))
        .with_state(app)
}

/// What the page may load and ask: this server only (uPlot sets inline styles).
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; style-src 'self' 'unsafe-inline'; \
     img-src 'self' data:; frame-ancestors 'none'";

/// What the log line of a request names, beyond its method, path, status and time.
#[derive(Clone, Default)]
struct Logged {
    model: Option<String>,
    tokens: Option<usize>,
    /// A stream logs itself when it ends.
    streamed: bool,
}

fn log_line(method: &str, path: &str, status: u16, logged: &Logged, since: Instant) {
    eprintln!(
        "{method} {path} {status} model={} tokens={} {:.3}s",
        logged.model.as_deref().unwrap_or("-"),
        logged.tokens.map_or("-".into(), |t| t.to_string()),
        since.elapsed().as_secs_f64()
    );
}

/// Whether `headers` carry `Authorization: Bearer <key>`, compared in constant time.
fn has_key(headers: &axum::http::HeaderMap, key: &str) -> bool {
    use subtle::ConstantTimeEq;
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|given| bool::from(given.as_bytes().ct_eq(key.as_bytes())))
}

/// Refuses requests while stopping (503) and, with `--api-key`, requests for the API and the
/// page's JSON without it (401; the page itself loads, and asks for the key); logs one line
/// per request.
async fn guard(State(app): State<App>, request: Request, next: Next) -> Response {
    let since = Instant::now();
    let (method, path) = (
        request.method().to_string(),
        request.uri().path().to_string(),
    );
    let response = if app.queue.load.stopping.load(Ordering::SeqCst) && path != "/health" {
        ApiError::stopping().into_response()
    } else if let Some(key) = &app.api_key
        && (path.starts_with("/v1/") || path.starts_with("/api/"))
        && !has_key(request.headers(), key)
    {
        ApiError::unauthorized().into_response()
    } else {
        next.run(request).await
    };
    let logged = response
        .extensions()
        .get::<Logged>()
        .cloned()
        .unwrap_or_default();
    if !logged.streamed {
        log_line(&method, &path, response.status().as_u16(), &logged, since);
    }
    response
}

async fn health(State(app): State<App>) -> Json<serde_json::Value> {
    let load = &app.queue.load;
    let loaded = app.loaded.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Json(json!({
        "status": if load.stopping.load(Ordering::SeqCst) { "stopping" } else { "ok" },
        "models": {"available": app.catalog.all().len(), "loaded": loaded},
        "requests": {
            "active": load.active(),
            "queued": load.queued(),
        },
    }))
}

async fn models(State(app): State<App>) -> Json<serde_json::Value> {
    app.catalog.refresh();
    let data: Vec<_> = app
        .catalog
        .all()
        .keys()
        .map(
            |id| json!({"id": id, "object": "model", "created": app.started, "owned_by": "cinder"}),
        )
        .collect();
    Json(json!({"object": "list", "data": data}))
}

fn with_log(mut response: Response, logged: Logged) -> Response {
    response.extensions_mut().insert(logged);
    response
}

async fn completions(State(app): State<App>, body: Body) -> Response {
    let mut logged = Logged::default();
    let result = async {
        let bytes = read_body(body).await?;
        let request = parse_completion(&bytes, &app.limits)?;
        logged.model = Some(request.job.model.clone());
        app.catalog.find(&request.job.model)?;
        let (tx, mut rx) = unbounded_channel();
        let choices = request.job.prompts.len() * request.job.n;
        // The place is this handler's while the request waits: a client that leaves (the
        // handler is dropped) or runs out of time frees it at once.
        let place = app.queue.submit(request.job.clone(), tx)?;
        let deadline = tokio::time::Instant::from_std(request.job.deadline);
        let prompt_tokens = match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(Event::Started { prompt_tokens })) => prompt_tokens,
            Ok(Some(Event::Failed(e))) => return Err(e),
            Ok(_) => return Err(ApiError::worker_gone()),
            Err(_) => return Err(ApiError::timeout()),
        };
        drop(place);
        let header = Header {
            id: format!("cmpl-{:08x}", app.next_id.fetch_add(1, Ordering::SeqCst)),
            created: now(),
            model: request.job.model.clone(),
        };
        Ok((request, header, rx, prompt_tokens, choices))
    }
    .await;
    let (request, header, rx, prompt_tokens, choices) = match result {
        Ok(ready) => ready,
        Err(e) => return with_log(e.into_response(), logged),
    };
    if request.stream {
        logged.streamed = true;
        let stream = stream(
            rx,
            header,
            prompt_tokens,
            request.include_usage,
            logged.clone(),
        );
        // Comments while a long prompt is read keep proxies from closing the connection.
        let sse = Sse::new(stream).keep_alive(KeepAlive::default());
        return with_log(sse.into_response(), logged);
    }
    match collect(rx, choices).await {
        Ok((texts, completion_tokens)) => {
            logged.tokens = Some(completion_tokens);
            let usage = Usage {
                prompt_tokens,
                completion_tokens,
            };
            with_log(
                Json(header.completion(&texts, usage)).into_response(),
                logged,
            )
        }
        Err(e) => with_log(e.into_response(), logged),
    }
}

/// A request's body, up to [`BODY_LIMIT`] bytes (413 past it; 400 if it cannot be read).
pub async fn read_body(body: Body) -> Result<axum::body::Bytes, ApiError> {
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

/// Seconds since the Unix epoch, as OpenAI's `created` fields count.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A whole completion: each choice's text and why it ended, and the tokens written.
async fn collect(
    mut rx: UnboundedReceiver<Event>,
    choices: usize,
) -> Result<(Vec<(String, Finish)>, usize), ApiError> {
    let mut texts = vec![(String::new(), Finish::Length); choices];
    loop {
        match rx.recv().await {
            Some(Event::Text { index, text }) => texts[index].0.push_str(&text),
            Some(Event::Finished { index, reason }) => texts[index].1 = reason,
            Some(Event::Done { completion_tokens }) => return Ok((texts, completion_tokens)),
            Some(Event::Started { .. }) => {}
            Some(Event::Failed(e)) => return Err(e),
            None => return Err(ApiError::worker_gone()),
        }
    }
}

/// A completion as server-sent events: a chunk per piece of text, one with each choice's
/// `finish_reason`, the usage if asked for, then `[DONE]`.
fn stream(
    rx: UnboundedReceiver<Event>,
    header: Header,
    prompt_tokens: usize,
    include_usage: bool,
    logged: Logged,
) -> impl futures_util::Stream<Item = Result<SseEvent, Infallible>> {
    struct Stream {
        rx: UnboundedReceiver<Event>,
        pending: VecDeque<SseEvent>,
        ended: bool,
        header: Header,
        prompt_tokens: usize,
        include_usage: bool,
        logged: Logged,
        since: Instant,
        /// The status of the error that ended it, if one did.
        failed: Option<u16>,
    }
    // One log line per stream, when it is dropped: 200 if it ran to [DONE], the error's status
    // if one ended it, else 499 (the client closed it).
    impl Drop for Stream {
        fn drop(&mut self) {
            let status = match (self.ended, self.failed) {
                (true, Some(status)) => status,
                (true, None) => 200,
                (false, _) => 499,
            };
            log_line("POST", "/v1/completions", status, &self.logged, self.since);
        }
    }
    fn data(value: serde_json::Value) -> SseEvent {
        SseEvent::default().data(value.to_string())
    }
    let start = Stream {
        rx,
        pending: VecDeque::new(),
        ended: false,
        header,
        prompt_tokens,
        include_usage,
        logged,
        since: Instant::now(),
        failed: None,
    };
    futures_util::stream::unfold(start, |mut s| async move {
        loop {
            if let Some(event) = s.pending.pop_front() {
                return Some((Ok(event), s));
            }
            if s.ended {
                return None;
            }
            let event = match s.rx.recv().await {
                Some(Event::Started { .. }) => continue,
                Some(Event::Text { index, text }) => s.header.chunk(index, &text, None),
                Some(Event::Finished { index, reason }) => s.header.chunk(index, "", Some(reason)),
                Some(Event::Done { completion_tokens }) => {
                    if s.include_usage {
                        let usage = Usage {
                            prompt_tokens: s.prompt_tokens,
                            completion_tokens,
                        };
                        s.pending.push_back(data(s.header.usage_chunk(usage)));
                    }
                    s.pending.push_back(SseEvent::default().data("[DONE]"));
                    s.ended = true;
                    s.logged.tokens = Some(completion_tokens);
                    continue;
                }
                Some(Event::Failed(e)) => {
                    s.ended = true;
                    s.failed = Some(e.status.as_u16());
                    e.body()
                }
                None => {
                    s.ended = true;
                    let e = ApiError::worker_gone();
                    s.failed = Some(e.status.as_u16());
                    e.body()
                }
            };
            s.pending.push_back(data(event));
        }
    })
}
