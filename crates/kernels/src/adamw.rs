//! AdamW and global-norm gradient clipping over [`Params`], computed as Burn's `AdamW` and
//! cinder's `clip_global_norm` compute them, so that either engine may continue a run.

use rayon::prelude::*;

use crate::params::Params;
use crate::simd::{dot, multiversion};

/// AdamW's settings. Weight decay applies to matrices only (see [`Params::is_matrix`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamW {
    pub beta_1: f32,
    pub beta_2: f32,
    pub epsilon: f32,
    pub weight_decay: f32,
}

/// The optimizer's state: steps taken and the two moments of every parameter.
#[derive(Debug, Clone, PartialEq)]
pub struct AdamState {
    /// Steps taken so far (0: no state yet).
    pub time: usize,
    pub moment_1: Params,
    pub moment_2: Params,
}

impl AdamState {
    /// The state before the first step.
    pub fn new(like: &Params) -> Self {
        Self {
            time: 0,
            moment_1: Params::zeros(like.dims),
            moment_2: Params::zeros(like.dims),
        }
    }
}

/// Elements per rayon task.
const CHUNK: usize = 32 * 1024;

/// The constants of one update, shared by all elements.
#[derive(Clone, Copy)]
struct Update {
    beta_1: f32,
    beta_2: f32,
    /// bias-corrected step direction = m * combined / (sqrt(v) + eps_hat)
    combined: f32,
    eps_hat: f32,
    lr: f32,
    /// 1 - lr * weight_decay for decayed parameters, else 1.
    keep: f32,
}

multiversion! {
    fn update_chunk(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], u: &Update) {
        for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
            *m = *m * u.beta_1 + g * (1.0 - u.beta_1);
            *v = *v * u.beta_2 + g * g * (1.0 - u.beta_2);
            let delta = *m * u.combined / (v.sqrt() + u.eps_hat);
            *p = *p * u.keep - delta * u.lr;
        }
    }
}

impl AdamW {
    /// One step with learning rate `lr`: updates `params` and `state` from `grads`.
    pub fn step(&self, lr: f64, params: &mut Params, grads: &Params, state: &mut AdamState) {
        state.time += 1;
        let t = state.time as i32;
        let bc2_sqrt = (1.0 - self.beta_2.powi(t)).sqrt();
        let base = Update {
            beta_1: self.beta_1,
            beta_2: self.beta_2,
            combined: bc2_sqrt / (1.0 - self.beta_1.powi(t)),
            eps_hat: self.epsilon * bc2_sqrt,
            lr: lr as f32,
            keep: 1.0,
        };
        let decayed = (1.0 - lr * f64::from(self.weight_decay)) as f32;
        let matrices = params.is_matrix();
        let ps = params.vectors_mut();
        let ms = state.moment_1.vectors_mut();
        let vs = state.moment_2.vectors_mut();
        for ((((p, g), m), v), matrix) in ps
            .into_iter()
            .zip(grads.vectors())
            .zip(ms)
            .zip(vs)
            .zip(matrices)
        {
            let u = Update {
                keep: if matrix { decayed } else { 1.0 },
                ..base
            };
            p.par_chunks_mut(CHUNK)
                .zip(g.par_chunks(CHUNK))
                .zip(m.par_chunks_mut(CHUNK).zip(v.par_chunks_mut(CHUNK)))
                .for_each(|((p, g), (m, v))| update_chunk(p, g, m, v, &u));
        }
    }
}

multiversion! {
    fn scale_chunk(x: &mut [f32], k: f32) {
        for v in x.iter_mut() {
            *v *= k;
        }
    }
}

/// Scales all gradients together so that their global L2 norm is at most `max_norm`, as
/// PyTorch's `clip_grad_norm_` does (`max_norm / (norm + 1e-6)`, at most 1). Returns the norm
/// before clipping.
pub fn clip_global_norm(grads: &mut Params, max_norm: f32) -> f32 {
    // Partial sums per chunk in parallel, added in order: the same result on any thread count.
    let partial: Vec<f64> = grads
        .vectors()
        .par_iter()
        .flat_map(|g| g.par_chunks(CHUNK).map(|c| f64::from(dot(c, c))))
        .collect();
    let squares: f64 = partial.iter().sum();
    let norm = squares.sqrt() as f32;
    let coef = (max_norm / (norm + 1e-6)).min(1.0);
    if coef < 1.0 {
        for g in grads.vectors_mut() {
            g.par_chunks_mut(CHUNK).for_each(|c| scale_chunk(c, coef));
        }
    }
    norm
}
