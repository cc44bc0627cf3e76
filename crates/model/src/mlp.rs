//! The feed-forward half of a block: linear to 4 x n_embd, GELU, linear back, dropout.

use burn::nn::{Dropout, Gelu, Linear};
use burn::prelude::*;

/// The block's multilayer perceptron.
#[derive(Module, Debug)]
pub struct Mlp {
    /// `n_embd -> 4 * n_embd`.
    pub c_fc: Linear,
    /// Exact (erf) GELU, as in GPT-2 and nanoGPT.
    pub gelu: Gelu,
    /// `4 * n_embd -> n_embd`, a residual output projection.
    pub c_proj: Linear,
    /// Residual dropout.
    pub dropout: Dropout,
}

impl Mlp {
    /// # Shapes
    /// - x: `[B, T, C]` -> `[B, T, C]`
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let h = self.gelu.forward(self.c_fc.forward(x)); // (B, T, 4C)
        self.dropout.forward(self.c_proj.forward(h)) // (B, T, C)
    }
}
