//! The HTTP side: routes, the API key, the log line of each request, and how a completion's
//! events become a response (whole, or server-sent events).

use std::collections::{BTreeMap, VecDeque};
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
use tokio::sync::mpsc::error::TryRecvError;
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
            (request.include_usage, request.continuous_usage),
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
            Some(Event::Text { index, text, .. }) => texts[index].0.push_str(&text),
            Some(Event::Finished { index, reason }) => texts[index].1 = reason,
            Some(Event::Done { completion_tokens }) => return Ok((texts, completion_tokens)),
            Some(Event::Started { .. }) => {}
            Some(Event::Failed(e)) => return Err(e),
            None => return Err(ApiError::worker_gone()),
        }
    }
}

/// Events taken from the worker at once, at most: a stream that fell behind catches up in
/// steps of this many, so that one stream does not hold a runtime thread for long.
const CATCH_UP: usize = 256;

/// A completion as server-sent events: a chunk per piece of text, one with each choice's
/// `finish_reason`, the usage if asked for (`include_usage`: a last chunk; `continuous_usage`:
/// on every chunk too), then `[DONE]`.
///
/// The events the worker has sent meanwhile are read together, and each choice's text among
/// them goes as one chunk: a client (or a server) that falls behind under load catches up in
/// fewer, longer chunks, instead of paying an event's cost for every token. A choice's text
/// always goes before its `finish_reason`.
fn stream(
    rx: UnboundedReceiver<Event>,
    header: Header,
    prompt_tokens: usize,
    (include_usage, continuous_usage): (bool, bool),
    logged: Logged,
) -> impl futures_util::Stream<Item = Result<SseEvent, Infallible>> {
    struct Stream {
        rx: UnboundedReceiver<Event>,
        pending: VecDeque<SseEvent>,
        /// Each choice's text read and not yet sent.
        texts: BTreeMap<usize, String>,
        /// The request's tokens written, as of the last text read.
        written: usize,
        ended: bool,
        header: Header,
        prompt_tokens: usize,
        include_usage: bool,
        continuous_usage: bool,
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
    impl Stream {
        fn usage(&self, completion_tokens: usize) -> Usage {
            Usage {
                prompt_tokens: self.prompt_tokens,
                completion_tokens,
            }
        }

        /// Queues a chunk of choice `index`: its text, or its end.
        fn send(&mut self, index: usize, text: &str, finish: Option<Finish>) {
            let usage = self.continuous_usage.then(|| self.usage(self.written));
            let chunk = self.header.chunk(index, text, finish, usage);
            self.pending.push_back(data(chunk));
        }

        /// Queues the text read of choice `index` (of every choice, in order: `None`), if any.
        fn flush(&mut self, index: Option<usize>) {
            let texts: Vec<(usize, String)> = match index {
                Some(index) => self.texts.remove_entry(&index).into_iter().collect(),
                None => std::mem::take(&mut self.texts).into_iter().collect(),
            };
            for (index, text) in texts {
                self.send(index, &text, None);
            }
        }

        /// Takes one of the worker's events (`None`: the worker is gone).
        fn read(&mut self, event: Option<Event>) {
            match event {
                Some(Event::Started { .. }) => {}
                Some(Event::Text {
                    index,
                    text,
                    written,
                }) => {
                    self.texts.entry(index).or_default().push_str(&text);
                    self.written = written;
                }
                Some(Event::Finished { index, reason }) => {
                    self.flush(Some(index));
                    self.send(index, "", Some(reason));
                }
                Some(Event::Done { completion_tokens }) => {
                    self.flush(None);
                    if self.include_usage {
                        let usage = self.usage(completion_tokens);
                        self.pending.push_back(data(self.header.usage_chunk(usage)));
                    }
                    self.pending.push_back(SseEvent::default().data("[DONE]"));
                    self.ended = true;
                    self.logged.tokens = Some(completion_tokens);
                }
                Some(Event::Failed(e)) => self.fail(e),
                None => self.fail(ApiError::worker_gone()),
            }
        }

        /// Ends the stream with `e`'s error event, after the text read.
        fn fail(&mut self, e: ApiError) {
            self.flush(None);
            self.ended = true;
            self.failed = Some(e.status.as_u16());
            self.pending.push_back(data(e.body()));
        }
    }
    let start = Stream {
        rx,
        pending: VecDeque::new(),
        texts: BTreeMap::new(),
        written: 0,
        ended: false,
        header,
        prompt_tokens,
        include_usage,
        continuous_usage,
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
            let first = s.rx.recv().await;
            s.read(first);
            // What else has come meanwhile, up to the stream's end.
            for _ in 1..CATCH_UP {
                if s.ended {
                    break;
                }
                match s.rx.try_recv() {
                    Ok(event) => s.read(Some(event)),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => s.read(None),
                }
            }
            s.flush(None);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The data of each event of `events`, sent before the stream is read: what a client that
    /// fell behind receives. Usage is asked for at the end, and on every chunk if `continuous`.
    async fn read_behind(events: Vec<Event>, continuous: bool) -> Vec<serde_json::Value> {
        let (tx, rx) = unbounded_channel();
        for event in events {
            tx.send(event).unwrap();
        }
        drop(tx);
        let header = Header {
            id: "cmpl-0".into(),
            created: 0,
            model: "m".into(),
        };
        let events = stream(rx, header, 2, (true, continuous), Logged::default());
        let body = axum::body::to_bytes(Sse::new(events).into_response().into_body(), 1 << 20)
            .await
            .unwrap();
        let body = String::from_utf8(body.to_vec()).unwrap();
        body.split("\n\n")
            .filter_map(|event| event.strip_prefix("data: "))
            .map(|data| serde_json::from_str(data).unwrap_or(json!(data)))
            .collect()
    }

    fn text(index: usize, text: &str, written: usize) -> Event {
        Event::Text {
            index,
            text: text.into(),
            written,
        }
    }

    fn finished(index: usize, reason: Finish) -> Event {
        Event::Finished { index, reason }
    }

    /// (index, text, finish_reason, usage's completion_tokens) of each chunk with a choice.
    fn choices(
        data: &[serde_json::Value],
    ) -> Vec<(u64, String, serde_json::Value, serde_json::Value)> {
        data.iter()
            .filter(|d| d["choices"].as_array().is_some_and(|c| !c.is_empty()))
            .map(|d| {
                let c = &d["choices"][0];
                let text = c["text"].as_str().unwrap().to_string();
                let index = c["index"].as_u64().unwrap();
                (
                    index,
                    text,
                    c["finish_reason"].clone(),
                    d["usage"]["completion_tokens"].clone(),
                )
            })
            .collect()
    }

    #[tokio::test]
    async fn a_stream_behind_sends_each_choices_waiting_text_as_one_chunk_before_its_end() {
        let data = read_behind(
            vec![
                Event::Started { prompt_tokens: 2 },
                text(0, "a", 1),
                text(0, "b", 3),
                text(1, "x", 4),
                text(0, "c", 5),
                text(0, "é", 7),
                finished(0, Finish::Length),
                text(1, "y", 8),
                finished(1, Finish::Stop),
                Event::Done {
                    completion_tokens: 8,
                },
            ],
            false,
        )
        .await;
        let null = serde_json::Value::Null;
        assert_eq!(
            choices(&data),
            [
                (0, "abcé".into(), null.clone(), null.clone()),
                (0, "".into(), json!("length"), null.clone()),
                (1, "xy".into(), null.clone(), null.clone()),
                (1, "".into(), json!("stop"), null.clone()),
            ]
        );
        assert_eq!(data[data.len() - 2]["usage"]["completion_tokens"], 8);
        assert_eq!(data[data.len() - 2]["choices"], json!([]));
        assert_eq!(data[data.len() - 1], "[DONE]");
    }

    #[tokio::test]
    async fn continuous_usage_puts_the_tokens_written_so_far_on_every_chunk() {
        let data = read_behind(
            vec![
                Event::Started { prompt_tokens: 2 },
                text(0, "ab", 2),
                finished(0, Finish::Length),
                Event::Done {
                    completion_tokens: 2,
                },
            ],
            true,
        )
        .await;
        assert_eq!(
            choices(&data),
            [
                (0, "ab".into(), serde_json::Value::Null, json!(2)),
                (0, "".into(), json!("length"), json!(2)),
            ]
        );
        assert_eq!(data[0]["usage"]["prompt_tokens"], 2);
        assert_eq!(data[data.len() - 1], "[DONE]");
    }

    #[tokio::test]
    async fn a_stream_whose_worker_is_gone_ends_with_an_error_after_its_text() {
        let data = read_behind(
            vec![Event::Started { prompt_tokens: 2 }, text(0, "ab", 2)],
            false,
        )
        .await;
        assert_eq!(data.len(), 2, "{data:?}");
        assert_eq!(data[0]["choices"][0]["text"], "ab", "{data:?}");
        assert!(data[1]["error"].is_object(), "{data:?}");
    }
}
