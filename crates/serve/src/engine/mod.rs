//! The generation engine: one thread owns the loaded models and decodes the completion requests
//! of one model together, taken from a bounded queue. Requests join and leave the batch at token
//! boundaries, each row (a choice of a prompt) in a place of its own in the model's key/value
//! cache, made for `--max-batch` rows and kept from batch to batch: one forward pass per token
//! serves every client. Each request's text goes, choice by choice, as events on a channel of
//! its own.
//!
//! A prompt's choices (`n` of them) are `generate`'s samples: rows of one decoder, each prompt
//! with `generate`'s random stream for the seed, so that a seed gives `generate --seed`'s text.
//! Stop strings are matched on the decoded text; while a choice streams, text that may be the
//! start of a stop string is held back until it is known not to be.
//!
//! - [`job`]: what a request asks for, and the events it is told;
//! - [`error`]: what goes wrong, in the engine's words (the API maps it to HTTP);
//! - [`queue`]: the sending end, and which requests it takes;
//! - [`load`]: what the queue and the worker share (the counters, a queued request's claim);
//! - [`worker`]: the generation thread and its batches;
//! - [`running`] and [`choice`]: a request in a batch, and each of its choices;
//! - [`stop`]: stop strings in a growing text;
//! - [`attention`]: `inspect`'s attention maps, a task for the page
//!   ([`Queue::inspect`] runs such tasks on a loaded model).

pub mod attention;
mod choice;
mod error;
mod job;
mod load;
mod queue;
mod running;
mod stop;
mod worker;

pub use error::EngineError;
pub use job::{Event, Finish, Job, TokenLogprob};
pub use queue::Queue;
