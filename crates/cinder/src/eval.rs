//! Measuring a model: mean loss over a fixed set of batches of a split.

use burn::prelude::*;
use cinder_data::{Batcher, Split, Splits};
use cinder_model::Gpt;

use crate::data::batch_tensors;
use crate::loss::cross_entropy;

/// The random stream of evaluation batches (training uses stream 0).
const EVAL_STREAM: u64 = 1;

/// Mean loss of `model` over `n_batches` batches of `split`, in inference mode (no dropout, no
/// gradient tape). The batches are the same at every evaluation, so losses are comparable
/// across a run and across a resume.
pub fn mean_loss(
    model: &Gpt,
    splits: &Splits,
    split: Split,
    batcher: &Batcher,
    n_batches: usize,
    device: &Device,
) -> f32 {
    mean_loss_with(model, splits, split, batcher, n_batches, device, |_| {})
}

/// [`mean_loss`], calling `progress` with the number of batches done after each one.
pub fn mean_loss_with(
    model: &Gpt,
    splits: &Splits,
    split: Split,
    batcher: &Batcher,
    n_batches: usize,
    device: &Device,
    mut progress: impl FnMut(usize),
) -> f32 {
    let tokens = splits.get(split);
    let mut total: Option<Tensor<1>> = None;
    for i in 0..n_batches {
        let batch = batcher.batch(tokens, split, EVAL_STREAM, i as u64);
        let (x, y) = batch_tensors(&batch, device);
        let loss = cross_entropy(model.forward(x), y);
        total = Some(match total {
            Some(t) => t + loss,
            None => loss,
        });
        progress(i + 1);
    }
    let total = total.map_or(f32::NAN, |t| t.into_scalar::<f32>());
    total / n_batches as f32
}
