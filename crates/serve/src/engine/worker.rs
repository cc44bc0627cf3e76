//! The generation thread: it takes work from the queue, one item at a time, and decodes the
//! completion requests of one model together, taking in those that arrive for it meanwhile.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};

use cinder::sampling::generate::Decoder;
use tokio::sync::mpsc::UnboundedSender;

use super::error::EngineError;
use super::job::{Event, Job};
use super::load::{Claim, Load};
use super::running::{End, Running};
use crate::models::{Loaded, Models};

/// A short piece of work on a loaded model, which replies to its client itself.
pub(super) type Task = Box<dyn FnOnce(Result<&Loaded, EngineError>) + Send>;

/// What the worker is asked to do, with the client's claim on its place.
pub(super) enum Work {
    /// A completion request, whose events go to the sender.
    Complete(Job, UnboundedSender<Event>, Arc<Claim>),
    /// A task on model `model` ([`super::Queue::inspect`]).
    Inspect {
        model: String,
        task: Task,
        claim: Arc<Claim>,
    },
}

/// Starts the generation thread over `models`, decoding at most `max_rows` rows together; its
/// work goes to the sender returned. It ends when every sender is dropped.
pub(super) fn start(models: Models, load: Arc<Load>, max_rows: usize) -> mpsc::Sender<Work> {
    let (sender, inbox) = mpsc::channel();
    std::thread::Builder::new()
        .name("generation".into())
        .spawn(move || {
            Worker {
                models,
                inbox,
                waiting: VecDeque::new(),
                load,
                max_rows,
            }
            .run()
        })
        .expect("the generation thread starts");
    sender
}

/// The generation thread's state.
struct Worker {
    models: Models,
    inbox: mpsc::Receiver<Work>,
    /// Work taken from the inbox during a batch and not served by it, in the order it came:
    /// served before the inbox (a batch takes its own model's from the front, until the first
    /// of another closes it). The worker's own, so that a batch's panic loses none of it.
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
                Work::Inspect { model, task, claim } => self.inspect(task, &claim, &model, None),
                Work::Complete(job, events, claim) => {
                    if !claim.take() {
                        continue; // its client left
                    }
                    if self.load.stopping.load(Ordering::SeqCst) {
                        self.load.done(None);
                        let _ = events.send(Event::Failed(EngineError::ShuttingDown));
                        continue;
                    }
                    let get =
                        AssertUnwindSafe(|| self.models.get(&job.model).map_err(EngineError::from));
                    match std::panic::catch_unwind(get).unwrap_or(Err(EngineError::Failed)) {
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

    /// Runs `task` on model `id` (`loaded`, where a batch has it already), unless its client
    /// left.
    fn inspect(&mut self, task: Task, claim: &Claim, id: &str, loaded: Option<Arc<Loaded>>) {
        if !claim.take() {
            return; // its client left
        }
        self.load.start(0);
        let run = AssertUnwindSafe(|| {
            let model = match loaded {
                Some(model) => Ok(model),
                None => self.models.get(id).map_err(EngineError::from),
            };
            match model {
                Ok(model) => task(Ok(&model)),
                Err(e) => task(Err(e)),
            }
        });
        let _ = std::panic::catch_unwind(run); // the task's reply is dropped
        self.load.done(Some(0));
    }

    /// Decodes `first` and the requests for its model that arrive meanwhile (up to `max_rows`
    /// rows at once), until none is left. A task on its model (`/tokenize`, the page's
    /// attention maps) runs between two steps, even while a newcomer waits for rows. A request
    /// for another model, or for a newer checkpoint of this one, closes the batch to newcomers:
    /// it is served next.
    fn batch(&mut self, model: Arc<Loaded>, first: Job, events: UnboundedSender<Event>) {
        let id = first.model.clone();
        // The model's cache, made once for the most rows decoded together and kept from batch
        // to batch.
        let cache = model.cache.lock().expect("only the worker takes it").take();
        let cache = cache.unwrap_or_else(|| {
            let mib = |bytes: usize| bytes as f64 / (1 << 20) as f64;
            eprintln!(
                "model {id}: a key/value cache for {} rows, {:.1} MiB, and a copy of the head, \
                 {:.1} MiB (serve --max-batch)",
                self.max_rows,
                mib(model.gpt.cache_bytes(self.max_rows)),
                mib(model.gpt.cache_head_bytes())
            );
            model.gpt.new_cache(self.max_rows)
        });
        let mut decoder = Decoder::with_cache(&model.gpt, &model.device, cache);
        let mut running: Vec<Running> = Vec::new();
        // Taken from the queue and not yet admitted; a newcomer's claim is taken when it is
        // admitted, so that its client may still leave (and free its place) while it waits
        // for room. A newcomer waiting here is of the batch: a panic fails it with the rest.
        let mut next = Some((first, events, None));
        let mut closed = false;
        loop {
            // A task on this model (`/tokenize`, the page's attention maps) runs now, between
            // two steps, whether newcomers may join or not; the rest waits its turn.
            while let Ok(work) = self.inbox.try_recv() {
                match work {
                    Work::Inspect {
                        model: m,
                        task,
                        claim,
                    } if m == id && self.models.is_current(&id, &model) => {
                        self.inspect(task, &claim, &id, Some(model.clone()));
                    }
                    other => self.waiting.push_back(other),
                }
            }
            // Newcomers join at a token boundary, while their rows fit.
            loop {
                let (job, events, claim) = match next.take() {
                    Some(taken) => taken,
                    None if closed => break,
                    None => match self.waiting.pop_front() {
                        Some(Work::Complete(job, events, claim))
                            if job.model == id && self.models.is_current(&id, &model) =>
                        {
                            (job, events, Some(claim))
                        }
                        Some(other) => {
                            self.waiting.push_front(other); // served next
                            closed = true;
                            break;
                        }
                        None => break,
                    },
                };
                let rows: usize = running.iter().map(Running::row_count).sum();
                if !running.is_empty() && rows + job.rows() > self.max_rows {
                    next = Some((job, events, claim)); // when rows leave
                    break;
                }
                if claim.is_some_and(|claim| !claim.take()) {
                    continue; // its client left while it waited
                }
                // Admitting it, and its first pass, may take a while: the text the others have
                // waiting goes first.
                running.iter_mut().for_each(Running::flush);
                match Running::admit(job, events, &model, &self.load) {
                    Ok(Some(request)) if request.scores_only() => request.finish(End::Complete),
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
                *model.cache.lock().expect("only the worker takes it") = decoder.into_cache();
                return;
            }
            let logits = decoder.next_logits();
            let decoding = decoder.rows();
            self.load.pass(decoding);
            let v = logits.len() / decoding;
            let stopping = self.load.stopping.load(Ordering::SeqCst);
            let mut row = 0;
            let mut ended = Vec::new();
            for (i, request) in running.iter_mut().enumerate() {
                let rows = row..row + request.row_count();
                row = rows.end;
                let tokens = request.pick(&logits[rows.start * v..rows.end * v], decoding);
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
