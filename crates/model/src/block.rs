//! One pre-LayerNorm transformer block: `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`.

use burn::nn::LayerNorm;
use burn::prelude::*;

use crate::attention::{AttentionOutput, CausalSelfAttention, LayerCache};
use crate::mlp::Mlp;

/// A transformer block.
#[derive(Module, Debug)]
pub struct Block {
    pub ln_1: LayerNorm,
    pub attn: CausalSelfAttention,
    pub ln_2: LayerNorm,
    pub mlp: Mlp,
}

impl Block {
    /// # Shapes
    /// - x: `[B, T, C]` -> `[B, T, C]`
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        self.forward_with(x, None, false).0
    }

    /// The block with an optional key/value cache for this layer, and optionally the attention
    /// weights `[B, H, T, T_keys]`.
    pub(crate) fn forward_with(
        &self,
        x: Tensor<3>,
        cache: Option<&mut LayerCache>,
        want_weights: bool,
    ) -> (Tensor<3>, Option<Tensor<4>>) {
        let AttentionOutput { y, weights } =
            self.attn
                .forward_with(self.ln_1.forward(x.clone()), cache, want_weights);
        let x = x + y;
        let x = x.clone() + self.mlp.forward(self.ln_2.forward(x));
        (x, weights)
    }
}
