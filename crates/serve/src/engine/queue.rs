//! The sending end of the worker's queue, and admission: a request is taken while the batch has
//! room for it and nobody waits, or while fewer than the queue's capacity wait; else it is
//! refused at once.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::oneshot;

use super::error::EngineError;
use super::job::{Event, Job};
use super::load::{Claim, Load, Place};
use super::worker::{self, Work};
use crate::models::{Loaded, Models};

/// The sending end of the worker's queue.
#[derive(Clone)]
pub struct Queue {
    work: std::sync::mpsc::Sender<Work>,
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
        let load = Arc::new(Load::default());
        let max_rows = max_rows.max(1);
        Self {
            work: worker::start(models, load.clone(), max_rows),
            capacity,
            max_rows,
            load,
        }
    }

    /// Queues `job`, whose events go to `events`; refused when `capacity` requests wait
    /// already. The place is the client's until the worker takes the request.
    pub fn submit(&self, job: Job, events: UnboundedSender<Event>) -> Result<Place, EngineError> {
        self.enqueue(job.rows(), |claim| Work::Complete(job, events, claim))
    }

    /// What `task` makes of model `model` (a short piece of work: the page's attention maps,
    /// tokenizing), run by the worker, which owns the loaded models, and queued as a
    /// completion is. A task that panics fails alone.
    pub async fn inspect<T: Send + 'static>(
        &self,
        model: String,
        task: impl FnOnce(&Loaded) -> Result<T, EngineError> + Send + 'static,
    ) -> Result<T, EngineError> {
        let (reply, answer) = oneshot::channel();
        let task = Box::new(move |loaded: Result<&Loaded, EngineError>| {
            let _ = reply.send(loaded.and_then(task));
        });
        let _place = self.enqueue(0, |claim| Work::Inspect { model, task, claim })?;
        // The reply is dropped unsent only if the task panicked.
        answer.await.unwrap_or(Err(EngineError::Failed))
    }

    /// Takes `rows` rows' request if the batch has room for it now and nobody waits, or else
    /// fewer than `capacity` wait.
    fn enqueue(
        &self,
        rows: usize,
        work: impl FnOnce(Arc<Claim>) -> Work,
    ) -> Result<Place, EngineError> {
        let load = &self.load;
        let taken = load
            .pending
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |p| {
                let waiting = p.saturating_sub(load.active());
                let fits = load.rows.load(Ordering::SeqCst) + rows <= self.max_rows;
                (waiting < self.capacity || (waiting == 0 && fits)).then_some(p + 1)
            });
        if let Err(p) = taken {
            let waiting = p.saturating_sub(load.active());
            return Err(EngineError::QueueFull { waiting });
        }
        let claim = Arc::new(Claim::default());
        let place = Place::new(claim.clone(), load.clone());
        if self.work.send(work(claim)).is_err() {
            drop(place); // frees the place
            return Err(EngineError::WorkerGone);
        }
        Ok(place)
    }
}
