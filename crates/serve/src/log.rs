//! The log line of each request: its method, path, status and time, and what it asked for.

use std::time::Instant;

/// What the log line of a request names, beyond its method, path, status and time. A handler
/// leaves it in its response's extensions, for the middleware that logs.
#[derive(Clone, Default)]
pub struct Logged {
    pub model: Option<String>,
    pub tokens: Option<usize>,
    /// A stream logs itself when it ends.
    pub streamed: bool,
}

/// Logs a request that arrived at `since`.
pub fn log_line(method: &str, path: &str, status: u16, logged: &Logged, since: Instant) {
    eprintln!(
        "{method} {path} {status} model={} tokens={} {:.3}s",
        logged.model.as_deref().unwrap_or("-"),
        logged.tokens.map_or("-".into(), |t| t.to_string()),
        since.elapsed().as_secs_f64()
    );
}
