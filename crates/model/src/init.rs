//! GPT-2's initialisation, shared by the modules' constructors: weights normal(0, 0.02), biases
//! zero, and each block's two residual output projections normal(0, 0.02 / sqrt(2 n_layer)),
//! or zero with `zero_init` (as an untied head then is).

use burn::nn::{
    Embedding, EmbeddingConfig, Initializer, LayerNorm, LayerNormConfig, Linear, LinearConfig,
};
use burn::prelude::*;

use crate::config::{GptConfig, Norm};

/// The standard deviation of every weight but the residual projections.
pub(crate) const INIT_STD: f64 = 0.02;

/// The standard deviation of the residual output projections (0 with `zero_init`).
pub(crate) fn residual_std(config: &GptConfig) -> f64 {
    if config.zero_init {
        0.0
    } else {
        INIT_STD / ((2 * config.n_layer) as f64).sqrt()
    }
}

/// Normal(0, `std`) (drawn even when `std` is 0: an untied head with `zero_init` takes its
/// draws, as it always has).
pub(crate) fn normal(std: f64) -> Initializer {
    Initializer::Normal { mean: 0.0, std }
}

/// A `d_in -> d_out` linear layer with weights normal(0, `std`) (zeros when `std` is 0) and, with
/// `bias`, a zero bias.
pub(crate) fn linear(
    config: &GptConfig,
    d_in: usize,
    d_out: usize,
    std: f64,
    device: &Device,
) -> Linear {
    let mut linear = LinearConfig::new(d_in, d_out)
        .with_bias(config.bias)
        .with_initializer(if std == 0.0 {
            Initializer::Zeros
        } else {
            normal(std)
        })
        .init(device);
    if config.bias {
        linear.bias = Some(Initializer::Zeros.init([d_out], device));
    }
    linear
}

/// An embedding of `n` rows of `n_embd`, normal(0, 0.02).
pub(crate) fn embedding(config: &GptConfig, n: usize, device: &Device) -> Embedding {
    EmbeddingConfig::new(n, config.n_embd)
        .with_initializer(normal(INIT_STD))
        .init(device)
}

/// A LayerNorm, or nothing for an RMSNorm (it has no weights).
pub(crate) fn layer_norm(config: &GptConfig, device: &Device) -> Option<LayerNorm> {
    (config.norm == Norm::Layernorm).then(|| {
        LayerNormConfig::new(config.n_embd)
            .with_epsilon(config.layer_norm_epsilon)
            .with_bias(config.bias)
            .init(device)
    })
}
