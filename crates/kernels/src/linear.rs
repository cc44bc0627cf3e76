//! Linear layers, `y = x W + b` with `W` as `[d_in, d_out]`.

use crate::matmul::{Mat, matmul};
use crate::params::Linear;
use crate::simd::add_assign;

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
