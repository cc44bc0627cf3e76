//! The exact (erf) GELU, `x * Φ(x)`, and its derivative.

use rayon::prelude::*;

use crate::simd::{erf, exp, multiversion};

const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
/// 1 / sqrt(2π)
const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;
/// Elements per rayon task.
const CHUNK: usize = 16 * 1024;

multiversion! {
    /// `out = gelu(x)` for one chunk.
    pub fn forward_chunk(x: &[f32], out: &mut [f32]) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = 0.5 * v * (1.0 + erf(v * FRAC_1_SQRT_2));
        }
    }
}

multiversion! {
    /// `out = gelu(x + bias)` for whole rows of `bias.len()`.
    pub fn forward_bias_chunk(x: &[f32], bias: &[f32], out: &mut [f32]) {
        let rows = x.chunks_exact(bias.len()).zip(out.chunks_exact_mut(bias.len()));
        for (xr, or) in rows {
            for ((o, &v), &b) in or.iter_mut().zip(xr).zip(bias) {
                let z = v + b;
                *o = 0.5 * z * (1.0 + erf(z * FRAC_1_SQRT_2));
            }
        }
    }
}

/// `(gelu(z), gelu'(z))`.
#[inline(always)]
fn value_and_derivative(z: f32) -> (f32, f32) {
    let cdf = 0.5 * (1.0 + erf(z * FRAC_1_SQRT_2));
    let pdf = exp(-0.5 * z * z) * FRAC_1_SQRT_2PI;
    (z * cdf, cdf + z * pdf)
}

multiversion! {
    /// `out = gelu(x + bias)` and `x` replaced by `gelu'(x + bias)`, for whole rows of
    /// `bias.len()` (for any elements without a bias).
    pub fn forward_keep_derivative_chunk(x: &mut [f32], bias: Option<&[f32]>, out: &mut [f32]) {
        match bias {
            Some(bias) => {
                let rows = x.chunks_exact_mut(bias.len()).zip(out.chunks_exact_mut(bias.len()));
                for (xr, or) in rows {
                    for ((o, v), &b) in or.iter_mut().zip(xr.iter_mut()).zip(bias) {
                        (*o, *v) = value_and_derivative(*v + b);
                    }
                }
            }
            None => {
                for (o, v) in out.iter_mut().zip(x.iter_mut()) {
                    (*o, *v) = value_and_derivative(*v);
                }
            }
        }
    }
}

multiversion! {
    /// `d *= g` element-wise.
    pub fn mul_chunk(d: &mut [f32], g: &[f32]) {
        for (a, b) in d.iter_mut().zip(g) {
            *a *= b;
        }
    }
}

multiversion! {
    /// `dx = dout * gelu'(x)` for one chunk, in place in `d`.
    pub fn backward_chunk(x: &[f32], d: &mut [f32]) {
        for (g, &v) in d.iter_mut().zip(x) {
            *g *= value_and_derivative(v).1;
        }
    }
}

/// `out = gelu(x)`, element-wise.
pub fn forward(x: &[f32], out: &mut [f32]) {
    out.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .for_each(|(o, x)| forward_chunk(x, o));
}

/// `out = gelu(x + bias)` for inference (no derivative), with `bias` added to each row of `x`.
pub fn forward_bias(x: &[f32], bias: Option<&[f32]>, out: &mut [f32]) {
    let Some(bias) = bias else {
        return forward(x, out);
    };
    let task = (CHUNK / bias.len().max(1)).max(1) * bias.len();
    out.par_chunks_mut(task)
        .zip(x.par_chunks(task))
        .for_each(|(o, x)| forward_bias_chunk(x, bias, o));
}

/// `out = gelu(x + bias)` for training, with `bias` a linear layer's, added to each row of `x`
/// (see [`crate::linear::forward_unbiased`]). `x` is replaced by the derivative at `x + bias`,
/// which is all the backward pass needs of it (see [`backward_from_derivative`]); computing it
/// now, while `x` is at hand, saves the backward pass an `erf`, an `exp` and a division per
/// element.
pub fn forward_keep_derivative(x: &mut [f32], bias: Option<&[f32]>, out: &mut [f32]) {
    let width = bias.map_or(1, <[f32]>::len);
    let task = (CHUNK / width.max(1)).max(1) * width;
    out.par_chunks_mut(task)
        .zip(x.par_chunks_mut(task))
        .for_each(|(o, x)| forward_keep_derivative_chunk(x, bias, o));
}

/// Turns `d = ∂loss/∂gelu(x)` into `∂loss/∂x`, in place, from the saved `gelu'(x)`.
pub fn backward_from_derivative(derivative: &[f32], d: &mut [f32]) {
    d.par_chunks_mut(CHUNK)
        .zip(derivative.par_chunks(CHUNK))
        .for_each(|(d, g)| mul_chunk(d, g));
}

/// Turns `d = ∂loss/∂gelu(x)` into `∂loss/∂x`, in place.
pub fn backward(x: &[f32], d: &mut [f32]) {
    d.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .for_each(|(d, x)| backward_chunk(x, d));
}
