//! A training step's forward and backward passes, data-parallel: the batch is cut into one
//! share of sequences per thread, each thread runs the whole model on its share with its own
//! activations and gradients, and the gradients are summed at the end. One hand-off per step
//! instead of one per operation; every kernel inside runs on its own thread.

use std::ops::Range;

use rayon::prelude::*;

use crate::gpt::{Tape, backward, forward};
use crate::params::Params;

/// Buffers for steps on batches of `batch` sequences of `seq` tokens.
pub struct Step {
    seq: usize,
    /// Each share's sequences.
    shares: Vec<Range<usize>>,
    tapes: Vec<Tape>,
    /// Each share's gradients; the first also receives the sum.
    grads: Vec<Params>,
}

impl Step {
    /// Splits batches into `shares` parts (at most one per sequence).
    pub fn new(p: &Params, batch: usize, seq: usize, shares: usize) -> Self {
        let n = shares.clamp(1, batch.max(1));
        let shares: Vec<Range<usize>> =
            (0..n).map(|i| i * batch / n..(i + 1) * batch / n).collect();
        Self {
            seq,
            tapes: shares
                .iter()
                .map(|r| Tape::new(p.dims, r.len(), seq))
                .collect(),
            grads: shares.iter().map(|_| Params::zeros(p.dims)).collect(),
            shares,
        }
    }

    /// Zeroes the gradients before a new step.
    pub fn zero_grad(&mut self) {
        self.grads.par_iter_mut().for_each(Params::fill_zero);
    }

    /// Forward and backward over one batch (`[B, T]` ids, row-major): returns the mean loss and
    /// adds the gradient of `scale` times it to the step's gradients.
    pub fn accumulate(&mut self, p: &Params, inputs: &[u32], targets: &[u32], scale: f32) -> f32 {
        self.run(p, inputs, targets, Some(scale))
    }

    /// The mean loss over one batch, forward passes only (for evaluation).
    pub fn loss(&mut self, p: &Params, inputs: &[u32], targets: &[u32]) -> f32 {
        self.run(p, inputs, targets, None)
    }

    /// Each share's forward pass, and its backward pass for the loss times `backward_scale` if
    /// given; returns the batch's mean loss.
    fn run(
        &mut self,
        p: &Params,
        inputs: &[u32],
        targets: &[u32],
        backward_scale: Option<f32>,
    ) -> f32 {
        let t = self.seq;
        let total = inputs.len() as f32;
        let losses: Vec<f32> = self
            .shares
            .par_iter()
            .zip(self.tapes.par_iter_mut())
            .zip(self.grads.par_iter_mut())
            .map(|((r, tape), grads)| {
                let ids = r.start * t..r.end * t;
                let (x, y) = (&inputs[ids.clone()], &targets[ids]);
                let weight = x.len() as f32 / total;
                let loss = forward(p, x, y, tape);
                if let Some(scale) = backward_scale {
                    backward(p, x, y, scale * weight, tape, grads);
                }
                loss * weight
            })
            .collect();
        losses.iter().sum()
    }

    /// The step's gradients: the shares' added into the first, in share order. Call once per
    /// step, after its batches.
    pub fn gradients(&mut self) -> &mut Params {
        let (first, rest) = self.grads.split_first_mut().expect("at least one share");
        for g in rest.iter() {
            first.add_assign(g);
        }
        first
    }
}
