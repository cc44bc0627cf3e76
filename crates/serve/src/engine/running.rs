//! A request being decoded in a batch: its prompts' rows, the picking of their tokens, and how
//! it ends (and tells its client so).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use cinder::sampling::generate::Picker;
use cinder::sampling::{DEFAULT_PROMPT, prompt_ids};
use cinder_data::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

use super::choice::Choice;
use super::error::EngineError;
use super::job::{Event, Job};
use super::load::Load;

/// How a request left the batch.
pub(super) enum End {
    /// Every choice ended, or `max_tokens` were written, or the server is stopping.
    Complete,
    /// Past its time limit.
    TimedOut,
    /// Its client went away.
    Gone,
}

/// A request being decoded: its rows are consecutive in the decoder, prompt after prompt, `n`
/// per prompt. Dropped before it finishes (a panic in the batch), it frees its place and fails.
pub(super) struct Running<'t> {
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
    pub(super) fn admit(
        job: Job,
        events: UnboundedSender<Event>,
        tokenizer: &'t Tokenizer,
        load: &Arc<Load>,
    ) -> Result<Option<Self>, (UnboundedSender<Event>, EngineError)> {
        if load.stopping.load(Ordering::SeqCst) {
            return Err((events, EngineError::ShuttingDown));
        }
        if events.is_closed() {
            return Ok(None);
        }
        if Instant::now() >= job.deadline {
            return Err((events, EngineError::TimedOut));
        }
        let mut prompts = Vec::with_capacity(job.prompts.len());
        for (index, prompt) in job.prompts.iter().enumerate() {
            // An empty prompt samples from the start, as `generate` does without one.
            let prompt = if prompt.is_empty() {
                DEFAULT_PROMPT
            } else {
                prompt
            };
            let ids = match prompt_ids(tokenizer, prompt, false) {
                Ok(ids) => ids,
                Err(source) => return Err((events, EngineError::BadPrompt { index, source })),
            };
            let choices = (0..job.n)
                .map(|c| Choice::new(index * job.n + c, tokenizer, &job.stop))
                .collect();
            let picker = Picker::new(job.sampling, job.seed, tokenizer.vocab_size());
            prompts.push((ids, picker, choices));
        }
        let prompt_tokens = prompts.iter().map(|(ids, _, _)| ids.len()).sum();
        if events.send(Event::Started { prompt_tokens }).is_err() {
            return Ok(None);
        }
        load.start(job.rows());
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
    pub(super) fn rows(&self) -> Vec<Vec<u32>> {
        self.prompts
            .iter()
            .flat_map(|(ids, _, choices)| choices.iter().map(|_| ids.clone()))
            .collect()
    }

    pub(super) fn row_count(&self) -> usize {
        self.job.rows()
    }

    /// Picks each row's next token from `logits` (this request's rows), as `generate` does,
    /// and sends what it makes of the choices' text. Returns the tokens, row by row.
    pub(super) fn pick(&mut self, logits: &[f32]) -> Vec<u32> {
        let per_prompt = logits.len() / self.prompts.len();
        let mut tokens = Vec::with_capacity(self.row_count());
        for ((_, picker, choices), logits) in self.prompts.iter_mut().zip(logits.chunks(per_prompt))
        {
            for (choice, token) in choices.iter_mut().zip(picker.pick(logits, self.job.n)) {
                tokens.push(token);
                if !choice.finished() {
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
    pub(super) fn end(&self, stopping: bool) -> Option<End> {
        let all_finished = self
            .prompts
            .iter()
            .all(|(_, _, choices)| choices.iter().all(Choice::finished));
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
    pub(super) fn finish(mut self, end: End) {
        self.finished = true;
        let rows = Some(self.row_count());
        let events = self.events.clone();
        match end {
            End::Gone => self.load.done(rows),
            End::TimedOut => {
                self.load.done(rows);
                // What was streamed stays with the client; the error ends the stream.
                let _ = events.send(Event::Failed(EngineError::TimedOut));
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
            let _ = self.events.send(Event::Failed(EngineError::Failed));
        }
    }
}
