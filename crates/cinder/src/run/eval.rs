//! Measuring a model: mean loss over a fixed set of batches of a split.

use burn::prelude::*;
use cinder_data::{Batch, Batcher, Split, Splits};
use cinder_model::Gpt;

use crate::data::batch_tensors;
use crate::run::pool::in_pool;

/// The random stream of evaluation batches (training uses stream 0).
const EVAL_STREAM: u64 = 1;

/// Mean loss of `model` over `n_batches` batches of `split`, in inference mode (no dropout, no
/// gradient tape). The batches are the same at every evaluation, so losses are comparable
/// across a run and across a resume.
///
/// `keep_going(done)` is called after each batch; when it returns false the evaluation is
/// abandoned and `None` returned (a Ctrl-C should not wait for hundreds of batches).
pub fn mean_loss(
    model: &Gpt,
    splits: &Splits,
    split: Split,
    batcher: &Batcher,
    n_batches: usize,
    device: &Device,
    mut keep_going: impl FnMut(usize) -> bool,
) -> Option<f32> {
    let mut total: Option<Tensor<1>> = None;
    for (i, batch) in eval_batches(splits, split, batcher, n_batches).enumerate() {
        let (x, y) = batch_tensors(&batch, device);
        let loss = in_pool(|| model.loss(x, y, None));
        total = Some(match total {
            Some(t) => t + loss,
            None => loss,
        });
        if !keep_going(i + 1) {
            return None;
        }
    }
    Some(total?.into_scalar::<f32>() / n_batches as f32)
}

/// The batches [`mean_loss`] evaluates on: the same at every evaluation.
pub fn eval_batches<'a>(
    splits: &'a Splits,
    split: Split,
    batcher: &'a Batcher,
    n_batches: usize,
) -> impl Iterator<Item = Batch> + 'a {
    let tokens = splits.get(split);
    (0..n_batches as u64).map(move |i| batcher.batch(tokens, split, EVAL_STREAM, i))
}

/// Loss of a model over a whole text.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TextLoss {
    /// Mean negative log-likelihood per predicted character, in nats.
    pub loss: f64,
    /// Characters predicted.
    pub predicted: usize,
}

impl TextLoss {
    /// `exp(loss)`: the number of equally likely characters the model hesitates between.
    pub fn perplexity(&self) -> f64 {
        self.loss.exp()
    }

    /// The loss in bits: what a compressor driven by the model would spend per token (per
    /// character for a character model).
    pub fn bits_per_token(&self) -> f64 {
        self.loss / std::f64::consts::LN_2
    }
}

/// Mean loss over `ids` cut into consecutive windows of `block_size` predictions (the few
/// tokens after the last whole window are left out), `batch_size` windows at a time; a text
/// shorter than that is one window of its own length. Calls `progress(done, total)` in windows.
/// Needs at least 2 ids.
pub fn text_loss(
    model: &Gpt,
    ids: &[u32],
    batch_size: usize,
    device: &Device,
    mut progress: impl FnMut(usize, usize),
) -> TextLoss {
    let windows = Windows::of(model, ids);
    let mut total = 0.0f64;
    for (first, n) in windows.batches(batch_size) {
        let (x, y) = windows.tensors(first, n, device);
        let mean = in_pool(|| model.loss(x, y, None).into_scalar::<f32>());
        total += f64::from(mean) * n as f64;
        progress(first + n, windows.count);
    }
    TextLoss {
        loss: total / windows.count.max(1) as f64,
        predicted: windows.count * windows.block,
    }
}

/// The surprise (`-log p`, in nats) of each token [`text_loss`] predicts, in order: its mean is
/// [`text_loss`]'s loss, to float rounding. At most `batch_size` windows at a time, and fewer
/// when their logits would pass [`LOGITS_AT_ONCE`]; only each target's log-probability comes
/// back to the host.
pub fn text_surprise(
    model: &Gpt,
    ids: &[u32],
    batch_size: usize,
    device: &Device,
    mut progress: impl FnMut(usize, usize),
) -> Vec<f32> {
    let windows = Windows::of(model, ids);
    let per_window = windows.block * model.vocab_size();
    let batch_size = batch_size.min(LOGITS_AT_ONCE / per_window).max(1);
    let mut surprise = Vec::with_capacity(windows.count * windows.block);
    for (first, n) in windows.batches(batch_size) {
        let (x, y) = windows.tensors(first, n, device);
        let logp = in_pool(|| {
            burn::tensor::activation::log_softmax(model.forward(x), 2).gather(2, y.unsqueeze_dim(2))
        });
        let logp: Vec<f32> = logp
            .into_data()
            .try_to_vec()
            .expect("log-probabilities are f32");
        surprise.extend(logp.iter().map(|&l| -l));
        progress(first + n, windows.count);
    }
    surprise
}

/// Logits [`text_surprise`] holds at once, at most (256 MB of them; a GPT-2's window of 1,024
/// positions over 50,304 tokens is 206 MB, so it takes one window at a time).
const LOGITS_AT_ONCE: usize = 1 << 26;

/// `ids` cut into consecutive windows of `block` predictions each.
struct Windows<'a> {
    ids: &'a [u32],
    block: usize,
    count: usize,
}

impl<'a> Windows<'a> {
    fn of(model: &Gpt, ids: &'a [u32]) -> Self {
        let block = model.block_size().min(ids.len().saturating_sub(1));
        assert!(block > 0, "measuring a text needs at least 2 ids");
        Self {
            ids,
            block,
            count: (ids.len() - 1) / block,
        }
    }

    /// The first window and the number of windows of each batch of `batch_size`.
    fn batches(&self, batch_size: usize) -> impl Iterator<Item = (usize, usize)> + use<> {
        let count = self.count;
        (0..count)
            .step_by(batch_size)
            .map(move |first| (first, batch_size.min(count - first)))
    }

    /// Inputs and targets `[n, block]` of windows `first..first + n`.
    fn tensors(&self, first: usize, n: usize, device: &Device) -> (Tensor<2, Int>, Tensor<2, Int>) {
        let b = self.block;
        let x: Vec<u32> = (first..first + n)
            .flat_map(|w| &self.ids[w * b..(w + 1) * b])
            .copied()
            .collect();
        let y: Vec<u32> = (first..first + n)
            .flat_map(|w| &self.ids[w * b + 1..(w + 1) * b + 1])
            .copied()
            .collect();
        (
            crate::data::ids_tensor(&x, [n, b], device),
            crate::data::ids_tensor(&y, [n, b], device),
        )
    }
}
