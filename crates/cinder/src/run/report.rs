//! What a training run reports as it goes: a report of each step and of each evaluation, and
//! the [`Observer`] that receives them. Kept apart from the loop ([`crate::run::trainer`]) so
//! that the observers (metrics file, samples file, progress, loss plot) depend on what is
//! reported, not on the loop that reports it.

use std::path::Path;

use cinder_data::Split;

use crate::storage::checkpoint::ValTrend;

/// What the loop reports as it goes; the binary draws it (progress bar, log lines, metrics file).
pub trait Observer {
    /// After every optimiser step, with the evaluation that followed it, if one did.
    fn step(&mut self, _s: &StepReport, _eval: Option<&EvalReport>) {}
    /// After a checkpoint is written.
    fn checkpoint(&mut self, _kind: &str, _path: &Path, _iter: u64) {}
    /// While evaluating: batches done of the total for one split.
    fn eval_progress(&mut self, _split: Split, _done: usize, _total: usize) {}
}

/// Nothing reported.
impl Observer for () {}

/// Both observers, in turn.
impl<A: Observer, B: Observer> Observer for (A, B) {
    fn step(&mut self, s: &StepReport, eval: Option<&EvalReport>) {
        self.0.step(s, eval);
        self.1.step(s, eval);
    }
    fn checkpoint(&mut self, kind: &str, path: &Path, iter: u64) {
        self.0.checkpoint(kind, path, iter);
        self.1.checkpoint(kind, path, iter);
    }
    fn eval_progress(&mut self, split: Split, done: usize, total: usize) {
        self.0.eval_progress(split, done, total);
        self.1.eval_progress(split, done, total);
    }
}

/// One optimiser step.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    /// The iteration that just ran (from 0).
    pub iter: u64,
    pub loss: f32,
    pub lr: f64,
    /// Seconds this step took.
    pub seconds: f64,
    pub tokens: usize,
    /// Passes over the training split so far, this step included (tokens seen over the
    /// split's tokens).
    pub epochs: f64,
    /// Seconds of each phase of the step, summed over its micro-batches.
    pub phases: Phases,
}

/// Where a step's time goes (`bench breakdown` reports the medians).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Phases {
    /// Drawing the batches and making their tensors.
    pub batch: f64,
    /// The forward pass and the loss, read back.
    pub forward_loss: f64,
    /// The backward pass and the accumulation of gradients.
    pub backward: f64,
    /// Clipping and the optimizer's update.
    pub clip_adamw: f64,
}

impl Phases {
    /// Each phase's name (as in `bench breakdown`'s JSON keys, less `_ms`) and seconds.
    pub fn named(&self) -> [(&'static str, f64); 4] {
        [
            ("batch", self.batch),
            ("forward_loss", self.forward_loss),
            ("backward", self.backward),
            ("clip_adamw", self.clip_adamw),
        ]
    }
}

/// One evaluation of both splits.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalReport {
    /// Iterations completed when evaluated.
    pub iter: u64,
    pub train_loss: f32,
    pub val_loss: f32,
    /// Whether this is the best validation loss so far.
    pub improved: bool,
    /// How validation has gone, this evaluation included.
    pub trend: ValTrend,
    /// What the model writes now (`sample_tokens` of it; none when that is 0).
    pub sample: Option<String>,
}
