//! RMSNorm without a gain over the last dimension, `y = x / sqrt(mean(x²) + eps)`: forward, and
//! backward from the saved output and 1/rms. (The nanoGPT speedrun's norm: before each block's
//! halves, after the embedding, before the head, and over each head's queries and keys.)

use crate::rows;
use crate::simd::{dot, multiversion};
use rayon::prelude::*;

multiversion! {
    /// Normalises one row into `out` and returns its 1/rms.
    pub fn norm_row(x: &[f32], eps: f32, out: &mut [f32]) -> f32 {
        let rstd = 1.0 / (dot(x, x) / x.len() as f32 + eps).sqrt();
        for (o, v) in out.iter_mut().zip(x) {
            *o = v * rstd;
        }
        rstd
    }
}

multiversion! {
    /// One row of the backward pass: `dx = rstd (dy - y mean(dy y))`, with `y` the row's output.
    pub fn backward_row(dy: &[f32], y: &[f32], rstd: f32, dx: &mut [f32]) {
        let m = dot(dy, y) / y.len() as f32;
        for ((o, d), v) in dx.iter_mut().zip(dy).zip(y) {
            *o = rstd * (d - v * m);
        }
    }
}

/// `out = RMSNorm(x)` row by row; the rows' 1/rms go to `rstd`.
///
/// # Shapes
/// - x, out: `[N, C]`; rstd: `[N]`
pub fn forward(x: &[f32], c: usize, eps: f32, out: &mut [f32], rstd: &mut [f32]) {
    let rows = rows::per_task(c);
    out.par_chunks_mut(c * rows)
        .zip(x.par_chunks(c * rows))
        .zip(rstd.par_chunks_mut(rows))
        .for_each(|((out, x), rstd)| {
            for ((o, x), r) in out.chunks_exact_mut(c).zip(x.chunks_exact(c)).zip(rstd) {
                *r = norm_row(x, eps, o);
            }
        });
}

/// Backward of [`forward`]: writes `∂loss/∂x` to `dx`, from the forward's output `y`.
///
/// # Shapes
/// - dy, y, dx: `[N, C]`; rstd: `[N]`
pub fn backward(dy: &[f32], y: &[f32], rstd: &[f32], c: usize, dx: &mut [f32]) {
    let rows = rows::per_task(c);
    dx.par_chunks_mut(c * rows)
        .zip(dy.par_chunks(c * rows).zip(y.par_chunks(c * rows)))
        .zip(rstd.par_chunks(rows))
        .for_each(|((dx, (dy, y)), rstd)| {
            for (((dx, dy), y), &r) in dx
                .chunks_exact_mut(c)
                .zip(dy.chunks_exact(c))
                .zip(y.chunks_exact(c))
                .zip(rstd)
            {
                backward_row(dy, y, r, dx);
            }
        });
}
