//! The generation worker: one thread owns the loaded models and runs one completion request at
//! a time, taken from a bounded queue; it reports each request's text, choice by choice, as
//! events on a channel of its own.
//!
//! A prompt's choices (`n` of them) are `generate`'s samples, decoded as one batch, so that a
//! seed gives `generate --seed`'s text. Stop strings are matched on the
//! decoded text; while a choice streams, text that may be the start of a stop string is held
//! back until it is known not to be.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Instant;

use std::ops::ControlFlow;
use std::panic::AssertUnwindSafe;

use cinder::inspect::AttentionMaps;
use cinder::sampling::generate::{GenerateOptions, generate};
use cinder::sampling::{DEFAULT_PROMPT, SamplingParams};
use cinder_data::TextStream;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::oneshot;

use crate::api::ApiError;
use crate::models::Models;

/// What a completion request asks the worker for.
#[derive(Debug, Clone)]
pub struct Job {
    pub model: String,
    pub prompts: Vec<String>,
    /// Choices per prompt.
    pub n: usize,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub seed: u64,
    pub stop: Vec<String>,
    /// When the request must be over (its time limit from when it arrived): a choice still
    /// generating then ends the request with an error.
    pub deadline: Instant,
}

/// Why a choice ended, in OpenAI's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Finish {
    /// A stop string was met.
    Stop,
    /// `max_tokens` were generated, or the server is stopping.
    Length,
}

/// What the worker reports about a job, in this order: `Started` (or `Failed`), `Text` and
/// `Finished` for each choice (indexed prompt by prompt, `n` per prompt), then `Done`.
#[derive(Debug)]
pub enum Event {
    Started { prompt_tokens: usize },
    Text { index: usize, text: String },
    Finished { index: usize, reason: Finish },
    Done { completion_tokens: usize },
    Failed(ApiError),
}

/// Tokens of text whose attention maps a request may ask for.
pub const MAX_ATTENTION_TOKENS: usize = 64;

/// What the worker is asked to do.
enum Work {
    /// A completion request, whose events go to the sender.
    Complete(Job, UnboundedSender<Event>),
    /// `inspect`'s attention maps of a short text.
    Attention {
        model: String,
        text: String,
        reply: oneshot::Sender<Result<AttentionMaps, ApiError>>,
    },
}

/// Counters the web server reads: how busy the worker is, and whether the server is stopping.
#[derive(Debug, Default)]
pub struct Load {
    /// Jobs submitted and not yet done (the one generating included).
    pending: AtomicUsize,
    /// 1 while a job generates.
    active: AtomicUsize,
    pub stopping: AtomicBool,
}

impl Load {
    /// The job generating now (0 or 1).
    pub fn active(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }

    /// Jobs waiting for the worker.
    pub fn queued(&self) -> usize {
        self.pending
            .load(Ordering::SeqCst)
            .saturating_sub(self.active())
    }
}

/// The sending end of the worker's queue.
#[derive(Clone)]
pub struct Queue {
    work: mpsc::Sender<Work>,
    capacity: usize,
    pub load: Arc<Load>,
}

impl Queue {
    /// Starts the worker thread over `models`, with room for `capacity` waiting jobs.
    pub fn start(models: Models, capacity: usize) -> Self {
        let (sender, inbox) = mpsc::channel();
        let load = Arc::new(Load::default());
        let worker_load = load.clone();
        std::thread::Builder::new()
            .name("generation".into())
            .spawn(move || work(models, inbox, &worker_load))
            .expect("the generation thread starts");
        Self {
            work: sender,
            capacity,
            load,
        }
    }

    /// Queues `job`, whose events go to `events`; refused (429) if `capacity` requests wait
    /// already besides the one being served.
    pub fn submit(&self, job: Job, events: UnboundedSender<Event>) -> Result<(), ApiError> {
        self.enqueue(Work::Complete(job, events))
    }

    /// The attention maps of `text` (its first [`MAX_ATTENTION_TOKENS`] tokens) under model
    /// `model`, queued as a completion is.
    pub async fn attention(&self, model: String, text: String) -> Result<AttentionMaps, ApiError> {
        let (reply, answer) = oneshot::channel();
        self.enqueue(Work::Attention { model, text, reply })?;
        answer
            .await
            .unwrap_or_else(|_| Err(ApiError::server("the generation worker stopped".into())))
    }

    fn enqueue(&self, work: Work) -> Result<(), ApiError> {
        let pending = &self.load.pending;
        let taken = pending.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |p| {
            (p <= self.capacity).then_some(p + 1)
        });
        if let Err(p) = taken {
            return Err(ApiError::busy(p.saturating_sub(1)));
        }
        if self.work.send(work).is_err() {
            pending.fetch_sub(1, Ordering::SeqCst);
            return Err(ApiError::server("the generation worker stopped".into()));
        }
        Ok(())
    }
}

/// The client went away: its events have nowhere to go.
struct Gone;

fn work(mut models: Models, inbox: mpsc::Receiver<Work>, load: &Load) {
    for work in inbox {
        load.active.store(1, Ordering::SeqCst);
        // A panic in Burn (a model that does not fit in memory, say) fails this request, not
        // the worker.
        let failed = || ApiError::server("generation failed: see the server's log".into());
        match work {
            Work::Complete(job, events) => {
                let outcome = if load.stopping.load(Ordering::SeqCst) {
                    Err(ApiError::stopping())
                } else if events.is_closed() {
                    Ok(None) // the client left while it waited
                } else {
                    let run = AssertUnwindSafe(|| complete(&mut models, &job, &events, load));
                    std::panic::catch_unwind(run).unwrap_or_else(|_| Err(failed()))
                };
                // The place is free before the client hears that its request is done.
                load.active.store(0, Ordering::SeqCst);
                load.pending.fetch_sub(1, Ordering::SeqCst);
                let _ = match outcome {
                    Ok(Some(completion_tokens)) => events.send(Event::Done { completion_tokens }),
                    Ok(None) => Ok(()),
                    Err(e) => events.send(Event::Failed(e)),
                };
            }
            Work::Attention { model, text, reply } => {
                let run = AssertUnwindSafe(|| attention(&mut models, &model, &text));
                let outcome = std::panic::catch_unwind(run).unwrap_or_else(|_| Err(failed()));
                load.active.store(0, Ordering::SeqCst);
                load.pending.fetch_sub(1, Ordering::SeqCst);
                let _ = reply.send(outcome);
            }
        }
    }
}

/// `inspect`'s attention maps of the first [`MAX_ATTENTION_TOKENS`] tokens of `text` (at most
/// the model's context).
fn attention(models: &mut Models, id: &str, text: &str) -> Result<AttentionMaps, ApiError> {
    let model = models.get(id)?;
    let text: String = cinder_data::normalized_chars(text).collect();
    let mut ids = model
        .tokenizer
        .encode(&text)
        .map_err(|e| ApiError::invalid("text", format!("the text does not fit the model: {e}")))?;
    if ids.is_empty() {
        return Err(ApiError::invalid(
            "text",
            "the text is empty: give at least one character",
        ));
    }
    ids.truncate(MAX_ATTENTION_TOKENS.min(model.gpt.block_size()));
    let tokens = ids
        .iter()
        .map(|&id| String::from_utf8_lossy(&model.tokenizer.token_bytes(id)).into_owned())
        .collect();
    Ok(AttentionMaps::compute(
        &model.gpt,
        &ids,
        tokens,
        &model.device,
    ))
}

/// Runs `job`, reporting its text on `events`, and returns the tokens written (`None` when the
/// client went away). An error comes before any text.
fn complete(
    models: &mut Models,
    job: &Job,
    events: &UnboundedSender<Event>,
    load: &Load,
) -> Result<Option<usize>, ApiError> {
    let model = models.get(&job.model)?;
    let tokenizer = &model.tokenizer;
    if Instant::now() >= job.deadline {
        return Err(ApiError::timeout());
    }
    let mut prompts = Vec::with_capacity(job.prompts.len());
    for (i, prompt) in job.prompts.iter().enumerate() {
        // An empty prompt samples from the start, as `generate` does without one.
        let prompt = if prompt.is_empty() {
            DEFAULT_PROMPT
        } else {
            prompt
        };
        let text: String = cinder_data::normalized_chars(prompt).collect();
        let ids = tokenizer.encode(&text).map_err(|e| {
            ApiError::invalid("prompt", format!("prompt {i} does not fit the model: {e}"))
        })?;
        prompts.push(ids);
    }
    let send = |event: Event| events.send(event).map_err(|_| Gone);
    let prompt_tokens = prompts.iter().map(Vec::len).sum();
    let mut timed_out = false;
    let mut run = || -> Result<usize, Gone> {
        send(Event::Started { prompt_tokens })?;
        let mut completion_tokens = 0;
        for (p, prompt) in prompts.iter().enumerate() {
            // Each prompt's choices are `generate --seed`'s samples of it.
            let opts = GenerateOptions {
                max_new_tokens: job.max_tokens,
                num_samples: job.n,
                sampling: job.sampling,
                seed: job.seed,
                use_cache: true,
                tokens: tokenizer.vocab_size(),
            };
            let mut choices: Vec<Choice> = (0..job.n)
                .map(|c| Choice::new(p * job.n + c, tokenizer, &job.stop))
                .collect();
            let mut gone = false;
            generate(&model.gpt, prompt, &opts, &model.device, |c, token| {
                let choice = &mut choices[c];
                if !choice.finished {
                    completion_tokens += 1;
                    gone |= choice.push(token, &send).is_err();
                }
                timed_out = Instant::now() >= job.deadline;
                let over = gone
                    || timed_out
                    || events.is_closed()
                    || load.stopping.load(Ordering::SeqCst)
                    || choices.iter().all(|c| c.finished);
                if over {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            });
            if gone || timed_out || events.is_closed() {
                return Err(Gone);
            }
            for choice in choices {
                choice.finish(&send)?;
            }
        }
        Ok(completion_tokens)
    };
    let written = run().ok();
    if timed_out {
        // What was streamed stays with the client; the error ends the stream.
        return Err(ApiError::timeout());
    }
    Ok(written)
}

/// One choice being generated: its text decoded so far, held back from a stop string.
struct Choice<'a> {
    index: usize,
    stream: TextStream<'a>,
    held: StopMatcher<'a>,
    finished: bool,
}

impl<'a> Choice<'a> {
    fn new(index: usize, tokenizer: &'a cinder_data::Tokenizer, stop: &'a [String]) -> Self {
        Self {
            index,
            stream: TextStream::new(tokenizer),
            held: StopMatcher::new(stop),
            finished: false,
        }
    }

    fn push(&mut self, token: u32, send: &impl Fn(Event) -> Result<(), Gone>) -> Result<(), Gone> {
        let (text, stopped) = self.held.push(&self.stream.push(token));
        if !text.is_empty() {
            send(Event::Text {
                index: self.index,
                text,
            })?;
        }
        if stopped {
            self.finished = true;
            send(Event::Finished {
                index: self.index,
                reason: Finish::Stop,
            })?;
        }
        Ok(())
    }

    /// Ends a choice that met no stop string: what was held back is text after all.
    fn finish(mut self, send: &impl Fn(Event) -> Result<(), Gone>) -> Result<(), Gone> {
        if self.finished {
            return Ok(());
        }
        let (mut text, stopped) = self.held.push(&self.stream.finish());
        if !stopped {
            text.push_str(&self.held.release());
        }
        if !text.is_empty() {
            send(Event::Text {
                index: self.index,
                text,
            })?;
        }
        let reason = if stopped {
            Finish::Stop
        } else {
            Finish::Length
        };
        send(Event::Finished {
            index: self.index,
            reason,
        })
    }
}

/// Finds stop strings in a growing text, holding back the end that may begin one.
#[derive(Debug)]
pub struct StopMatcher<'a> {
    stop: &'a [String],
    held: String,
}

impl<'a> StopMatcher<'a> {
    pub fn new(stop: &'a [String]) -> Self {
        Self {
            stop,
            held: String::new(),
        }
    }

    /// Adds `piece`; returns the text now safe to emit, and whether a stop string was met (the
    /// text then ends where it begins, and nothing after it is ever emitted).
    pub fn push(&mut self, piece: &str) -> (String, bool) {
        self.held.push_str(piece);
        let first_stop = self
            .stop
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first_stop {
            let text = self.held[..at].to_string();
            self.held.clear();
            return (text, true);
        }
        // The longest end of the text that some stop string starts with stays held.
        let keep = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| self.stop.iter().any(|s| s.starts_with(&self.held[i..])))
            .unwrap_or(self.held.len());
        let text = self.held[..keep].to_string();
        self.held.drain(..keep);
        (text, false)
    }

    /// What is held back, when the text ends without a stop string.
    pub fn release(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::StopMatcher;

    /// Feeds `pieces` and returns what was emitted and whether it stopped.
    fn run(stop: &[&str], pieces: &[&str]) -> (Vec<String>, bool) {
        let stop: Vec<String> = stop.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stop);
        let mut out = Vec::new();
        for piece in pieces {
            let (text, stopped) = m.push(piece);
            out.push(text);
            if stopped {
                return (out, true);
            }
        }
        out.push(m.release());
        (out, false)
    }

    #[test]
    fn a_stop_string_split_across_pieces_is_held_back_and_cut() {
        let (out, stopped) = run(&["\n\n"], &["Hello", "\n", "\nWorld"]);
        assert_eq!(out, ["Hello", "", ""]);
        assert!(stopped);
    }

    #[test]
    fn a_false_start_is_released_as_soon_as_it_is_known() {
        let (out, stopped) = run(&["END"], &["the E", "N", "d", " is near"]);
        assert_eq!(out, ["the ", "", "ENd", " is near", ""]);
        assert!(!stopped);
    }

    #[test]
    fn the_earliest_of_several_stop_strings_wins() {
        let (out, stopped) = run(&["b", "a"], &["xxab"]);
        assert_eq!(out, ["xx"]);
        assert!(stopped);
    }

    #[test]
    fn text_held_at_the_end_is_released() {
        let (out, stopped) = run(&["stop"], &["a st", "o"]);
        assert_eq!(out, ["a ", "", "sto"]);
        assert!(!stopped);
    }

    #[test]
    fn multi_byte_characters_are_never_split() {
        let (out, _) = run(&["é!"], &["café", " olé"]);
        assert_eq!(out.concat(), "café olé");
    }
}
