//! `serve`: a local web page to watch runs and try models, and cinder's models behind an
//! OpenAI-compatible completions API.
//!
//! - [`models`]: which models are offered, under which ids, and loading them;
//! - [`engine`]: the generation worker and its queue;
//! - [`api`]: OpenAI's request, response and error objects (the engine's errors among them);
//! - [`app`]: what every handler shares;
//! - [`routes`]: the HTTP side of the API, with [`sse`] for streams and [`log`] for log lines;
//! - [`web`]: the page and the JSON it reads, from [`runs`]: what a run folder shows.

mod api;
mod app;
mod engine;
mod log;
mod models;
mod routes;
mod runs;
mod sse;
mod tokens;
mod web;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use cinder::cli::{RunOn, exit_on_error};
use cinder::device::Backend;
use cinder::storage::run_folder::RUNS;
use clap::Parser;

/// Serve a web page to watch runs train and try their models (open the address it prints), and
/// the models over HTTP with OpenAI's completions API (POST /v1/completions, GET /v1/models,
/// GET /health), so that OpenAI's clients work unchanged.
///
/// It offers every run folder under --runs (its best/ checkpoint, else latest/), with the run's
/// path under --runs as its id, and every folder named with --checkpoint, with the folder's name
/// as its id; runs created later are found too. Models load on first use, and again when their
/// run writes a newer checkpoint. Requests for one model are decoded together (up to
/// --max-batch), joining and leaving at token boundaries; the others wait in a queue.
/// Ctrl-C stops: open completions end at once with finish_reason "length".
#[derive(Debug, Parser)]
#[command(version, about, long_about)]
struct Args {
    /// Folder of run folders to serve [default: checkpoints]
    #[arg(long, value_name = "DIR")]
    runs: Option<PathBuf>,
    /// A checkpoint, run folder or Hugging Face folder (GPT-2 or NanoChat) to serve too (repeatable)
    #[arg(long, value_name = "DIR")]
    checkpoint: Vec<PathBuf>,
    /// Address to listen on (loopback: only this machine)
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Port to listen on (0: any free one)
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require this key on /v1/ and /api/ requests (`Authorization: Bearer <key>`); the page
    /// asks for it once
    #[arg(
        long,
        value_name = "KEY",
        env = "CINDER_API_KEY",
        hide_env_values = true
    )]
    api_key: Option<String>,
    /// Models kept loaded at once; the least recently used is unloaded first
    #[arg(long, default_value_t = 2)]
    max_loaded: usize,
    /// Choices (rows) decoded together, over all requests for one model (continuous batching:
    /// one forward pass per token for all); a request's prompts times n at most. Each loaded
    /// model keeps a key/value cache made for this many rows (its size is logged when made:
    /// lower this for a large model on a small machine)
    #[arg(long, default_value_t = 64)]
    max_batch: usize,
    /// Requests that may wait while others generate; more are refused (429)
    #[arg(long, default_value_t = 16)]
    queue: usize,
    /// The most max_tokens a request may ask for
    #[arg(long, default_value_t = 4096)]
    max_tokens: usize,
    /// The most choices (n) a request may ask for per prompt
    #[arg(long, default_value_t = 8)]
    max_n: usize,
    /// The most characters in one prompt
    #[arg(long, default_value_t = 32_768)]
    max_prompt_chars: usize,
    /// Seconds a request may take from its arrival to its last token; a stream still going
    /// then ends with an error event
    #[arg(long, value_name = "SECONDS", default_value_t = 300.0)]
    timeout: f64,
    #[command(flatten)]
    run_on: RunOn,
}

fn main() {
    if let Err(e) = cinder::without_huge_pages() {
        eprintln!("warning: transparent huge pages stay on ({e}): memory may grow in 2 MiB steps");
    }
    exit_on_error(run(Args::parse()));
}

fn run(args: Args) -> anyhow::Result<()> {
    if args.max_tokens == 0 || args.max_n == 0 || args.max_loaded == 0 || args.max_prompt_chars == 0
    {
        anyhow::bail!(
            "--max-tokens, --max-n, --max-prompt-chars and --max-loaded must be at least 1"
        );
    }
    if !(args.timeout > 0.0 && args.timeout.is_finite()) {
        anyhow::bail!(
            "--timeout is {}: give a number of seconds above 0",
            args.timeout
        );
    }
    if args.api_key.as_deref() == Some("") {
        anyhow::bail!("--api-key (or CINDER_API_KEY) is empty: give a key, or leave it out");
    }
    if !args.host.is_loopback() && args.api_key.is_none() {
        eprintln!(
            "warning: listening on {} without --api-key: anyone who can reach this machine can \
             read the runs and use the models",
            args.host
        );
    }
    let backend = Backend::select(args.run_on.device)?;
    let runs = args.runs.clone().unwrap_or_else(|| PathBuf::from(RUNS));
    let catalog = Arc::new(models::Catalog::discover(
        &runs,
        args.runs.is_some(),
        &args.checkpoint,
    )?);
    let models = models::Models::new(
        catalog.clone(),
        args.max_loaded,
        backend.device.clone(),
        args.run_on.ops.into(),
    );
    let loaded = models.loaded_info.clone();
    let queue = engine::Queue::start(models, args.max_batch, args.queue);
    let load = queue.load.clone();
    let app = app::App {
        queue,
        catalog,
        loaded,
        limits: api::Limits {
            max_tokens: args.max_tokens,
            max_n: args.max_n,
            max_prompts: api::MAX_PROMPTS,
            max_prompt_chars: args.max_prompt_chars,
            max_rows: args.max_batch,
            timeout: Duration::from_secs_f64(args.timeout),
        },
        api_key: args.api_key.as_deref().map(Arc::from),
        started: api::now(),
        next_id: Arc::new(AtomicU64::new(1)),
    };
    let offered = app.catalog.all().len();

    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let addr = SocketAddr::new(args.host, args.port);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}: pass another --port or --host"))?;
        let addr = listener.local_addr()?;
        println!("listening on http://{addr}");
        eprintln!(
            "cinder {}: {}; {offered} models from {} and --checkpoint (the page at / shows them)",
            env!("CARGO_PKG_VERSION"),
            backend.describe(),
            runs.display(),
        );
        let stopped = async move {
            stop_signal().await;
            load.stopping.store(true, Ordering::SeqCst);
            eprintln!("stopping: open completions end now");
            // Open streams end within a token; a client that never reads is not waited for.
            std::thread::spawn(|| {
                std::thread::sleep(Duration::from_secs(5));
                std::process::exit(0);
            });
        };
        axum::serve(listener, routes::router(app))
            .with_graceful_shutdown(stopped)
            .await
            .context("the server failed")
    })
}

/// Ctrl-C, or SIGTERM on Unix.
async fn stop_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => ctrl_c.await,
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await;
}
