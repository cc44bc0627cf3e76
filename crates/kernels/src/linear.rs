//! Linear layers, `y = x W + b` with `W` as `[d_in, d_out]` (Burn's layout, and GPT-2's).

use crate::matmul::{Mat, matmul};
use crate::rows;
use crate::simd::{add_assign, multiversion};

/// A linear layer's parameters: `weight` `[d_in, d_out]`, `bias` `[d_out]`.
#[derive(Debug, Clone, Copy)]
pub struct Linear<'a> {
    pub weight: &'a [f32],
    pub bias: Option<&'a [f32]>,
    pub d_in: usize,
    pub d_out: usize,
}

impl<'a> Linear<'a> {
    /// The layer of `weight` (`[d_in, d_out]`, row-major) and `bias`.
    pub fn new(weight: &'a [f32], bias: Option<&'a [f32]>, d_out: usize) -> Self {
        assert!(
            d_out > 0 && weight.len().is_multiple_of(d_out),
            "weight is not [d_in, d_out]"
        );
        if let Some(b) = bias {
            assert_eq!(b.len(), d_out, "bias is not [d_out]");
        }
        Self {
            weight,
            bias,
            d_in: weight.len() / d_out,
            d_out,
        }
    }

    fn w(&self) -> Mat<'a> {
        Mat::new(self.weight, self.d_in, self.d_out)
    }
}

/// # Shapes
/// - x: `[N, d_in]` -> out: `[N, d_out]`
pub fn forward(x: &[f32], l: Linear, out: &mut [f32]) {
    let n = x.len() / l.d_in;
    match l.bias {
        Some(b) => {
            rows::each_mut(out, l.d_out, |o| {
                for row in o.chunks_exact_mut(b.len()) {
                    row.copy_from_slice(b);
                }
            });
            matmul(out, Mat::new(x, n, l.d_in), l.w(), true);
        }
        None => matmul(out, Mat::new(x, n, l.d_in), l.w(), false),
    }
}

/// `out = x W`: [`forward`] without the bias, for a caller that adds it in its own next pass
/// over `out` (the sum is the same: gemm adds its product to the bias in one addition).
pub fn forward_unbiased(x: &[f32], l: Linear, out: &mut [f32]) {
    let n = x.len() / l.d_in;
    matmul(out, Mat::new(x, n, l.d_in), l.w(), false);
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
pub fn forward_residual(x: &[f32], l: Linear, residual: &[f32], out: &mut [f32]) {
    forward_unbiased(x, l, out);
    rows::zip_mut(out, residual, l.d_out, |o, r| match l.bias {
        Some(b) => add_bias_residual_rows(o, b, r),
        None => add_assign(o, r),
    });
}

/// Backward of [`forward`]: `dx = dy Wᵀ`, `dW = xᵀ dy` and `db = Σ_rows dy`, each written
/// when asked for.
///
/// # Shapes
/// - dy: `[N, d_out]`, x: `[N, d_in]`, dx: `[N, d_in]`, dw: `[d_in, d_out]`, db: `[d_out]`
pub fn backward(
    dy: &[f32],
    x: &[f32],
    l: Linear,
    dx: Option<&mut [f32]>,
    dw: Option<&mut [f32]>,
    db: Option<&mut [f32]>,
) {
    let n = x.len() / l.d_in;
    let dy_m = Mat::new(dy, n, l.d_out);
    if let Some(dx) = dx {
        matmul(dx, dy_m, l.w().t(), false);
    }
    if let Some(dw) = dw {
        matmul(dw, Mat::new(x, n, l.d_in).t(), dy_m, false);
    }
    if let Some(db) = db {
        rows::sum(dy, l.d_out, db, |_, block, acc| {
            for row in block.chunks_exact(acc.len()) {
                add_assign(acc, row);
            }
        });
    }
}
