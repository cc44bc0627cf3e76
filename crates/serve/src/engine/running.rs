//! A request being decoded in a batch: its prompts' rows, the picking of their tokens, and how
//! it ends (and tells its client so).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use cinder::sampling::generate::Picker;
use cinder::sampling::{DEFAULT_PROMPT, TokenProbs, prompt_ids, token_probs, token_text};
use cinder_data::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

use super::choice::{Choice, gap};
use super::error::EngineError;
use super::job::{Event, Job, TokenLogprob};
use super::load::Load;
use crate::models::Loaded;

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
    tokenizer: &'t Tokenizer,
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
    /// The request `job`, its prompts encoded, `Started` sent (and with `echo`, the prompts);
    /// `None` if its client left; an error (with the events' sender) if it cannot be served.
    pub(super) fn admit(
        job: Job,
        events: UnboundedSender<Event>,
        model: &'t Loaded,
        load: &Arc<Load>,
    ) -> Result<Option<Self>, (UnboundedSender<Event>, EngineError)> {
        let tokenizer = &model.tokenizer;
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
        let mut echoes = Vec::new();
        for (index, prompt) in job.prompts.iter().enumerate() {
            // An empty prompt samples from the start, as `generate` does without one; there is
            // nothing of it to echo.
            let empty = prompt.is_empty();
            let prompt = if empty { DEFAULT_PROMPT } else { prompt };
            let ids = match prompt_ids(tokenizer, prompt, false) {
                Ok(ids) => ids,
                Err(source) => return Err((events, EngineError::BadPrompt { index, source })),
            };
            let echoed = if job.echo && !empty {
                let context = model.gpt.block_size();
                if job.logprobs.is_some() && ids.len() > context {
                    let tokens = ids.len();
                    return Err((
                        events,
                        EngineError::PromptTooLong {
                            index,
                            tokens,
                            context,
                        },
                    ));
                }
                let text = tokenizer.decode(&ids);
                let logprobs = match job.logprobs {
                    Some(top) => scored(model, &ids, top),
                    None => Vec::new(),
                };
                let length = text.chars().count();
                echoes.push((index, text, logprobs));
                length
            } else {
                0
            };
            let choices = (0..job.n)
                .map(|c| Choice::new(index * job.n + c, tokenizer, &job.stop, echoed))
                .collect();
            let picker = Picker::new(job.sampling, job.seed, tokenizer.vocab_size(), &ids, job.n);
            prompts.push((ids, picker, choices));
        }
        let prompt_tokens = prompts.iter().map(|(ids, _, _)| ids.len()).sum();
        if events.send(Event::Started { prompt_tokens }).is_err() {
            return Ok(None);
        }
        for (index, text, logprobs) in echoes {
            for c in 0..job.n {
                let (index, text, logprobs) = (index * job.n + c, text.clone(), logprobs.clone());
                if events
                    .send(Event::Text {
                        index,
                        text,
                        written: 0,
                        logprobs,
                    })
                    .is_err()
                {
                    return Ok(None);
                }
            }
        }
        load.start(job.rows());
        Ok(Some(Self {
            job,
            tokenizer,
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

    /// Whether it generates no token (`max_tokens` 0, with `echo`): it never joins a batch.
    pub(super) fn scores_only(&self) -> bool {
        self.job.max_tokens == 0
    }

    /// Picks each row's next token from `logits` (this request's rows), as `generate` does,
    /// and sends what it makes of the choices' text, each at most as often as `decoding` rows
    /// in all allow ([`gap`]). Returns the tokens, row by row.
    pub(super) fn pick(&mut self, logits: &[f32], decoding: usize) -> Vec<u32> {
        let least = gap(decoding);
        let per_prompt = logits.len() / self.prompts.len();
        let v = logits.len() / self.row_count();
        let vocab = self.tokenizer.vocab_size().min(v);
        let mut tokens = Vec::with_capacity(self.row_count());
        for ((_, picker, choices), logits) in self.prompts.iter_mut().zip(logits.chunks(per_prompt))
        {
            let picked = picker.pick(logits);
            for ((choice, token), row) in choices.iter_mut().zip(picked).zip(logits.chunks(v)) {
                tokens.push(token);
                if !choice.finished() {
                    self.completion_tokens += 1;
                    let written = self.completion_tokens;
                    let logprob = self
                        .job
                        .logprobs
                        .map(|top| shown(self.tokenizer, &token_probs(&row[..vocab], token, top)));
                    self.gone |= choice
                        .push(token, logprob, written, least, &self.events)
                        .is_err();
                }
            }
        }
        self.steps += 1;
        tokens
    }

    /// Sends every choice's text not sent yet (it waits for the gap: [`gap`]): before the
    /// worker stops for other work, and before an error ends the request.
    pub(super) fn flush(&mut self) {
        let written = self.completion_tokens;
        for (_, _, choices) in &mut self.prompts {
            for choice in choices {
                self.gone |= choice.flush(written, &self.events).is_err();
            }
        }
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
                // What was streamed stays with the client, with the text not sent yet; the
                // error ends the stream.
                self.flush();
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

/// A token's log-probabilities as a choice shows them: the top tokens, and the token itself
/// among them (OpenAI's `top_logprobs` hold up to `logprobs + 1`).
fn shown(tokenizer: &Tokenizer, probs: &TokenProbs) -> TokenLogprob {
    let mut top: Vec<(String, f32)> = probs
        .top
        .iter()
        .map(|&(t, lp)| (token_text(tokenizer, t), lp))
        .collect();
    if probs.top.iter().all(|&(t, _)| t != probs.token) {
        top.push((token_text(tokenizer, probs.token), probs.logprob));
    }
    TokenLogprob {
        text: token_text(tokenizer, probs.token),
        logprob: Some(probs.logprob),
        top,
        offset: 0,
    }
}

/// The prompt `ids`' tokens with their log-probabilities under `model`, from one forward pass
/// over the whole prompt (at most the context): the first token has none. Offsets are where
/// each token's text starts in the prompt's.
fn scored(model: &Loaded, ids: &[u32], top: usize) -> Vec<TokenLogprob> {
    let (t, v) = (ids.len(), model.gpt.vocab_size());
    let vocab = model.tokenizer.vocab_size().min(v);
    let input = cinder::data::ids_tensor(ids, [1, t], &model.device);
    let logits: Vec<f32> = model
        .gpt
        .forward(input)
        .into_data()
        .try_to_vec()
        .expect("logits are f32");
    let mut stream = cinder_data::TextStream::new(&model.tokenizer);
    let mut offset = 0;
    let mut tokens = Vec::with_capacity(t);
    for (i, &id) in ids.iter().enumerate() {
        let mut token = match i {
            0 => TokenLogprob {
                text: token_text(&model.tokenizer, id),
                logprob: None,
                top: Vec::new(),
                offset: 0,
            },
            _ => shown(
                &model.tokenizer,
                &token_probs(&logits[(i - 1) * v..(i - 1) * v + vocab], id, top),
            ),
        };
        // A byte of an earlier token that never became a character: its U+FFFD comes first.
        let (earlier, text) = stream.push_split(id);
        token.offset = offset + earlier;
        offset += text.chars().count();
        tokens.push(token);
    }
    tokens
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.load.done(Some(self.row_count()));
            self.flush();
            let _ = self.events.send(Event::Failed(EngineError::Failed));
        }
    }
}
