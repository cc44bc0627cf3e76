//! Linear layers, `y = x W + b` with `W` as `[d_in, d_out]`.

use crate::matmul::{Mat, matmul};
use crate::params::Linear;
use crate::simd::{add_assign, multiversion};

/// # Shapes
/// - x: `[N, d_in]` -> out: `[N, d_out]`
pub fn forward(x: &[f32], l: &Linear, out: &mut [f32]) {
    let n = x.len() / l.d_in;
    let w = Mat::new(&l.weight, l.d_in, l.d_out);
    match &l.bias {
        Some(b) => {
            for row in out.chunks_exact_mut(l.d_out) {
                row.copy_from_slice(b);
            }
            matmul(out, Mat::new(x, n, l.d_in), w, true);
        }
        None => matmul(out, Mat::new(x, n, l.d_in), w, false),
    }
}

/// `out = x W`: [`forward`] without the bias, for a caller that adds it in its own next pass
/// over `out` (the sum is the same: gemm adds its product to the bias in one addition).
pub fn forward_unbiased(x: &[f32], l: &Linear, out: &mut [f32]) {
    let n = x.len() / l.d_in;
    matmul(
        out,
        Mat::new(x, n, l.d_in),
        Mat::new(&l.weight, l.d_in, l.d_out),
        false,
    );
}

multiversion! {
    /// `out = (out + bias) + residual` for whole rows (rows of `bias.len()`).
    fn add_bias_residual_rows(out: &mut [f32], bias: &[f32], residual: &[f32]) {
        for (o, r) in out.chunks_exact_mut(bias.len()).zip(residual.chunks_exact(bias.len())) {
            for ((o, &b), &r) in o.iter_mut().zip(bias).zip(r) {
                *o = (*o + b) + r;
            }
        }
    }
}

/// `out = residual + (x W + b)`: a layer on a residual branch, the bias and the residual
/// added in one pass after the product.
///
/// # Shapes
/// - x: `[N, d_in]`; residual, out: `[N, d_out]`
pub fn forward_residual(x: &[f32], l: &Linear, residual: &[f32], out: &mut [f32]) {
    forward_unbiased(x, l, out);
    match &l.bias {
        Some(b) => add_bias_residual_rows(out, b, residual),
        None => add_assign(out, residual),
    }
}

/// Backward of [`forward`]: `dx = dy Wᵀ` (written, when asked for); `dW += xᵀ dy` and
/// `db += Σ_rows dy` (added, so micro-batches accumulate).
///
/// # Shapes
/// - dy: `[N, d_out]`, x: `[N, d_in]`, dx: `[N, d_in]`
pub fn backward(dy: &[f32], x: &[f32], l: &Linear, grad: &mut Linear, dx: Option<&mut [f32]>) {
    let n = x.len() / l.d_in;
    let dy_m = Mat::new(dy, n, l.d_out);
    if let Some(dx) = dx {
        matmul(dx, dy_m, Mat::new(&l.weight, l.d_in, l.d_out).t(), false);
    }
    matmul(&mut grad.weight, Mat::new(x, n, l.d_in).t(), dy_m, true);
    if let Some(db) = &mut grad.bias {
        for row in dy.chunks_exact(l.d_out) {
            add_assign(db, row);
        }
    }
}
