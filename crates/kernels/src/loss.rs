//! The output head (tied to the token embedding, or a matrix of its own of the same shape), the
//! optional soft-cap of its logits, and the mean cross-entropy of the next token.

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

/// `cap · tanh(z / cap)` of every logit `z` of `logits`, in place (the soft-cap, when `cap > 0`);
/// the derivatives `1 - tanh²` go to `slopes` when it is not empty.
///
/// # Shapes
/// - logits: `[N, V]`; slopes: `[N, V]` or `[0]`
pub fn soft_cap(logits: &mut [f32], cap: f32, slopes: &mut [f32]) {
    if cap <= 0.0 {
        return;
    }
    logits.par_chunks_mut(ROWS).for_each(|z| {
        for z in z.iter_mut() {
            *z = cap * (*z / cap).tanh();
        }
    });
    if !slopes.is_empty() {
        slopes
            .par_chunks_mut(ROWS)
            .zip(logits.par_chunks(ROWS))
            .for_each(|(d, z)| {
                for (d, z) in d.iter_mut().zip(z) {
                    let t = z / cap;
                    *d = 1.0 - t * t;
                }
            });
    }
}

/// Elements per rayon task of the soft-cap.
const ROWS: usize = 16 * 1024;

/// Logits of the head, `out = x · head`, soft-capped at `cap` when `cap > 0`; `head` is the
/// weight `[V, C]` transposed (`Mat::new(w, v, c).t()`: no copy), or a copy laid out `[C, V]`.
/// Given the copy, a row's logits are the same bits whatever rows are beside it; given the
/// weight transposed as strides, gemm sums a row alone, or among a few, in another order than
/// among many (from 8 rows at a vocabulary of 65, from 2 at GPT-2's: BENCHMARKS.md section 37).
///
/// # Shapes
/// - x: `[N, C]`, head: `[C, V]` -> out: `[N, V]`
pub fn logits(x: &[f32], head: Mat, cap: f32, out: &mut [f32]) {
    let c = head.rows;
    matmul(out, Mat::new(x, x.len() / c.max(1), c), head, false);
    soft_cap(out, cap, &mut []);
}

/// Logits `x wᵀ`, soft-capped at `cap` (when `cap > 0`, the derivatives going to `slopes`) and
/// turned into probabilities in place in `probs`; returns the mean negative log-likelihood of
/// `targets`.
///
/// # Shapes
/// - x: `[N, C]`, w: `[V, C]`, targets: `[N]` -> probs: `[N, V]`; slopes: `[N, V]`, or `[0]`
///   without a cap
pub fn forward(
    x: &[f32],
    w: &[f32],
    targets: &[u32],
    cap: f32,
    probs: &mut [f32],
    slopes: &mut [f32],
) -> f32 {
    let n = targets.len();
    let v = probs.len() / n;
    let c = x.len() / n;
    matmul(probs, Mat::new(x, n, c), Mat::new(w, v, c).t(), false);
    soft_cap(probs, cap, slopes);
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
/// in place (through the soft-cap's `slopes`, when not empty), and writes `∂loss/∂x` to `dx` and
/// the head's gradient to `dw`.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    x: &[f32],
    w: &[f32],
    targets: &[u32],
    scale: f32,
    slopes: &[f32],
    probs: &mut [f32],
    dx: &mut [f32],
    dw: &mut [f32],
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
    if !slopes.is_empty() {
        probs
            .par_chunks_mut(ROWS)
            .zip(slopes.par_chunks(ROWS))
            .for_each(|(g, d)| g.iter_mut().zip(d).for_each(|(g, d)| *g *= d));
    }
    let dlogits = Mat::new(probs, n, v);
    matmul(dx, dlogits, Mat::new(w, v, c), false); // (N, C)
    matmul(dw, dlogits.t(), Mat::new(x, n, c), false); // (V, C)
}
