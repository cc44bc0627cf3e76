//! The generation worker: one thread owns the loaded models and runs one completion request at
//! a time, taken from a bounded queue; it reports each request's text, choice by choice, as
//! events on a channel of its own.
//!
//! A request's choices (`n` of them per prompt) decode as one batch with `generate`'s decoder
//! and sampler, so that a seed gives `generate --seed`'s text. Stop strings are matched on the
//! decoded text; while a choice streams, text that may be the start of a stop string is held
//! back until it is known not to be.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};

use cinder::sampling::SamplingParams;
use cinder::sampling::generate::Decoder;
use cinder_data::TextStream;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tokio::sync::mpsc::UnboundedSender;

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
    jobs: mpsc::Sender<(Job, UnboundedSender<Event>)>,
    capacity: usize,
    pub load: Arc<Load>,
}

impl Queue {
    /// Starts the worker thread over `models`, with room for `capacity` waiting jobs.
    pub fn start(models: Models, capacity: usize) -> Self {
        let (jobs, inbox) = mpsc::channel();
        let load = Arc::new(Load::default());
        let worker_load = load.clone();
        std::thread::Builder::new()
            .name("generation".into())
            .spawn(move || work(models, inbox, &worker_load))
            .expect("the generation thread starts");
        Self {
            jobs,
            capacity,
            load,
        }
    }

    /// Queues `job`, whose events go to `events`; false if `capacity` jobs wait already
    /// besides the one generating.
    pub fn submit(&self, job: Job, events: UnboundedSender<Event>) -> bool {
        let pending = &self.load.pending;
        let taken = pending.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |p| {
            (p <= self.capacity).then_some(p + 1)
        });
        if taken.is_err() {
            return false;
        }
        if self.jobs.send((job, events)).is_err() {
            pending.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }
}

fn work(mut models: Models, inbox: mpsc::Receiver<(Job, UnboundedSender<Event>)>, load: &Load) {
    for (job, events) in inbox {
        if load.stopping.load(Ordering::SeqCst) {
            let _ = events.send(Event::Failed(ApiError::stopping()));
        } else {
            load.active.store(1, Ordering::SeqCst);
            if let Err(e) = complete(&mut models, &job, &events, load) {
                let _ = events.send(Event::Failed(e));
            }
            load.active.store(0, Ordering::SeqCst);
        }
        load.pending.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The client went away: its events have nowhere to go.
struct Gone;

/// Runs `job`, reporting on `events`. An error before any text is returned; a client that goes
/// away ends the job quietly.
fn complete(
    models: &mut Models,
    job: &Job,
    events: &UnboundedSender<Event>,
    load: &Load,
) -> Result<(), ApiError> {
    let model = models.get(&job.model)?;
    let tokenizer = &model.tokenizer;
    let mut prompts = Vec::with_capacity(job.prompts.len());
    for (i, prompt) in job.prompts.iter().enumerate() {
        let text: String = cinder_data::normalized_chars(prompt).collect();
        let ids = tokenizer.encode(&text).map_err(|e| {
            ApiError::invalid("prompt", format!("prompt {i} does not fit the model: {e}"))
        })?;
        if ids.is_empty() {
            return Err(ApiError::invalid(
                "prompt",
                format!("prompt {i} is empty: give at least one character the model knows"),
            ));
        }
        prompts.push(ids);
    }
    let send = |event: Event| events.send(event).map_err(|_| Gone);
    let prompt_tokens = prompts.iter().map(Vec::len).sum();
    let run = || -> Result<(), Gone> {
        send(Event::Started { prompt_tokens })?;
        let mut rng = ChaCha8Rng::seed_from_u64(job.seed);
        let mut completion_tokens = 0;
        for (p, prompt) in prompts.iter().enumerate() {
            let mut decoder = Decoder::new(&model.gpt, true, &model.device);
            let mut texts = vec![prompt.clone(); job.n];
            let mut choices: Vec<Choice> = (0..job.n)
                .map(|c| Choice::new(p * job.n + c, tokenizer, &job.stop))
                .collect();
            for _ in 0..job.max_tokens {
                if choices.iter().all(|c| c.finished) || load.stopping.load(Ordering::SeqCst) {
                    break;
                }
                let logits = decoder.next_logits(&texts); // (n, V)
                let v = logits.len() / job.n;
                let pickable = tokenizer.vocab_size().min(v);
                // Every choice draws, finished or not: the batch stays one length and the
                // random stream stays generate's.
                for (c, text) in texts.iter_mut().enumerate() {
                    let row = &logits[c * v..c * v + pickable];
                    let token = job.sampling.pick(row, &mut rng);
                    text.push(token);
                    let choice = &mut choices[c];
                    if !choice.finished {
                        completion_tokens += 1;
                        choice.push(token, &send)?;
                    }
                }
            }
            for choice in choices {
                choice.finish(&send)?;
            }
        }
        send(Event::Done { completion_tokens })
    };
    let _ = run(); // Gone: nobody is listening
    Ok(())
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
