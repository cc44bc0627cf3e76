//! The HTTP side of the API: the router (the page's routes from [`crate::web`]), the API key and
//! the log line of each request, `/health`, `/v1/models`, `/tokenize` and `/detokenize`
//! ([`crate::tokens`]), and `/v1/completions`, whose events become a whole completion here, or
//! server-sent events ([`crate::sse`]).

use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tower_http::set_header::SetResponseHeaderLayer;

use crate::api::{ApiError, Choice, Header, Usage, now, parse_completion};
use crate::app::{App, read_body};
use crate::engine::{EngineError, Event, Finish};
use crate::log::{Logged, log_line};
use crate::{sse, tokens, web};

pub fn router(app: App) -> Router {
    web::routes()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/tokenize", post(tokens::tokenize))
        .route("/detokenize", post(tokens::detokenize))
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
        ApiError::from(EngineError::ShuttingDown).into_response()
    } else if let Some(key) = &app.api_key
        && (path.starts_with("/v1/")
            || path.starts_with("/api/")
            || ["/tokenize", "/detokenize"].contains(&path.as_str()))
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
        // Rows decoded per forward pass: how much the batching shares.
        "decoding": load.passes(),
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
        let choices = request.job.rows();
        // The place is this handler's while the request waits: a client that leaves (the
        // handler is dropped) or runs out of time frees it at once.
        let place = app.queue.submit(request.job.clone(), tx)?;
        let deadline = tokio::time::Instant::from_std(request.job.deadline);
        let prompt_tokens = match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(Event::Started { prompt_tokens })) => prompt_tokens,
            Ok(Some(Event::Failed(e))) => return Err(e.into()),
            Ok(_) => return Err(EngineError::WorkerGone.into()),
            Err(_) => return Err(EngineError::TimedOut.into()),
        };
        drop(place);
        let header = Header {
            id: format!("cmpl-{:08x}", app.next_id.fetch_add(1, Ordering::SeqCst)),
            created: now(),
            model: request.job.model.clone(),
        };
        Ok::<_, ApiError>((request, header, rx, prompt_tokens, choices))
    }
    .await;
    let (request, header, rx, prompt_tokens, choices) = match result {
        Ok(ready) => ready,
        Err(e) => return with_log(e.into_response(), logged),
    };
    if request.stream {
        logged.streamed = true;
        let stream = sse::stream(
            rx,
            header,
            prompt_tokens,
            request.usage,
            request.logprobs,
            logged.clone(),
        );
        // Comments while a long prompt is read keep proxies from closing the connection.
        let sse = Sse::new(stream).keep_alive(KeepAlive::default());
        return with_log(sse.into_response(), logged);
    }
    match collect(rx, choices, request.logprobs).await {
        Ok((choices, completion_tokens)) => {
            logged.tokens = Some(completion_tokens);
            let usage = Usage {
                prompt_tokens,
                completion_tokens,
            };
            with_log(
                Json(header.completion(&choices, usage)).into_response(),
                logged,
            )
        }
        Err(e) => with_log(e.into_response(), logged),
    }
}

/// A whole completion: each choice (with its tokens' log-probabilities if `logprobs`), and the
/// tokens written.
async fn collect(
    mut rx: UnboundedReceiver<Event>,
    choices: usize,
    logprobs: bool,
) -> Result<(Vec<Choice>, usize), ApiError> {
    let empty = Choice {
        text: String::new(),
        finish: Finish::Length,
        logprobs: logprobs.then(Vec::new),
    };
    let mut whole = vec![empty; choices];
    loop {
        match rx.recv().await {
            Some(Event::Text {
                index,
                text,
                logprobs,
                ..
            }) => {
                whole[index].text.push_str(&text);
                if let Some(tokens) = &mut whole[index].logprobs {
                    tokens.extend(logprobs);
                }
            }
            Some(Event::Finished { index, reason }) => whole[index].finish = reason,
            Some(Event::Done { completion_tokens }) => return Ok((whole, completion_tokens)),
            Some(Event::Started { .. }) => {}
            Some(Event::Failed(e)) => return Err(e.into()),
            None => return Err(EngineError::WorkerGone.into()),
        }
    }
}
