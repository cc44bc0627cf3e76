//! The feed-forward half of a block: linear to 4 x n_embd, the activation, linear back, dropout.

use burn::nn::{Dropout, DropoutConfig, Linear};
use burn::prelude::*;

use crate::Activation;
use crate::config::GptConfig;
use crate::init::{self, INIT_STD};
use crate::ops::{self, Pass, Site};

/// The block's multilayer perceptron.
#[derive(Module, Debug)]
pub struct Mlp {
    /// `n_embd -> 4 * n_embd`.
    pub c_fc: Linear,
    /// The activation between the two layers (not part of the weights).
    #[module(skip)]
    pub activation: Activation,
    /// `4 * n_embd -> n_embd`, a residual output projection.
    pub c_proj: Linear,
    /// Residual dropout.
    pub dropout: Dropout,
}

impl Mlp {
    /// The MLP of a block of a model of `config`, GPT-2's initialisation (see [`crate::init`]).
    pub fn new(config: &GptConfig, device: &Device) -> Self {
        let (c, hidden) = (config.n_embd, 4 * config.n_embd);
        Self {
            c_fc: init::linear(config, c, hidden, INIT_STD, device),
            activation: config.activation,
            c_proj: init::linear(config, hidden, c, init::residual_std(config), device),
            dropout: DropoutConfig::new(config.dropout).init(),
        }
    }

    /// `residual + mlp(x)`, block `layer` of a pass.
    ///
    /// # Shapes
    /// - x, residual: `[B, T, C]` -> `[B, T, C]`
    pub(crate) fn forward(
        &self,
        x: Tensor<3>,
        residual: Tensor<3>,
        pass: Pass,
        layer: usize,
    ) -> Tensor<3> {
        let h = ops::linear_activation(&self.c_fc, self.activation, x, pass); // (B, T, 4C)
        let at = (layer, Site::MlpOutput);
        ops::project_residual(&self.c_proj, &self.dropout, h, residual, pass, at) // (B, T, C)
    }
}
