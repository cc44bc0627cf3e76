//! LayerNorm over the last dimension: forward, and backward from the saved mean and 1/std.

use rayon::prelude::*;

use crate::params::Norm;
use crate::simd::{dot, multiversion, sum};

/// Burn's (and PyTorch's) default epsilon.
pub const EPS: f32 = 1e-5;

/// Rows handed to one rayon task: enough work to outweigh the hand-off.
pub(crate) fn rows_per_task(width: usize) -> usize {
    (16 * 1024 / width.max(1)).max(1)
}

multiversion! {
    /// Normalises one row into `out` and returns its (mean, 1/std).
    pub fn norm_row(x: &[f32], gamma: &[f32], beta: Option<&[f32]>, out: &mut [f32]) -> (f32, f32) {
        let c = x.len() as f32;
        let mean = sum(x) / c;
        for (o, v) in out.iter_mut().zip(x) {
            *o = v - mean;
        }
        let var = dot(out, out) / c;
        let rstd = 1.0 / (var + EPS).sqrt();
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
pub fn forward(x: &[f32], p: &Norm, out: &mut [f32], mean: &mut [f32], rstd: &mut [f32]) {
    let c = p.gamma.len();
    let rows = rows_per_task(c);
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
                (*m, *r) = norm_row(x, &p.gamma, p.beta.as_deref(), o);
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

/// Backward of [`forward`]: adds `∂loss/∂x` to `dx` and the parameters' gradients to `grad`.
///
/// # Shapes
/// - dout, x, dx: `[N, C]`; mean, rstd: `[N]`
pub fn backward(
    dout: &[f32],
    x: &[f32],
    mean: &[f32],
    rstd: &[f32],
    p: &Norm,
    grad: &mut Norm,
    dx: &mut [f32],
) {
    let c = p.gamma.len();
    let rows = rows_per_task(c);
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
                        &p.gamma,
                        xhat,
                        dx,
                    );
                }
            },
        );
    // Sums over rows, in row order so that results do not depend on the thread count.
    for (i, (dout, x)) in dout.chunks_exact(c).zip(x.chunks_exact(c)).enumerate() {
        param_grads_row(
            dout,
            x,
            mean[i],
            rstd[i],
            &mut grad.gamma,
            grad.beta.as_deref_mut(),
        );
    }
}
