//! The tied output head and the mean cross-entropy of the next token.

use rayon::prelude::*;

use crate::matmul::{Mat, matmul};
use crate::simd::{exp_shifted_sum, max, multiversion};

multiversion! {
    /// Softmax of one row of logits, in place; returns `-ln p[target]`.
    pub fn softmax_nll_row(row: &mut [f32], target: usize) -> f32 {
        let max = max(row);
        let logit = row[target];
        let total = exp_shifted_sum(row, max);
        let inv = 1.0 / total;
        for v in row.iter_mut() {
            *v *= inv;
        }
        -(logit - max - total.ln())
    }
}

/// Logits of the tied head, `out = x wteᵀ` (the transpose as strides: no copy of `wte`).
///
/// # Shapes
/// - x: `[N, C]`, wte: `[V, C]` -> out: `[N, V]`
pub fn logits(x: &[f32], wte: &[f32], c: usize, out: &mut [f32]) {
    let (n, v) = (x.len() / c, wte.len() / c);
    matmul(out, Mat::new(x, n, c), Mat::new(wte, v, c).t(), false);
}

/// Logits `x wteᵀ`, turned into probabilities in place in `probs`; returns the mean negative
/// log-likelihood of `targets`.
///
/// # Shapes
/// - x: `[N, C]`, wte: `[V, C]`, targets: `[N]` -> probs: `[N, V]`
pub fn forward(x: &[f32], wte: &[f32], targets: &[u32], probs: &mut [f32]) -> f32 {
    let n = targets.len();
    let v = probs.len() / n;
    let c = x.len() / n;
    matmul(probs, Mat::new(x, n, c), Mat::new(wte, v, c).t(), false);
    let mut nll = vec![0.0f32; n];
    probs
        .par_chunks_mut(v)
        .zip(nll.par_iter_mut())
        .zip(targets.par_iter())
        .for_each(|((row, l), &t)| *l = softmax_nll_row(row, t as usize));
    // Summed in f64, in order: the mean does not depend on threads.
    (nll.iter().map(|&l| f64::from(l)).sum::<f64>() / n as f64) as f32
}

/// Backward of [`forward`] for the loss scaled by `scale`: turns `probs` into `∂loss/∂logits`
/// in place, and writes `∂loss/∂x` to `dx` and the head's gradient to `dwte`.
pub fn backward(
    x: &[f32],
    wte: &[f32],
    targets: &[u32],
    scale: f32,
    probs: &mut [f32],
    dx: &mut [f32],
    dwte: &mut [f32],
) {
    let n = targets.len();
    let v = probs.len() / n;
    let c = x.len() / n;
    let k = scale / n as f32;
    probs
        .par_chunks_mut(v)
        .zip(targets.par_iter())
        .for_each(|(row, &t)| {
            row[t as usize] -= 1.0;
            row.iter_mut().for_each(|g| *g *= k);
        });
    let dlogits = Mat::new(probs, n, v);
    matmul(dx, dlogits, Mat::new(wte, v, c), false); // (N, C)
    matmul(dwte, dlogits.t(), Mat::new(x, n, c), false); // (V, C)
}
