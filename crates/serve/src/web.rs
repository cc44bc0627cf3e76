//! The web page: its files, embedded in the binary (no network at run time), and the JSON it
//! reads about the runs (`/api/...`). Model ids are looked up among those offered, never joined
//! to a path: nothing a request names reaches the filesystem.

use std::collections::HashMap;

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::json;

use crate::api::ApiError;
use crate::app::{App, read_body};
use crate::engine::attention;
use crate::runs::{self, Cursor};

/// The page's files: path, media type, content. uPlot (MIT licence, served beside it) draws the
/// curves; `web/vendor/uplot/VERSION` says which release, from the npm registry.
const FILES: &[(&str, &str, &[u8])] = &[
    (
        "/",
        "text/html; charset=utf-8",
        include_bytes!("../web/index.html"),
    ),
    (
        "/assets/app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../web/app.js"),
    ),
    (
        "/assets/style.css",
        "text/css; charset=utf-8",
        include_bytes!("../web/style.css"),
    ),
    (
        "/assets/uPlot.iife.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../web/vendor/uplot/uPlot.iife.min.js"),
    ),
    (
        "/assets/uPlot.min.css",
        "text/css; charset=utf-8",
        include_bytes!("../web/vendor/uplot/uPlot.min.css"),
    ),
    (
        "/assets/uPlot.LICENSE",
        "text/plain; charset=utf-8",
        include_bytes!("../web/vendor/uplot/LICENSE"),
    ),
];

/// Characters of text whose attention maps may be asked for (the maps keep the first tokens:
/// the engine's `MAX_ATTENTION_TOKENS`).
const MAX_ATTENTION_CHARS: usize = 4096;

/// The page and its JSON.
pub fn routes() -> Router<App> {
    let mut router = Router::new();
    for &(path, media_type, body) in FILES {
        router = router.route(
            path,
            get(move || async move { ([(header::CONTENT_TYPE, media_type)], body) }),
        );
    }
    router
        .route("/api/runs", get(list))
        .route("/api/run", get(run))
        .route("/api/metrics", get(metrics))
        .route("/api/attention", post(attention))
}

/// A query parameter that must be there.
fn param<'a>(query: &'a HashMap<String, String>, name: &str) -> Result<&'a str, ApiError> {
    query
        .get(name)
        .map(String::as_str)
        .ok_or_else(|| ApiError::invalid(name, format!("the query needs {name}=")))
}

/// Runs blocking reads off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|_| ApiError::server("reading the run failed: see the server's log".into()))
}

/// `GET /api/runs`: every model's summary (looking for new runs first).
async fn list(State(app): State<App>) -> Result<Response, ApiError> {
    let catalog = app.catalog.clone();
    let summaries = blocking(move || {
        catalog.refresh();
        catalog
            .all()
            .iter()
            .map(|(id, path)| runs::summary(id, path))
            .collect::<Vec<_>>()
    })
    .await?;
    Ok(axum::Json(json!({ "runs": summaries })).into_response())
}

/// `GET /api/run?id=ID`: a model's summary, config and samples.
async fn run(
    State(app): State<App>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let id = param(&query, "id")?.to_string();
    let path = app.catalog.find(&id)?;
    let body = blocking(move || {
        let mut body = serde_json::to_value(runs::summary(&id, &path)).expect("plain data");
        body["config"] = json!(runs::config(&path));
        body["samples"] = json!(runs::samples(&path));
        body
    })
    .await?;
    Ok(axum::Json(body).into_response())
}

/// `GET /api/metrics?id=ID&offset=CURSOR`: the metrics rows written since the cursor (`0`:
/// all), and the cursor to ask with next.
async fn metrics(
    State(app): State<App>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let path = app.catalog.find(param(&query, "id")?)?;
    let offset = query.get("offset").map_or("0", String::as_str);
    let cursor = Cursor::parse(offset).ok_or_else(|| {
        ApiError::invalid("offset", "offset is 0 or the offset a previous answer gave")
    })?;
    let page = blocking(move || runs::metrics_since(&path, cursor)).await?;
    Ok(axum::Json(page).into_response())
}

#[derive(Deserialize)]
struct AttentionRequest {
    model: String,
    text: String,
}

/// `POST /api/attention` `{"model", "text"}`: `inspect`'s maps, `{"tokens", "weights"}` with
/// `weights[layer][head][query][key]`.
async fn attention(State(app): State<App>, body: Body) -> Result<Response, ApiError> {
    let body = read_body(body).await?;
    let request: AttentionRequest = serde_json::from_slice(&body).map_err(|e| {
        ApiError::malformed(format!(
            "the body must be {{\"model\": ..., \"text\": ...}}: {e}"
        ))
    })?;
    if request.text.chars().count() > MAX_ATTENTION_CHARS {
        return Err(ApiError::invalid(
            "text",
            format!("the text is over {MAX_ATTENTION_CHARS} characters"),
        ));
    }
    app.catalog.find(&request.model)?;
    let text = request.text;
    let maps = app
        .queue
        .inspect(request.model, move |model| {
            attention::attention(model, &text)
        })
        .await?;
    Ok(axum::Json(maps).into_response())
}
