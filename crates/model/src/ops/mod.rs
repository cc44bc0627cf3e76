//! The layers as operations. Each has a composite version written with Burn's tensor operations,
//! which runs on every backend and is the reference, and on the Flex (CPU) backend a fused
//! version ([`fused`]: one hand-written kernel from `cinder-kernels` with its own backward pass).
//! The modules of this crate call the functions here; a [`Pass`] says which version runs and
//! which dropout masks apply.

use burn::nn::{Dropout, Embedding, LayerNorm, Linear};
use burn::prelude::*;
use burn::tensor::activation::{gelu as composite_gelu, gelu_approximate, log_softmax};
use cinder_kernels::QkvLayout;
use cinder_kernels::dropout::{Mask, site_seed};
use cinder_kernels::position_rows;
use cinder_kernels::rotary::{self, Qk};

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

/// Token plus (learned, when `wpe`) position embeddings for the tokens of each row from its
/// position `starts[b]` (`starts` empty: all from 0; `cinder_kernels::start_of`),
/// RMS-normalised when `normalise`, and the embedding dropout.
///
/// # Shapes
/// - idx: `[B, T]`, starts: `[B]` or `[0]` -> `[B, T, C]`
pub(crate) fn embed(
    wte: &Embedding,
    wpe: Option<&Embedding>,
    normalise: bool,
    drop: &Dropout,
    idx: Tensor<2, Int>,
    starts: &[usize],
    pass: Pass,
) -> Tensor<3> {
    fused_or!(pass.fused,
        fused => {
            let (wte, wpe) = (wte.weight.val(), wpe.map(|e| e.weight.val()));
            let mut x = fused::embed(idx, wte, wpe, starts);
            if normalise {
                x = fused::rms_norm(x, pass.eps);
            }
            match pass.mask(drop, 0, Site::Embedding) {
                Some(mask) => fused::dropout(x, None, mask),
                None => x,
            }
        },
        composite => {
            let [_, t] = idx.dims();
            let device = idx.device();
            let mut x = wte.forward(idx);
            if let Some(wpe) = wpe {
                let firsts = position_rows(starts);
                let pos: Vec<i64> = firsts.iter().flat_map(|&s| (s..s + t).map(|p| p as i64)).collect();
                let pos = Tensor::<2, Int>::from_data(TensorData::new(pos, [firsts.len(), t]), &device);
                x = x + wpe.forward(pos); // (B, T, C) + (B or 1, T, C)
            }
            if normalise {
                x = composite_rms_norm(x, pass.eps);
            }
            pass.composite_dropout(drop, x)
        },
    )
}

/// The norm over the last dimension: `ln`, a LayerNorm, or (without one) an RMSNorm without
/// gain.
pub(crate) fn norm<const D: usize>(ln: Option<&LayerNorm>, x: Tensor<D>, pass: Pass) -> Tensor<D> {
    match ln {
        Some(ln) => fused_or!(pass.fused,
            fused => {
                let beta = ln.beta.as_ref().map(|b| b.val());
                fused::layer_norm(x, ln.gamma.val(), beta, pass.eps)
            },
            composite => ln.forward(x),
        ),
        None => fused_or!(pass.fused,
            fused => fused::rms_norm(x, pass.eps),
            composite => composite_rms_norm(x, pass.eps),
        ),
    }
}

/// `x / sqrt(mean(x²) + eps)` over the last dimension.
fn composite_rms_norm<const D: usize>(x: Tensor<D>, eps: f32) -> Tensor<D> {
    let ms = x.clone().square().mean_dim(D - 1); // (.., 1)
    x / (ms + eps as f64).sqrt()
}

/// The queries and keys of attention's `[B, T, W]` projection (laid out as `layout` says), for
/// the tokens of each row from its position `starts[b]` (as in [`embed`]): each head's
/// RMS-normalised when `qk_norm`, then turned by its position when `rope` (see
/// `cinder_kernels::rotary`). Values are unchanged.
///
/// # Shapes
/// - qkv: `[B, T, W]`, starts: `[B]` or `[0]` -> `[B, T, W]`
pub(crate) fn rotate_qk(
    qkv: Tensor<3>,
    layout: QkvLayout,
    starts: &[usize],
    rope: bool,
    qk_norm: bool,
    pass: Pass,
) -> Tensor<3> {
    if !rope && !qk_norm {
        return qkv;
    }
    let [b, t, _] = qkv.dims();
    let s = Qk {
        layout,
        seq: t,
        starts: starts.to_vec(),
        rope,
        norm_eps: qk_norm.then_some(pass.eps),
    };
    fused_or!(pass.fused,
        fused => fused::rotate_qk(qkv, s),
        composite => {
            let hs = layout.head_size;
            let half = hs / 2;
            let device = qkv.device();
            let firsts = position_rows(starts);
            let (mut cos, mut sin) = (Vec::new(), Vec::new());
            for &first in &firsts {
                let (c, s) = rotary::rope_table(first, t, hs);
                cos.extend(c);
                sin.extend(s);
            }
            let table = |v: Vec<f32>| {
                Tensor::<4>::from_data(TensorData::new(v, [firsts.len(), t, 1, half]), &device)
            };
            let (cos, sin) = (table(cos), table(sin));
            // The `heads` heads of the columns `cols`, normalised and turned.
            let turn = |cols: std::ops::Range<usize>, heads: usize| {
                let width = cols.len();
                let mut x = qkv.clone().narrow(2, cols.start, width).reshape([b, t, heads, hs]);
                if let Some(eps) = s.norm_eps {
                    x = composite_rms_norm(x, eps);
                }
                if rope {
                    let (x1, x2) = (x.clone().narrow(3, 0, half), x.narrow(3, half, half));
                    let y1 = x1.clone() * cos.clone() - x2.clone() * sin.clone();
                    let y2 = x1 * sin.clone() + x2 * cos.clone();
                    x = Tensor::cat(vec![y1, y2], 3);
                }
                x.reshape([b, t, width])
            };
            let values = qkv.clone().narrow(2, layout.v().start, layout.kv_width());
            let q = turn(layout.q(), layout.n_head);
            Tensor::cat(vec![q, turn(layout.k(), layout.n_kv_head), values], 2)
        },
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

/// The head `w` `[V, C]` (the token embedding, or its own), soft-capped at `softcap` when
/// positive, and the mean cross-entropy of `targets`.
///
/// # Shapes
/// - x: `[B, T, C]` (normalised), targets: `[B, T]` -> `[1]`
pub(crate) fn head_loss(
    w: Tensor<2>,
    softcap: f32,
    x: Tensor<3>,
    targets: Tensor<2, Int>,
    pass: Pass,
) -> Tensor<1> {
    fused_or!(pass.fused,
        fused => fused::head_loss(x, w, targets, softcap),
        composite => cross_entropy(head(HeadWeight::Rows(w), softcap, x, pass), targets),
    )
}

/// The head's weight as its product takes it.
#[derive(Clone, Debug)]
pub(crate) enum HeadWeight {
    /// `[V, C]`, the model's own (the product takes it transposed, as strides).
    Rows(Tensor<2>),
    /// `[C, V]`, a copy laid out for the product, which a key/value cache keeps: a row's
    /// logits are then the same bits whatever rows are beside it (BENCHMARKS.md section 37).
    Columns(Tensor<2>),
}

impl HeadWeight {
    /// The weight `[C, V]`: a view of the model's own, or the copy.
    fn columns(self) -> Tensor<2> {
        match self {
            HeadWeight::Rows(w) => w.transpose(),
            HeadWeight::Columns(w) => w,
        }
    }
}

/// The head's logits, `x wᵀ` with `w` as [`HeadWeight`] gives it, soft-capped at `softcap` when
/// positive. The
/// fused version is an inference op (no gradient), so a pass with autodiff takes the composite
/// one.
///
/// # Shapes
/// - x: `[B, T, C]` -> `[B, T, V]`
pub(crate) fn head(w: HeadWeight, softcap: f32, x: Tensor<3>, pass: Pass) -> Tensor<3> {
    let composite = |x: Tensor<3>, w: HeadWeight| {
        let w = w.columns();
        let [c, v] = w.dims();
        let logits = x.matmul(w.reshape([1, c, v]));
        if softcap > 0.0 {
            let cap = f64::from(softcap);
            (logits / cap).tanh() * cap
        } else {
            logits
        }
    };
    fused_or!(pass.fused,
        fused => if x.device().is_autodiff() {
            composite(x, w)
        } else {
            match w {
                HeadWeight::Rows(w) => fused::head(x, w, softcap, false),
                HeadWeight::Columns(w) => fused::head(x, w, softcap, true),
            }
        },
        composite => composite(x, w),
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
