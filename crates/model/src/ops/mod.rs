//! The layers as operations. Each has a composite version written with Burn's tensor operations,
//! which runs on every backend and is the reference, and on the Flex (CPU) backend a fused
//! version ([`fused`]: one hand-written kernel from `cinder-kernels` with its own backward pass).
//! The modules of this crate call the functions here; a [`Pass`] says which version runs and
//! which dropout masks apply.

use burn::nn::{Dropout, Embedding, LayerNorm, Linear};
use burn::prelude::*;
use burn::tensor::activation::{gelu as composite_gelu, gelu_approximate, log_softmax};
use cinder_kernels::dropout::{Mask, site_seed};

use crate::Activation;

#[cfg(feature = "flex")]
pub mod fused;

/// Which version of the layers a model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ops {
    /// The fused layers where the backend has them (Flex), the composite ones elsewhere.
    #[default]
    Fused,
    /// Burn's composite layers on every backend (the reference; and `inspect`'s attention
    /// weights).
    Composite,
}

impl Ops {
    /// Whether the fused layers run on `device`.
    pub fn fused_on(self, device: &Device) -> bool {
        self == Ops::Fused && has_fused(device)
    }
}

/// Whether `device` (with or without autodiff) is one the fused layers run on.
pub fn has_fused(device: &Device) -> bool {
    #[cfg(feature = "flex")]
    {
        matches!(
            device.as_dispatch().clone().inner(),
            burn::backend::DispatchDevice::Flex(_)
        )
    }
    #[cfg(not(feature = "flex"))]
    {
        let _ = device;
        false
    }
}

/// Where dropout masks come from in one training forward pass: the run's seed and the draw
/// (one per micro-batch). On the fused path a mask is a function of (seed, draw, layer, site,
/// element); the composite path draws from the device's generator (seed it for the step).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DropoutKey {
    pub seed: u64,
    pub draw: u64,
}

/// The places a block applies dropout.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Site {
    Embedding = 0,
    AttentionWeights = 1,
    AttentionOutput = 2,
    MlpOutput = 3,
}

/// How one forward pass runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pass {
    pub fused: bool,
    /// Dropout applies (training) when set.
    pub dropout: Option<DropoutKey>,
    /// The LayerNorms' epsilon.
    pub eps: f32,
}

impl Pass {
    /// The fused mask of `dropout` at `site` of block `layer`, if it drops anything.
    pub fn mask(&self, dropout: &Dropout, layer: usize, site: Site) -> Option<Mask> {
        let key = self.dropout?;
        (dropout.prob > 0.0).then(|| Mask {
            p: dropout.prob as f32,
            seed: site_seed(key.seed, &[key.draw, layer as u64, site as u64]),
        })
    }

    /// `dropout` on the composite path, during training.
    pub fn composite_dropout<const D: usize>(&self, dropout: &Dropout, x: Tensor<D>) -> Tensor<D> {
        if self.dropout.is_some() {
            dropout.forward(x)
        } else {
            x
        }
    }
}

// With the `flex` feature off, `pass.fused` is never set and these branches are never taken.
#[cfg(not(feature = "flex"))]
mod fused {
    pub use super::unavailable::*;
}
#[cfg(not(feature = "flex"))]
mod unavailable {
    #![allow(unused_variables)]
    use super::*;
    const NONE: &str = "built without the flex feature";
    pub fn embed(i: Tensor<2, Int>, a: Tensor<2>, b: Tensor<2>, s: usize) -> Tensor<3> {
        unreachable!("{NONE}")
    }
    pub fn layer_norm<const D: usize>(
        x: Tensor<D>,
        g: Tensor<1>,
        b: Option<Tensor<1>>,
        e: f32,
    ) -> Tensor<D> {
        unreachable!("{NONE}")
    }
    pub fn linear<const D: usize>(
        x: Tensor<D>,
        w: Tensor<2>,
        b: Option<Tensor<1>>,
        r: Option<Tensor<D>>,
    ) -> Tensor<D> {
        unreachable!("{NONE}")
    }
    pub fn gelu<const D: usize>(x: Tensor<D>, b: Option<Tensor<1>>, t: bool) -> Tensor<D> {
        unreachable!("{NONE}")
    }
    pub fn dropout<const D: usize>(x: Tensor<D>, r: Option<Tensor<D>>, m: Mask) -> Tensor<D> {
        unreachable!("{NONE}")
    }
    pub fn head_loss(x: Tensor<3>, w: Tensor<2>, t: Tensor<2, Int>) -> Tensor<1> {
        unreachable!("{NONE}")
    }
    pub fn head<const D: usize>(x: Tensor<D>, w: Tensor<2>) -> Tensor<D> {
        unreachable!("{NONE}")
    }
}

/// Token plus position embeddings for tokens from position `start`, and the embedding dropout.
///
/// # Shapes
/// - idx: `[B, T]` -> `[B, T, C]`
pub(crate) fn embed(
    wte: &Embedding,
    wpe: &Embedding,
    drop: &Dropout,
    idx: Tensor<2, Int>,
    start: usize,
    pass: Pass,
) -> Tensor<3> {
    if pass.fused {
        let x = fused::embed(idx, wte.weight.val(), wpe.weight.val(), start);
        return match pass.mask(drop, 0, Site::Embedding) {
            Some(mask) => fused::dropout(x, None, mask),
            None => x,
        };
    }
    let t = idx.dims()[1];
    let device = idx.device();
    let pos = Tensor::<1, Int>::arange(start as i64..(start + t) as i64, &device).reshape([1, t]);
    let x = wte.forward(idx) + wpe.forward(pos); // (B, T, C) + (1, T, C)
    pass.composite_dropout(drop, x)
}

/// LayerNorm over the last dimension.
pub(crate) fn layer_norm<const D: usize>(ln: &LayerNorm, x: Tensor<D>, pass: Pass) -> Tensor<D> {
    if pass.fused {
        let beta = ln.beta.as_ref().map(|b| b.val());
        fused::layer_norm(x, ln.gamma.val(), beta, pass.eps)
    } else {
        ln.forward(x)
    }
}

/// `x W + b`.
pub(crate) fn linear<const D: usize>(l: &Linear, x: Tensor<D>, pass: Pass) -> Tensor<D> {
    if pass.fused {
        fused::linear(x, l.weight.val(), l.bias.as_ref().map(|b| b.val()), None)
    } else {
        l.forward(x)
    }
}

/// A residual branch's output projection: `residual + dropout(x W + b)`.
pub(crate) fn project_residual<const D: usize>(
    l: &Linear,
    drop: &Dropout,
    x: Tensor<D>,
    residual: Tensor<D>,
    pass: Pass,
    (layer, site): (usize, Site),
) -> Tensor<D> {
    if !pass.fused {
        return residual + pass.composite_dropout(drop, l.forward(x));
    }
    let bias = l.bias.as_ref().map(|b| b.val());
    match pass.mask(drop, layer, site) {
        Some(mask) => {
            let y = fused::linear(x, l.weight.val(), bias, None);
            fused::dropout(y, Some(residual), mask)
        }
        None => fused::linear(x, l.weight.val(), bias, Some(residual)),
    }
}

/// `gelu(x W + b)`, with the GELU `activation`. The fused version adds the bias in the GELU's
/// pass.
pub(crate) fn linear_gelu<const D: usize>(
    l: &Linear,
    activation: Activation,
    x: Tensor<D>,
    pass: Pass,
) -> Tensor<D> {
    let tanh = activation == Activation::GeluTanh;
    if pass.fused {
        let h = fused::linear(x, l.weight.val(), None, None);
        fused::gelu(h, l.bias.as_ref().map(|b| b.val()), tanh)
    } else if tanh {
        gelu_approximate(l.forward(x))
    } else {
        composite_gelu(l.forward(x))
    }
}

/// Final LayerNorm, the head tied to the token embedding, and the mean cross-entropy of
/// `targets`.
///
/// # Shapes
/// - x: `[B, T, C]`, targets: `[B, T]` -> `[1]`
pub(crate) fn head_loss(
    ln_f: &LayerNorm,
    wte: &Embedding,
    x: Tensor<3>,
    targets: Tensor<2, Int>,
    pass: Pass,
) -> Tensor<1> {
    let x = layer_norm(ln_f, x, pass);
    if pass.fused {
        fused::head_loss(x, wte.weight.val(), targets)
    } else {
        cross_entropy(head(wte, x, pass), targets)
    }
}

/// The head tied to the token embedding: logits = x @ wteᵀ, for inference (no gradient: the
/// fused version is an inference op).
///
/// # Shapes
/// - x: `[B, T, C]` -> `[B, T, V]`
pub(crate) fn head(wte: &Embedding, x: Tensor<3>, pass: Pass) -> Tensor<3> {
    if pass.fused && !x.device().is_autodiff() {
        return fused::head(x, wte.weight.val());
    }
    let w = wte.weight.val(); // (V, C)
    let [v, c] = w.dims();
    x.matmul(w.transpose().reshape([1, c, v]))
}

/// Mean negative log-likelihood of `targets` under `logits`.
///
/// # Shapes
/// - logits: `[B, T, V]`, targets: `[B, T]` -> `[1]`
pub fn cross_entropy(logits: Tensor<3>, targets: Tensor<2, Int>) -> Tensor<1> {
    let [b, t, v] = logits.dims();
    let logp = log_softmax(logits.reshape([b * t, v]), 1); // (B*T, V)
    let picked = logp.gather(1, targets.reshape([b * t, 1])); // (B*T, 1)
    picked.mean().neg()
}

#[cfg(all(test, feature = "flex"))]
mod tests;
