//! The generation worker: one thread owns the loaded models and decodes the completion requests
//! of one model together, taken from a bounded queue. Requests join and leave the batch at token
//! boundaries, each row (a choice of a prompt) at its own position in the model's key/value
//! cache: one forward pass per token serves every client. Each request's text goes, choice by
//! choice, as events on a channel of its own.
//!
//! A prompt's choices (`n` of them) are `generate`'s samples: rows of one decoder, each prompt
//! with `generate`'s random stream for the seed, so that a seed gives `generate --seed`'s text.
//! Stop strings are matched on the decoded text; while a choice streams, text that may be the
//! start of a stop string is held back until it is known not to be.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Instant;

use cinder::inspect::AttentionMaps;
use cinder::sampling::generate::{Decoder, Picker};
use cinder::sampling::{DEFAULT_PROMPT, PromptError, SamplingParams, prompt_ids};
use cinder_data::{TextStream, Tokenizer};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::oneshot;

use crate::api::ApiError;
use crate::models::{Loaded, Models};

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
/// `Finished` for each choice (indexed prompt by prompt, `n` per prompt), then `Done` (or
/// `Failed`, past the time limit).
#[derive(Debug)]
pub enum Event {
    Started {
        prompt_tokens: usize,
    },
    /// Text of choice `index`, once `written` tokens of the request (every choice's) are.
    Text {
        index: usize,
        text: String,
        written: usize,
    },
    Finished {
        index: usize,
        reason: Finish,
    },
    Done {
        completion_tokens: usize,
    },
    Failed(ApiError),
}

/// Tokens of text whose attention maps a request may ask for.
pub const MAX_ATTENTION_TOKENS: usize = 64;

/// What the worker is asked to do, with the client's claim on its place.
enum Work {
    /// A completion request, whose events go to the sender.
    Complete(Job, UnboundedSender<Event>, Arc<Claim>),
    /// `inspect`'s attention maps of a short text.
    Attention {
        model: String,
        text: String,
        reply: oneshot::Sender<Result<AttentionMaps, ApiError>>,
        claim: Arc<Claim>,
    },
}

/// Counters the web server reads: how busy the worker is, and whether the server is stopping.
#[derive(Debug, Default)]
pub struct Load {
    /// Requests submitted and not yet done (those generating included).
    pending: AtomicUsize,
    /// Requests generating now.
    active: AtomicUsize,
    /// Their rows (choices), of the batch's `max_rows`.
    rows: AtomicUsize,
    pub stopping: AtomicBool,
}

impl Load {
    /// Requests generating now.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }

    /// Requests waiting for the worker.
    pub fn queued(&self) -> usize {
        self.pending
            .load(Ordering::SeqCst)
            .saturating_sub(self.active())
    }

    /// A request of `rows` rows starts generating.
    fn start(&self, rows: usize) {
        self.rows.fetch_add(rows, Ordering::SeqCst);
        self.active.fetch_add(1, Ordering::SeqCst);
    }

    /// A request is over: its place (and its `rows` rows, if it had started) is free before
    /// its client hears so.
    fn done(&self, started: Option<usize>) {
        if let Some(rows) = started {
            self.rows.fetch_sub(rows, Ordering::SeqCst);
            self.active.fetch_sub(1, Ordering::SeqCst);
        }
        self.pending.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Who has a queued request: still its client, the worker (which took it), or nobody (its
/// client left while it waited: its place was freed then).
#[derive(Debug, Default)]
pub struct Claim(AtomicU8);

const QUEUED: u8 = 0;
const TAKEN: u8 = 1;
const DROPPED: u8 = 2;

impl Claim {
    /// The worker takes the request, unless its client left.
    fn take(&self) -> bool {
        self.0
            .compare_exchange(QUEUED, TAKEN, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }
}

/// A client's place in the queue, held while its request waits: dropped before the worker takes
/// the request (the client left, or its time ran out), it frees the place at once.
pub struct Place {
    claim: Arc<Claim>,
    load: Arc<Load>,
}

impl Drop for Place {
    fn drop(&mut self) {
        let given_up =
            self.claim
                .0
                .compare_exchange(QUEUED, DROPPED, Ordering::SeqCst, Ordering::SeqCst);
        if given_up.is_ok() {
            self.load.done(None);
        }
    }
}

/// The sending end of the worker's queue.
#[derive(Clone)]
pub struct Queue {
    work: mpsc::Sender<Work>,
    /// Requests that may wait.
    capacity: usize,
    /// Rows the worker decodes together.
    max_rows: usize,
    pub load: Arc<Load>,
}

impl Queue {
    /// Starts the worker thread over `models`: at most `max_rows` rows (choices of prompts)
    /// decoded together, and room for `capacity` requests waiting.
    pub fn start(models: Models, max_rows: usize, capacity: usize) -> Self {
        let (sender, inbox) = mpsc::channel();
        let load = Arc::new(Load::default());
        let worker_load = load.clone();
        std::thread::Builder::new()
            .name("generation".into())
            .spawn(move || {
                Worker {
                    models,
                    inbox,
                    waiting: VecDeque::new(),
                    load: worker_load,
                    max_rows: max_rows.max(1),
                }
                .run()
            })
            .expect("the generation thread starts");
        Self {
            work: sender,
            capacity,
            max_rows: max_rows.max(1),
            load,
        }
    }

    /// Queues `job`, whose events go to `events`; refused (429) when `capacity` requests wait
    /// already. The place is the client's until the worker takes the request.
    pub fn submit(&self, job: Job, events: UnboundedSender<Event>) -> Result<Place, ApiError> {
        let rows = job.prompts.len() * job.n;
        self.enqueue(rows, |claim| Work::Complete(job, events, claim))
    }

    /// The attention maps of `text` (its first [`MAX_ATTENTION_TOKENS`] tokens) under model
    /// `model`, queued as a completion is.
    pub async fn attention(&self, model: String, text: String) -> Result<AttentionMaps, ApiError> {
        let (reply, answer) = oneshot::channel();
        let _place = self.enqueue(0, |claim| Work::Attention {
            model,
            text,
            reply,
            claim,
        })?;
        answer
            .await
            .unwrap_or_else(|_| Err(ApiError::worker_gone()))
    }

    /// Takes `rows` rows' request if the batch has room for it now and nobody waits, or else
    /// fewer than `capacity` wait.
    fn enqueue(
        &self,
        rows: usize,
        work: impl FnOnce(Arc<Claim>) -> Work,
    ) -> Result<Place, ApiError> {
        let load = &self.load;
        let taken = load
            .pending
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |p| {
                let waiting = p.saturating_sub(load.active());
                let fits = load.rows.load(Ordering::SeqCst) + rows <= self.max_rows;
                (waiting < self.capacity || (waiting == 0 && fits)).then_some(p + 1)
            });
        if let Err(p) = taken {
            return Err(ApiError::busy(p.saturating_sub(load.active())));
        }
        let claim = Arc::new(Claim::default());
        let place = Place {
            claim: claim.clone(),
            load: load.clone(),
        };
        if self.work.send(work(claim)).is_err() {
            drop(place); // frees the place
            return Err(ApiError::worker_gone());
        }
        Ok(place)
    }
}

/// The generation thread's state.
struct Worker {
    models: Models,
    inbox: mpsc::Receiver<Work>,
    /// Work taken from the inbox while a batch of another model ran: served first.
    waiting: VecDeque<Work>,
    load: Arc<Load>,
    max_rows: usize,
}

impl Worker {
    fn run(mut self) {
        loop {
            let work = match self.waiting.pop_front() {
                Some(work) => work,
                None => match self.inbox.recv() {
                    Ok(work) => work,
                    Err(_) => return, // the server is gone
                },
            };
            match work {
                Work::Attention {
                    model,
                    text,
                    reply,
                    claim,
                } => {
                    if !claim.take() {
                        continue; // its client left
                    }
                    self.load.start(0);
                    let run = AssertUnwindSafe(|| attention(&mut self.models, &model, &text));
                    let outcome = std::panic::catch_unwind(run).unwrap_or_else(|_| Err(failed()));
                    self.load.done(Some(0));
                    let _ = reply.send(outcome);
                }
                Work::Complete(job, events, claim) => {
                    if !claim.take() {
                        continue; // its client left
                    }
                    if self.load.stopping.load(Ordering::SeqCst) {
                        self.load.done(None);
                        let _ = events.send(Event::Failed(ApiError::stopping()));
                        continue;
                    }
                    let get = AssertUnwindSafe(|| self.models.get(&job.model));
                    match std::panic::catch_unwind(get).unwrap_or_else(|_| Err(failed())) {
                        Ok(model) => {
                            // A panic in Burn (memory, say) fails the batch's requests (their
                            // places are freed as they drop), not the worker. The batch runs on
                            // the sampling thread, as `generate` does.
                            let batch = AssertUnwindSafe(|| {
                                cinder_model::sampling(|| self.batch(model, job, events))
                            });
                            let _ = std::panic::catch_unwind(batch);
                        }
                        Err(e) => {
                            self.load.done(None);
                            let _ = events.send(Event::Failed(e));
                        }
                    }
                }
            }
        }
    }

    /// Decodes `first` and the requests for its model that arrive meanwhile (up to `max_rows`
    /// rows at once), until none is left. A request for another model, or for a newer
    /// checkpoint of this one, closes the batch to newcomers: it is served next.
    fn batch(&mut self, model: Arc<Loaded>, first: Job, events: UnboundedSender<Event>) {
        let id = first.model.clone();
        let mut decoder = Decoder::new(&model.gpt, true, &model.device);
        let mut running: Vec<Running> = Vec::new();
        // Taken from the queue and not yet admitted; a newcomer's claim is taken when it is
        // admitted, so that its client may still leave (and free its place) while it waits
        // for room.
        let mut next = Some((first, events, None));
        let mut closed = false;
        loop {
            // Newcomers join at a token boundary, while their rows fit.
            loop {
                let (job, events, claim) = match next.take() {
                    Some(taken) => taken,
                    None if closed => break,
                    None => match self.inbox.try_recv() {
                        Ok(Work::Complete(job, events, claim))
                            if job.model == id && self.models.is_current(&id, &model) =>
                        {
                            (job, events, Some(claim))
                        }
                        Ok(other) => {
                            self.waiting.push_back(other);
                            closed = true;
                            break;
                        }
                        Err(_) => break,
                    },
                };
                let rows: usize = running.iter().map(Running::row_count).sum();
                if !running.is_empty() && rows + job.prompts.len() * job.n > self.max_rows {
                    next = Some((job, events, claim)); // when rows leave
                    break;
                }
                if claim.is_some_and(|claim| !claim.take()) {
                    continue; // its client left while it waited
                }
                match Running::admit(job, events, &model.tokenizer, &self.load) {
                    Ok(Some(request)) => {
                        decoder.join(request.rows());
                        running.push(request);
                    }
                    Ok(None) => self.load.done(None), // the client left while it waited
                    Err((events, e)) => {
                        self.load.done(None);
                        let _ = events.send(Event::Failed(e));
                    }
                }
            }
            if running.is_empty() {
                return;
            }
            let logits = decoder.next_logits();
            let v = logits.len() / decoder.rows();
            let stopping = self.load.stopping.load(Ordering::SeqCst);
            let mut row = 0;
            let mut ended = Vec::new();
            for (i, request) in running.iter_mut().enumerate() {
                let rows = row..row + request.row_count();
                row = rows.end;
                let tokens = request.pick(&logits[rows.start * v..rows.end * v]);
                for (r, token) in rows.clone().zip(tokens) {
                    decoder.push(r, token);
                }
                if let Some(end) = request.end(stopping) {
                    ended.push((i, rows, end));
                }
            }
            // Ended requests leave, last first, so that the rows before stay where they are.
            for (i, rows, end) in ended.into_iter().rev() {
                decoder.leave(rows);
                running.remove(i).finish(end);
            }
        }
    }
}

fn failed() -> ApiError {
    ApiError::server("generation failed: see the server's log".into())
}

/// The error of a prompt that cannot be continued, naming it among the request's.
fn prompt_error(param: &str, index: Option<usize>, e: PromptError) -> ApiError {
    let which = index.map_or(String::new(), |i| format!(" {i}"));
    ApiError::invalid(param, format!("{param}{which}: {e}"))
}

/// `inspect`'s attention maps of the first [`MAX_ATTENTION_TOKENS`] tokens of `text` (at most
/// the model's context).
fn attention(models: &mut Models, id: &str, text: &str) -> Result<AttentionMaps, ApiError> {
    let model = models.get(id)?;
    let mut ids =
        prompt_ids(&model.tokenizer, text, false).map_err(|e| prompt_error("text", None, e))?;
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

/// How a request left the batch.
enum End {
    /// Every choice ended, or `max_tokens` were written, or the server is stopping.
    Complete,
    /// Past its time limit.
    TimedOut,
    /// Its client went away.
    Gone,
}

/// A request being decoded: its rows are consecutive in the decoder, prompt after prompt, `n`
/// per prompt. Dropped before it finishes (a panic in the batch), it frees its place and fails.
struct Running<'t> {
    job: Job,
    events: UnboundedSender<Event>,
    load: Arc<Load>,
    /// Each prompt's tokens, its picker (`generate`'s random stream for the seed) and its
    /// choices.
    prompts: Vec<(Vec<u32>, Picker, Vec<Choice<'t>>)>,
    /// Tokens written to each row.
    steps: usize,
    completion_tokens: usize,
    gone: bool,
    finished: bool,
}

impl<'t> Running<'t> {
    /// The request `job`, its prompts encoded, `Started` sent; `None` if its client left; an
    /// error (with the events' sender) if it cannot be served.
    #[allow(clippy::result_large_err)]
    fn admit(
        job: Job,
        events: UnboundedSender<Event>,
        tokenizer: &'t Tokenizer,
        load: &Arc<Load>,
    ) -> Result<Option<Self>, (UnboundedSender<Event>, ApiError)> {
        if load.stopping.load(Ordering::SeqCst) {
            return Err((events, ApiError::stopping()));
        }
        if events.is_closed() {
            return Ok(None);
        }
        if Instant::now() >= job.deadline {
            return Err((events, ApiError::timeout()));
        }
        let mut prompts = Vec::with_capacity(job.prompts.len());
        for (i, prompt) in job.prompts.iter().enumerate() {
            // An empty prompt samples from the start, as `generate` does without one.
            let prompt = if prompt.is_empty() {
                DEFAULT_PROMPT
            } else {
                prompt
            };
            let ids = match prompt_ids(tokenizer, prompt, false) {
                Ok(ids) => ids,
                Err(e) => return Err((events, prompt_error("prompt", Some(i), e))),
            };
            let choices = (0..job.n)
                .map(|c| Choice::new(i * job.n + c, tokenizer, &job.stop))
                .collect();
            let picker = Picker::new(job.sampling, job.seed, tokenizer.vocab_size());
            prompts.push((ids, picker, choices));
        }
        let prompt_tokens = prompts.iter().map(|(ids, _, _)| ids.len()).sum();
        if events.send(Event::Started { prompt_tokens }).is_err() {
            return Ok(None);
        }
        load.start(job.prompts.len() * job.n);
        Ok(Some(Self {
            job,
            events,
            load: load.clone(),
            prompts,
            steps: 0,
            completion_tokens: 0,
            gone: false,
            finished: false,
        }))
    }

    /// The texts of its rows, prompt by prompt, `n` each.
    fn rows(&self) -> Vec<Vec<u32>> {
        self.prompts
            .iter()
            .flat_map(|(ids, _, choices)| choices.iter().map(|_| ids.clone()))
            .collect()
    }

    fn row_count(&self) -> usize {
        self.prompts.len() * self.job.n
    }

    /// Picks each row's next token from `logits` (this request's rows), as `generate` does,
    /// and sends what it makes of the choices' text. Returns the tokens, row by row.
    fn pick(&mut self, logits: &[f32]) -> Vec<u32> {
        let per_prompt = logits.len() / self.prompts.len();
        let mut tokens = Vec::with_capacity(self.row_count());
        for ((_, picker, choices), logits) in self.prompts.iter_mut().zip(logits.chunks(per_prompt))
        {
            for (choice, token) in choices.iter_mut().zip(picker.pick(logits, self.job.n)) {
                tokens.push(token);
                if !choice.finished {
                    self.completion_tokens += 1;
                    let written = self.completion_tokens;
                    self.gone |= choice.push(token, written, &self.events).is_err();
                }
            }
        }
        self.steps += 1;
        tokens
    }

    /// Whether the request is over after this step, and how.
    fn end(&self, stopping: bool) -> Option<End> {
        let all_finished = self
            .prompts
            .iter()
            .all(|(_, _, choices)| choices.iter().all(|c| c.finished));
        if self.gone || self.events.is_closed() {
            Some(End::Gone)
        } else if Instant::now() >= self.job.deadline {
            Some(End::TimedOut)
        } else if stopping || all_finished || self.steps == self.job.max_tokens {
            Some(End::Complete)
        } else {
            None
        }
    }

    /// Ends the choices, frees the request's place, then tells its client.
    fn finish(mut self, end: End) {
        self.finished = true;
        let rows = Some(self.row_count());
        let events = self.events.clone();
        match end {
            End::Gone => self.load.done(rows),
            End::TimedOut => {
                self.load.done(rows);
                // What was streamed stays with the client; the error ends the stream.
                let _ = events.send(Event::Failed(ApiError::timeout()));
            }
            End::Complete => {
                let mut gone = false;
                for (_, _, choices) in std::mem::take(&mut self.prompts) {
                    for choice in choices {
                        gone |= choice.finish(self.completion_tokens, &events).is_err();
                    }
                }
                self.load.done(rows);
                if !gone {
                    let completion_tokens = self.completion_tokens;
                    let _ = events.send(Event::Done { completion_tokens });
                }
            }
        }
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.load.done(Some(self.row_count()));
            let _ = self.events.send(Event::Failed(failed()));
        }
    }
}

/// The client went away: its events have nowhere to go.
struct Gone;

/// One choice being generated: its text decoded so far, held back from a stop string.
struct Choice<'a> {
    index: usize,
    stream: TextStream<'a>,
    held: StopMatcher,
    finished: bool,
}

impl<'a> Choice<'a> {
    fn new(index: usize, tokenizer: &'a Tokenizer, stop: &[String]) -> Self {
        Self {
            index,
            stream: TextStream::new(tokenizer),
            held: StopMatcher::new(stop),
            finished: false,
        }
    }

    fn send(events: &UnboundedSender<Event>, event: Event) -> Result<(), Gone> {
        events.send(event).map_err(|_| Gone)
    }

    /// Sends `text` of choice `index`, if there is any, as of the request's `written` tokens.
    fn send_text(
        index: usize,
        text: String,
        written: usize,
        events: &UnboundedSender<Event>,
    ) -> Result<(), Gone> {
        if text.is_empty() {
            return Ok(());
        }
        Self::send(
            events,
            Event::Text {
                index,
                text,
                written,
            },
        )
    }

    /// Decodes `token`, the request's `written`th, and sends the text it settles.
    fn push(
        &mut self,
        token: u32,
        written: usize,
        events: &UnboundedSender<Event>,
    ) -> Result<(), Gone> {
        let (text, stopped) = self.held.push(&self.stream.push(token));
        Self::send_text(self.index, text, written, events)?;
        if stopped {
            self.finished = true;
            let (index, reason) = (self.index, Finish::Stop);
            Self::send(events, Event::Finished { index, reason })?;
        }
        Ok(())
    }

    /// Ends a choice that met no stop string: what was held back is text after all (`written`:
    /// the request's tokens).
    fn finish(mut self, written: usize, events: &UnboundedSender<Event>) -> Result<(), Gone> {
        if self.finished {
            return Ok(());
        }
        let (mut text, stopped) = self.held.push(&self.stream.finish());
        if !stopped {
            text.push_str(&self.held.release());
        }
        let index = self.index;
        Self::send_text(index, text, written, events)?;
        let reason = if stopped {
            Finish::Stop
        } else {
            Finish::Length
        };
        Self::send(events, Event::Finished { index, reason })
    }
}

/// Finds stop strings in a growing text, holding back the end that may begin one.
#[derive(Debug)]
pub struct StopMatcher {
    stop: Vec<String>,
    held: String,
}

impl StopMatcher {
    pub fn new(stop: &[String]) -> Self {
        Self {
            stop: stop.to_vec(),
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
