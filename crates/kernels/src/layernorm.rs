//! LayerNorm over the last dimension: forward, and backward from the saved mean and 1/std.

use rayon::prelude::*;

use crate::rows;
use crate::simd::{add_assign, dot, multiversion, sum};

/// A LayerNorm's parameters: gain and optional shift, `[C]` each, and its epsilon.
#[derive(Debug, Clone, Copy)]
pub struct Norm<'a> {
    pub gamma: &'a [f32],
    pub beta: Option<&'a [f32]>,
    pub eps: f32,
}

multiversion! {
    /// Normalises one row into `out` and returns its (mean, 1/std).
    pub fn norm_row(x: &[f32], gamma: &[f32], beta: Option<&[f32]>, eps: f32, out: &mut [f32]) -> (f32, f32) {
        let c = x.len() as f32;
        let mean = sum(x) / c;
        for (o, v) in out.iter_mut().zip(x) {
            *o = v - mean;
        }
        let var = dot(out, out) / c;
        let rstd = 1.0 / (var + eps).sqrt();
        match beta {
            Some(beta) => {
                for ((o, g), b) in out.iter_mut().zip(gamma).zip(beta) {
                    *o = *o * rstd * g + b;
                }
            }
            None => {
                for (o, g) in out.iter_mut().zip(gamma) {
                    *o = *o * rstd * g;
                }
            }
        }
        (mean, rstd)
    }
}

/// `out = LayerNorm(x)` row by row; the rows' means and 1/stds go to `mean` and `rstd`.
///
/// # Shapes
/// - x, out: `[N, C]`; mean, rstd: `[N]`
pub fn forward(x: &[f32], p: Norm, out: &mut [f32], mean: &mut [f32], rstd: &mut [f32]) {
    let c = p.gamma.len();
    let rows = rows::per_task(c);
    out.par_chunks_mut(c * rows)
        .zip(x.par_chunks(c * rows))
        .zip(mean.par_chunks_mut(rows).zip(rstd.par_chunks_mut(rows)))
        .for_each(|((out, x), (mean, rstd))| {
            for (((o, x), m), r) in out
                .chunks_exact_mut(c)
                .zip(x.chunks_exact(c))
                .zip(mean.iter_mut())
                .zip(rstd.iter_mut())
            {
                (*m, *r) = norm_row(x, p.gamma, p.beta, p.eps, o);
            }
        });
}

multiversion! {
    /// One row of the backward pass: `dx += ∂loss/∂x`, with `xhat` a scratch row.
    pub fn backward_row(
        dout: &[f32],
        x: &[f32],
        mean: f32,
        rstd: f32,
        gamma: &[f32],
        xhat: &mut [f32],
        dx: &mut [f32],
    ) {
        let c = x.len() as f32;
        for (h, v) in xhat.iter_mut().zip(x) {
            *h = (v - mean) * rstd;
        }
        // dnorm = dout * gamma; dx = (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)) * rstd
        let m1 = dot(dout, gamma) / c;
        for ((h, d), g) in xhat.iter_mut().zip(dout).zip(gamma) {
            *h *= d * g; // now dnorm * xhat
        }
        let m2 = sum(xhat) / c;
        for (((o, d), g), v) in dx.iter_mut().zip(dout).zip(gamma).zip(x) {
            let h = (v - mean) * rstd;
            *o += (d * g - m1 - h * m2) * rstd;
        }
    }
}

multiversion! {
    /// `dgamma += dout * xhat`, `dbeta += dout` for one row.
    pub fn param_grads_row(
        dout: &[f32],
        x: &[f32],
        mean: f32,
        rstd: f32,
        dgamma: &mut [f32],
        dbeta: Option<&mut [f32]>,
    ) {
        for ((g, d), v) in dgamma.iter_mut().zip(dout).zip(x) {
            *g += d * (v - mean) * rstd;
        }
        if let Some(db) = dbeta {
            for (b, d) in db.iter_mut().zip(dout) {
                *b += d;
            }
        }
    }
}

/// Backward of [`forward`]: adds `∂loss/∂x` to `dx`, `∂loss/∂gamma` to `dgamma` and
/// `∂loss/∂beta` to `dbeta`.
///
/// # Shapes
/// - dout, x, dx: `[N, C]`; mean, rstd: `[N]`; dgamma, dbeta: `[C]`
#[allow(clippy::too_many_arguments)]
pub fn backward(
    dout: &[f32],
    x: &[f32],
    mean: &[f32],
    rstd: &[f32],
    gamma: &[f32],
    dgamma: &mut [f32],
    dbeta: Option<&mut [f32]>,
    dx: &mut [f32],
) {
    let c = gamma.len();
    let rows = rows::per_task(c);
    dx.par_chunks_mut(c * rows)
        .zip(dout.par_chunks(c * rows).zip(x.par_chunks(c * rows)))
        .zip(mean.par_chunks(rows).zip(rstd.par_chunks(rows)))
        .for_each_init(
            || vec![0.0; c],
            |xhat, ((dx, (dout, x)), (mean, rstd))| {
                for (i, dx) in dx.chunks_exact_mut(c).enumerate() {
                    let row = i * c..(i + 1) * c;
                    backward_row(
                        &dout[row.clone()],
                        &x[row],
                        mean[i],
                        rstd[i],
                        gamma,
                        xhat,
                        dx,
                    );
                }
            },
        );
    // Sums over rows, block by block in order (the same on any thread count).
    let mut both = vec![0.0f32; 2 * c];
    rows::sum(dout, c, &mut both, |first, dout, acc| {
        let (dg, db) = acc.split_at_mut(c);
        for (i, dout) in dout.chunks_exact(c).enumerate() {
            let r = first + i;
            let x = &x[r * c..(r + 1) * c];
            param_grads_row(dout, x, mean[r], rstd[r], dg, Some(db));
        }
    });
    add_assign(dgamma, &both[..c]);
    if let Some(dbeta) = dbeta {
        add_assign(dbeta, &both[c..]);
    }
}
