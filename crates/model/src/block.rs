//! One pre-norm transformer block: `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`.

use burn::nn::LayerNorm;
use burn::prelude::*;

use crate::attention::{CausalSelfAttention, Keep};
use crate::config::GptConfig;
use crate::init;
use crate::mlp::Mlp;
use crate::ops::{self, Pass};

/// A transformer block.
#[derive(Module, Debug)]
pub struct Block {
    /// The norm before attention: a LayerNorm, or none for a (weightless) RMSNorm.
    pub ln_1: Option<LayerNorm>,
    pub attn: CausalSelfAttention,
    /// The norm before the MLP, likewise.
    pub ln_2: Option<LayerNorm>,
    pub mlp: Mlp,
}

impl Block {
    /// A block of a model of `config`, GPT-2's initialisation (see [`crate::init`]).
    pub fn new(config: &GptConfig, device: &Device) -> Self {
        Self {
            ln_1: init::layer_norm(config, device),
            attn: CausalSelfAttention::new(config, device),
            ln_2: init::layer_norm(config, device),
            mlp: Mlp::new(config, device),
        }
    }

    /// Block `layer` of a pass, keeping what `keep` asks for.
    ///
    /// # Shapes
    /// - x: `[B, T, C]` -> `[B, T, C]` (`[B, 1, C]` when only the last position goes on: see
    ///   [`Keep::Cache`])
    pub(crate) fn forward(
        &self,
        x: Tensor<3>,
        pass: Pass,
        layer: usize,
        keep: &mut Keep,
    ) -> Tensor<3> {
        let h = ops::norm(self.ln_1.as_ref(), x.clone(), pass);
        let x = self.attn.forward_pass(h, x, pass, layer, keep);
        let h = ops::norm(self.ln_2.as_ref(), x.clone(), pass);
        self.mlp.forward(h, x, pass, layer)
    }
}
