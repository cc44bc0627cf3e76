//! AdamW's update of one parameter tensor, and the sums of squares of global-norm clipping:
//! the same arithmetic as Burn's `AdamW` (bias correction folded into the step size and the
//! epsilon), in one pass over the parameter, its gradient and its two moments.

use rayon::prelude::*;

use crate::simd::{dot, multiversion};

/// Elements per rayon task.
const CHUNK: usize = 32 * 1024;

/// The constants of one update, shared by all elements of a tensor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Update {
    pub beta_1: f32,
    pub beta_2: f32,
    /// Bias-corrected step direction = m * combined / (sqrt(v) + eps_hat).
    pub combined: f32,
    pub eps_hat: f32,
    pub lr: f32,
    /// `1 - lr * weight_decay` (1 for parameters without decay).
    pub keep: f32,
    /// The gradient is multiplied by this first (global-norm clipping's coefficient, or 1).
    pub grad_scale: f32,
}

impl Update {
    /// The update of step `time` (from 1) with learning rate `lr`.
    pub fn new(
        (beta_1, beta_2, epsilon): (f32, f32, f32),
        weight_decay: f32,
        lr: f64,
        time: usize,
        grad_scale: f32,
    ) -> Self {
        let t = time as i32;
        let bc2_sqrt = (1.0 - beta_2.powi(t)).sqrt();
        Self {
            beta_1,
            beta_2,
            combined: bc2_sqrt / (1.0 - beta_1.powi(t)),
            eps_hat: epsilon * bc2_sqrt,
            lr: lr as f32,
            keep: (1.0 - lr * f64::from(weight_decay)) as f32,
            grad_scale,
        }
    }
}

multiversion! {
    fn update_chunk(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], u: &Update) {
        for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
            let g = g * u.grad_scale;
            *m = *m * u.beta_1 + g * (1.0 - u.beta_1);
            *v = *v * u.beta_2 + g * g * (1.0 - u.beta_2);
            let delta = *m * u.combined / (v.sqrt() + u.eps_hat);
            *p = *p * u.keep - delta * u.lr;
        }
    }
}

/// One AdamW step of one tensor, in place.
///
/// # Shapes
/// - p, g, m, v: the parameter's, all the same length
pub fn update(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], u: Update) {
    assert!(g.len() == p.len() && m.len() == p.len() && v.len() == p.len());
    p.par_chunks_mut(CHUNK)
        .zip(g.par_chunks(CHUNK))
        .zip(m.par_chunks_mut(CHUNK).zip(v.par_chunks_mut(CHUNK)))
        .for_each(|((p, g), (m, v))| update_chunk(p, g, m, v, &u));
}

/// `Σ x²` in f64, over fixed chunks added in order: the same on any thread count.
pub fn sum_squares(x: &[f32]) -> f64 {
    let partial: Vec<f64> = x.par_chunks(CHUNK).map(|c| f64::from(dot(c, c))).collect();
    partial.iter().sum()
}
