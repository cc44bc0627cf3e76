//! The MLP's activation and its derivative: GELU, `x * Φ(x)`, exact (erf) or GPT-2's tanh
//! approximation (Hugging Face's `gelu_new`); or ReLU², `max(0, x)²` (the nanoGPT speedrun's).

use rayon::prelude::*;

use crate::simd::{erf, exp, multiversion};

const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
/// 1 / sqrt(2π)
const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;
/// sqrt(2 / π)
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The cubic term of the tanh approximation.
const TANH_CUBIC: f32 = 0.044_715;
/// Elements per rayon task.
const CHUNK: usize = 16 * 1024;

/// Which activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `x * Φ(x)` with the error function.
    Erf,
    /// `0.5 x (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))`.
    Tanh,
    /// `max(0, x)²`.
    Relu2,
}

/// `(relu(z)², 2 relu(z))`.
#[inline(always)]
fn relu2_value_and_derivative(z: f32) -> (f32, f32) {
    let r = z.max(0.0);
    (r * r, 2.0 * r)
}

/// `(gelu(z), gelu'(z))`, exact.
#[inline(always)]
fn erf_value_and_derivative(z: f32) -> (f32, f32) {
    let cdf = 0.5 * (1.0 + erf(z * FRAC_1_SQRT_2));
    let pdf = exp(-0.5 * z * z) * FRAC_1_SQRT_2PI;
    (z * cdf, cdf + z * pdf)
}

/// `(gelu(z), gelu'(z))`, tanh approximation.
#[inline(always)]
fn tanh_value_and_derivative(z: f32) -> (f32, f32) {
    let z2 = z * z;
    let u = SQRT_2_OVER_PI * z * TANH_CUBIC.mul_add(z2, 1.0);
    // tanh(u) = 1 - 2 / (e^(2u) + 1), with `exp` clamped: exact limits at both ends.
    let t = 1.0 - 2.0 / (exp(2.0 * u) + 1.0);
    let half_1_plus_t = 0.5 * (1.0 + t);
    let du = SQRT_2_OVER_PI * (3.0 * TANH_CUBIC).mul_add(z2, 1.0);
    let derivative = (0.5 * z * (1.0 - t * t)).mul_add(du, half_1_plus_t);
    (z * half_1_plus_t, derivative)
}

/// Applies `f` to `x + bias` (whole rows of `bias.len()`, or `x` alone). With `out`, the value
/// goes there and the derivative over `x` (training); without, the value over `x` (inference).
#[inline(always)]
fn apply(
    f: impl Fn(f32) -> (f32, f32),
    x: &mut [f32],
    bias: Option<&[f32]>,
    out: Option<&mut [f32]>,
) {
    match (bias, out) {
        (Some(bias), Some(out)) => {
            let rows = x
                .chunks_exact_mut(bias.len())
                .zip(out.chunks_exact_mut(bias.len()));
            for (xr, or) in rows {
                for ((o, v), &b) in or.iter_mut().zip(xr.iter_mut()).zip(bias) {
                    (*o, *v) = f(*v + b);
                }
            }
        }
        (None, Some(out)) => {
            for (o, v) in out.iter_mut().zip(x.iter_mut()) {
                (*o, *v) = f(*v);
            }
        }
        (Some(bias), None) => {
            for xr in x.chunks_exact_mut(bias.len()) {
                for (v, &b) in xr.iter_mut().zip(bias) {
                    *v = f(*v + b).0;
                }
            }
        }
        (None, None) => {
            for v in x.iter_mut() {
                *v = f(*v).0;
            }
        }
    }
}

multiversion! {
    /// `gelu(x + bias)` for whole rows of `bias.len()` (or elements without a bias): into `out`
    /// with `x` replaced by `gelu'(x + bias)`, or, without `out`, over `x`.
    pub fn forward_chunk(kind: Kind, x: &mut [f32], bias: Option<&[f32]>, out: Option<&mut [f32]>) {
        match kind {
            Kind::Erf => apply(erf_value_and_derivative, x, bias, out),
            Kind::Tanh => apply(tanh_value_and_derivative, x, bias, out),
            Kind::Relu2 => apply(relu2_value_and_derivative, x, bias, out),
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

/// Tasks of whole rows of `width` elements.
fn task(width: usize) -> usize {
    (CHUNK / width.max(1)).max(1) * width
}

/// `x = gelu(x + bias)`, in place, for inference (no derivative), with `bias` added to each row
/// of `x`.
pub fn forward_in_place(kind: Kind, x: &mut [f32], bias: Option<&[f32]>) {
    let task = task(bias.map_or(1, <[f32]>::len));
    x.par_chunks_mut(task)
        .for_each(|x| forward_chunk(kind, x, bias, None));
}

/// `out = gelu(x + bias)` for training, with `bias` a linear layer's, added to each row of `x`
/// (see [`crate::linear::forward_unbiased`]). `x` is replaced by the derivative at `x + bias`,
/// which is all the backward pass needs of it (see [`backward_from_derivative`]); computing it
/// now, while `x` is at hand, saves the backward pass the transcendental functions.
pub fn forward_keep_derivative(kind: Kind, x: &mut [f32], bias: Option<&[f32]>, out: &mut [f32]) {
    let task = task(bias.map_or(1, <[f32]>::len));
    out.par_chunks_mut(task)
        .zip(x.par_chunks_mut(task))
        .for_each(|(o, x)| forward_chunk(kind, x, bias, Some(o)));
}

/// Turns `d = ∂loss/∂gelu(x)` into `∂loss/∂x`, in place, from the saved `gelu'(x)`.
pub fn backward_from_derivative(derivative: &[f32], d: &mut [f32]) {
    d.par_chunks_mut(CHUNK)
        .zip(derivative.par_chunks(CHUNK))
        .for_each(|(d, g)| mul_chunk(d, g));
}
