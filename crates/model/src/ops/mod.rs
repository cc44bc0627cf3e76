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

pub mod adamw;
#[cfg(feature = "flex")]
pub mod fused;
pub mod muon;

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
    /// Whether the fused layers run on `device`: the one place that decides.
    pub fn fused_on(self, device: &Device) -> bool {
        self == Ops::Fused && has_fused(device)
    }

    /// The layers that run on `device`: `Fused` only where the backend has them.
    pub fn on(self, device: &Device) -> Ops {
        if self.fused_on(device) {
            Ops::Fused
        } else {
            Ops::Composite
        }
    }

    /// `"fused"` or `"composite"`, as in messages and benchmark output.
    pub fn name(self) -> &'static str {
        match self {
            Ops::Fused => "fused",
            Ops::Composite => "composite",
        }
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

/// The places a block applies dropout (the fused path's masks are keyed by them).
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "flex"), allow(dead_code))]
pub(crate) enum Site {
    Embedding = 0,
    AttentionWeights = 1,
    AttentionOutput = 2,
    MlpOutput = 3,
}

/// How one forward pass runs.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "flex"), allow(dead_code))] // eps: the fused LayerNorm's
pub(crate) struct Pass {
    pub fused: bool,
    /// Dropout applies (training) when set.
    pub dropout: Option<DropoutKey>,
    /// The LayerNorms' epsilon.
    pub eps: f32,
}

impl Pass {
    /// A pass on the composite layers without dropout, with LayerNorm epsilon `eps`.
    pub fn composite(eps: f32) -> Self {
        Pass {
            fused: false,
            dropout: None,
            eps,
        }
    }

    /// The fused mask of `dropout` at `site` of block `layer`, if it drops anything.
    #[cfg_attr(not(feature = "flex"), allow(dead_code))]
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

/// The fused version of an operation when `use_fused` (a pass's `fused`, or [`has_fused`]),
/// else the composite one: the one place that knows whether the fused layers are compiled in.
/// Without the `flex` feature the fused branch is not compiled, and `use_fused` is never true.
macro_rules! fused_or {
    ($use_fused:expr, fused => $fused:expr, composite => $composite:expr $(,)?) => {{
        #[cfg(feature = "flex")]
        let value = if $use_fused { $fused } else { $composite };
        #[cfg(not(feature = "flex"))]
        let value = {
            let _ = $use_fused;
            $composite
        };
        value
    }};
}
pub(crate) use fused_or;

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
    fused_or!(pass.fused,
        fused => {
            let x = fused::embed(idx, wte.weight.val(), wpe.weight.val(), start);
            match pass.mask(drop, 0, Site::Embedding) {
                Some(mask) => fused::dropout(x, None, mask),
                None => x,
            }
        },
        composite => {
            let t = idx.dims()[1];
            let device = idx.device();
            let pos = Tensor::<1, Int>::arange(start as i64..(start + t) as i64, &device)
                .reshape([1, t]);
            let x = wte.forward(idx) + wpe.forward(pos); // (B, T, C) + (1, T, C)
            pass.composite_dropout(drop, x)
        },
    )
}

/// LayerNorm over the last dimension.
pub(crate) fn layer_norm<const D: usize>(ln: &LayerNorm, x: Tensor<D>, pass: Pass) -> Tensor<D> {
    fused_or!(pass.fused,
        fused => {
            let beta = ln.beta.as_ref().map(|b| b.val());
            fused::layer_norm(x, ln.gamma.val(), beta, pass.eps)
        },
        composite => ln.forward(x),
    )
}

/// `x W + b`.
pub(crate) fn linear<const D: usize>(l: &Linear, x: Tensor<D>, pass: Pass) -> Tensor<D> {
    fused_or!(pass.fused,
        fused => fused::linear(x, l.weight.val(), l.bias.as_ref().map(|b| b.val()), None),
        composite => l.forward(x),
    )
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
    fused_or!(pass.fused,
        fused => {
            let bias = l.bias.as_ref().map(|b| b.val());
            match pass.mask(drop, layer, site) {
                Some(mask) => {
                    let y = fused::linear(x, l.weight.val(), bias, None);
                    fused::dropout(y, Some(residual), mask)
                }
                None => fused::linear(x, l.weight.val(), bias, Some(residual)),
            }
        },
        composite => {
            let _ = (layer, site); // the composite path draws its masks from the device
            residual + pass.composite_dropout(drop, l.forward(x))
        },
    )
}

/// `act(x W + b)`, with the MLP's `activation`. The fused version adds the bias in the
/// activation's pass.
pub(crate) fn linear_activation<const D: usize>(
    l: &Linear,
    activation: Activation,
    x: Tensor<D>,
    pass: Pass,
) -> Tensor<D> {
    fused_or!(pass.fused,
        fused => {
            let h = fused::linear(x, l.weight.val(), None, None);
            fused::activation(h, l.bias.as_ref().map(|b| b.val()), activation)
        },
        composite => match activation {
            Activation::Gelu => composite_gelu(l.forward(x)),
            Activation::GeluTanh => gelu_approximate(l.forward(x)),
            Activation::Relu2 => burn::tensor::activation::relu(l.forward(x)).square(),
        },
    )
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
    fused_or!(pass.fused,
        fused => fused::head_loss(x, wte.weight.val(), targets),
        composite => cross_entropy(head(wte, x, pass), targets),
    )
}

/// The head tied to the token embedding: logits = x @ wteᵀ. The fused version is an inference
/// op (no gradient), so a pass with autodiff takes the composite one.
///
/// # Shapes
/// - x: `[B, T, C]` -> `[B, T, V]`
pub(crate) fn head(wte: &Embedding, x: Tensor<3>, pass: Pass) -> Tensor<3> {
    let composite = |x: Tensor<3>| {
        let w = wte.weight.val(); // (V, C)
        let [v, c] = w.dims();
        x.matmul(w.transpose().reshape([1, c, v]))
    };
    fused_or!(pass.fused,
        fused => if x.device().is_autodiff() {
            composite(x)
        } else {
            fused::head(x, wte.weight.val())
        },
        composite => composite(x),
    )
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
