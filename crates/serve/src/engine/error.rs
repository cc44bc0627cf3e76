//! What goes wrong in the engine, in its own words. Which HTTP status, OpenAI error type, code
//! and parameter a client gets for each is the HTTP API's business, not the engine's: the
//! engine knows nothing of HTTP.

use cinder::sampling::PromptError;

use crate::models::ModelError;

/// Why the engine did not serve a request, or stopped serving it. Each message is written for
/// the client that made the request.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// `waiting` requests wait already, as many as the queue holds.
    #[error("{waiting} requests are waiting already: try again shortly")]
    QueueFull { waiting: usize },
    /// The server is stopping: nothing new starts.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// The request ran past its deadline (`serve --timeout` from its arrival).
    #[error(
        "the request ran past this server's time limit (serve --timeout): ask for fewer tokens \
         or choices"
    )]
    TimedOut,
    /// Prompt `index` of the request cannot be continued by the model.
    #[error("prompt {index}: {source}")]
    BadPrompt { index: usize, source: PromptError },
    /// Prompt `index`, to be scored (`echo` with `logprobs`), is longer than the model's
    /// context.
    #[error(
        "prompt {index} has {tokens} tokens, but this model's context is {context} tokens: \
         log-probabilities of a prompt (echo) need it whole in one window"
    )]
    PromptTooLong {
        index: usize,
        tokens: usize,
        context: usize,
    },
    /// The text whose attention maps were asked for cannot be read by the model.
    #[error("text: {0}")]
    BadText(#[source] PromptError),
    /// The model asked for is not offered, or does not load.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The generation thread is gone: nothing more is served.
    #[error("the generation worker stopped: see the server's log")]
    WorkerGone,
    /// Generation panicked (in Burn: memory, say); the batch's requests fail, the worker lives.
    #[error("generation failed: see the server's log")]
    Failed,
}
