//! Linear layers, `y = x W + b` with `W` as `[d_in, d_out]` (Burn's layout, and GPT-2's).

use crate::matmul::{Mat, matmul, product};
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

/// `x W + b`.
///
/// # Shapes
/// - x: `[N, d_in]` -> `[N, d_out]`
pub fn forward(x: &[f32], l: Linear) -> Vec<f32> {
    let n = x.len() / l.d_in;
    match l.bias {
        Some(b) => {
            let mut out = b.repeat(n);
            matmul(&mut out, Mat::new(x, n, l.d_in), l.w(), true);
            out
        }
        None => forward_unbiased(x, l),
    }
}

/// `x W`: [`forward`] without the bias, for a caller that adds it in its own next pass over the
/// output (the sum is the same: gemm adds its product to the bias in one addition).
pub fn forward_unbiased(x: &[f32], l: Linear) -> Vec<f32> {
    let n = x.len() / l.d_in;
    product(Mat::new(x, n, l.d_in), l.w())
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

/// `residual + (x W + b)`: a layer on a residual branch, the bias and the residual added in one
/// pass after the product.
///
/// # Shapes
/// - x: `[N, d_in]`; residual, output: `[N, d_out]`
pub fn forward_residual(x: &[f32], l: Linear, residual: &[f32]) -> Vec<f32> {
    let mut out = forward_unbiased(x, l);
    rows::zip_mut(&mut out, residual, l.d_out, |o, r| match l.bias {
        Some(b) => add_bias_residual_rows(o, b, r),
        None => add_assign(o, r),
    });
    out
}

/// Backward of [`forward`]: `dx = dy Wᵀ`, `dW = xᵀ dy` and `db = Σ_rows dy`, each computed
/// when asked for (`want`: dx, dW, db).
///
/// # Shapes
/// - dy: `[N, d_out]`, x: `[N, d_in]` -> dx: `[N, d_in]`, dw: `[d_in, d_out]`, db: `[d_out]`
pub fn backward(dy: &[f32], x: &[f32], l: Linear, want: [bool; 3]) -> Grads {
    let n = x.len() / l.d_in;
    let dy_m = Mat::new(dy, n, l.d_out);
    let [want_dx, want_dw, want_db] = want;
    Grads {
        dx: want_dx.then(|| product(dy_m, l.w().t())),
        dw: want_dw.then(|| product(Mat::new(x, n, l.d_in).t(), dy_m)),
        db: want_db.then(|| {
            let mut db = vec![0.0; l.d_out];
            rows::sum(dy, l.d_out, &mut db, |_, block, acc| {
                for row in block.chunks_exact(acc.len()) {
                    add_assign(acc, row);
                }
            });
            db
        }),
    }
}

/// A linear layer's gradients, each present when asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct Grads {
    pub dx: Option<Vec<f32>>,
    pub dw: Option<Vec<f32>>,
    pub db: Option<Vec<f32>>,
}
