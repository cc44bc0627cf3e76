//! The layers as single Burn operations on the Flex (CPU) backend, each computed by its
//! hand-written kernel from `cinder-kernels` and carrying its own backward pass (Burn's backend
//! extension). [`Layers`] is implemented twice: for `Flex` (the forward alone: inference) and for
//! `Autodiff<Flex>` (the forward, and a `Backward` step of Burn's graph that calls the kernel's
//! backward). The kernels themselves are in [`kernels`], over the buffers of [`buffers`].
//!
//! Every operation treats its input as rows of its last dimension (`[B, T, C]` as `[B*T, C]`),
//! and the output keeps the input's leading dimensions. An optional input (a bias, a residual)
//! is passed as an empty tensor when absent; no gradient flows to it.

use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{Dispatch, Flex, backend_extension};
use burn::prelude::*;
use cinder_kernels::adamw::{self, Update};
use cinder_kernels::attention::{self, CachedShape};
use cinder_kernels::dropout::Mask;
use cinder_kernels::matmul::Mat;
use cinder_kernels::{QkvLayout, activation, loss, muon, rotary};

use crate::Activation;

mod buffers;
mod graph;
mod kernels;
use buffers::*;
use graph::*;
use kernels::*;

/// The layers that have a fused version, for training (and inference) on Flex.
#[backend_extension(Flex, Autodiff)]
pub trait Layers: burn::backend::Backend {
    /// `wte[ids] + wpe[starts[b]..]` (`wpe` empty: `wte[ids]`; `starts` empty: all from 0):
    /// `[B, T]` ids -> `[B, T, C]`.
    fn embed(
        ids: IntTensor<Self>,
        wte: FloatTensor<Self>,
        wpe: FloatTensor<Self>,
        starts: Vec<usize>,
    ) -> FloatTensor<Self>;
    /// LayerNorm over the last dimension (`beta` empty: no shift).
    fn layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f32,
    ) -> FloatTensor<Self>;
    /// RMSNorm without gain over the last dimension.
    fn rms_norm(x: FloatTensor<Self>, eps: f32) -> FloatTensor<Self>;
    /// QK-norm and RoPE on attention's `[B, T, W]` projection (`cinder_kernels::rotary`).
    fn rotate_qk(qkv: FloatTensor<Self>, qk: rotary::Qk) -> FloatTensor<Self>;
    /// `residual + (x W + b)` (`bias`, `residual`: empty when absent).
    fn linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        residual: FloatTensor<Self>,
    ) -> FloatTensor<Self>;
    /// The GELU `kind` of `x + bias` (`bias`, added to each row: empty when absent).
    fn activation(
        x: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        kind: activation::Kind,
    ) -> FloatTensor<Self>;
    /// Causal self-attention on the fused `[B, T, W]` projection laid out as `layout` says ->
    /// `[B, T, C]`; dropout on the weights when `p > 0`.
    fn attention(qkv: FloatTensor<Self>, layout: QkvLayout, p: f32, seed: u64)
    -> FloatTensor<Self>;
    /// `residual + x ⊙ mask` (`residual` empty: `x ⊙ mask`), the mask drawn from `seed` (see
    /// `cinder_kernels::dropout`).
    fn dropout(
        x: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        p: f32,
        seed: u64,
    ) -> FloatTensor<Self>;
    /// Mean cross-entropy of `targets` under the head's logits `x wᵀ`, soft-capped when
    /// `softcap > 0`: `[1]`.
    fn head_loss(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        targets: IntTensor<Self>,
        softcap: f32,
    ) -> FloatTensor<Self>;
}

/// Inference-only operations on plain Flex.
#[backend_extension(Flex)]
pub trait Inference: burn::backend::Backend {
    /// Attention of the new positions `[S, T_new, W]` over a key/value cache (keys
    /// `[P, KV, block]`, values `[P, block, KV]`) that they are written into: text `s` in place
    /// `places[s]`, after the `starts[s]` positions it has there; returns `(y, keys, values)`,
    /// `y` being `[S, T_new, C]` or, with `last_only`, `[S, 1, C]`.
    fn cached_attention(
        qkv: FloatTensor<Self>,
        keys: FloatTensor<Self>,
        values: FloatTensor<Self>,
        starts: Vec<usize>,
        places: Vec<usize>,
        layout: QkvLayout,
        last_only: bool,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
    /// The head's logits `x wᵀ`, soft-capped when `softcap > 0`: `[.., C]` -> `[.., V]`; `w`
    /// is `[V, C]`, or with `columns` a copy laid out `[C, V]` ([`loss::logits`]).
    fn head(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        softcap: f32,
        columns: bool,
    ) -> FloatTensor<Self>;
}

/// The optimizer's fused passes, on plain Flex.
#[backend_extension(Flex)]
pub trait Optim: burn::backend::Backend {
    /// One AdamW step of a parameter: returns the parameter and its two moments.
    fn adamw(
        p: FloatTensor<Self>,
        g: FloatTensor<Self>,
        m: FloatTensor<Self>,
        v: FloatTensor<Self>,
        update: Update,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
    /// `Σ x²`, `[1]` (summed in f64, stored as f32).
    fn sum_squares(x: FloatTensor<Self>) -> FloatTensor<Self>;
    /// Muon's orthogonalisation of an update `[in, out]` seen as matrices of these widths side
    /// by side (none: one matrix).
    fn orthogonalise(u: FloatTensor<Self>, widths: Vec<usize>) -> FloatTensor<Self>;
    /// Muon's orthogonalisation of several updates at once, laid end to end in `u` (`[n]`),
    /// each `(rows, cols, widths)`.
    fn orthogonalise_all(
        u: FloatTensor<Self>,
        updates: Vec<(usize, usize, Vec<usize>)>,
    ) -> FloatTensor<Self>;
    /// NorMuon's normalisation of an orthogonalised update `[in, out]` (matrices of these widths
    /// side by side) with the running means `second`: returns both, updated.
    fn normalise(
        u: FloatTensor<Self>,
        second: FloatTensor<Self>,
        widths: Vec<usize>,
        beta2: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);
}

// ---------------------------------------------------------------------------------------------
// Tensor-level entry points, for the model and its optimizer.

pub fn embed(
    ids: Tensor<2, Int>,
    wte: Tensor<2>,
    wpe: Option<Tensor<2>>,
    starts: &[usize],
) -> Tensor<3> {
    let device = wte.device();
    Tensor::from_dispatch(<Dispatch as Layers>::embed(
        ids.into_dispatch(),
        wte.into_dispatch(),
        or_empty(wpe, &device),
        starts.to_vec(),
    ))
}

pub fn rms_norm<const D: usize>(x: Tensor<D>, eps: f32) -> Tensor<D> {
    Tensor::from_dispatch(<Dispatch as Layers>::rms_norm(x.into_dispatch(), eps))
}

pub fn rotate_qk(qkv: Tensor<3>, qk: rotary::Qk) -> Tensor<3> {
    Tensor::from_dispatch(<Dispatch as Layers>::rotate_qk(qkv.into_dispatch(), qk))
}

pub fn layer_norm<const D: usize>(
    x: Tensor<D>,
    gamma: Tensor<1>,
    beta: Option<Tensor<1>>,
    eps: f32,
) -> Tensor<D> {
    let device = x.device();
    Tensor::from_dispatch(<Dispatch as Layers>::layer_norm(
        x.into_dispatch(),
        gamma.into_dispatch(),
        or_empty(beta, &device),
        eps,
    ))
}

pub fn linear<const D: usize>(
    x: Tensor<D>,
    weight: Tensor<2>,
    bias: Option<Tensor<1>>,
    residual: Option<Tensor<D>>,
) -> Tensor<D> {
    let device = x.device();
    Tensor::from_dispatch(<Dispatch as Layers>::linear(
        x.into_dispatch(),
        weight.into_dispatch(),
        or_empty(bias, &device),
        or_empty(residual, &device),
    ))
}

/// `t`, or an empty tensor that stands for its absence.
fn or_empty<const D: usize>(
    t: Option<Tensor<D>>,
    device: &Device,
) -> burn::backend::DispatchTensor {
    t.unwrap_or_else(|| Tensor::<D>::empty([0; D], device))
        .into_dispatch()
}

/// The MLP's `activation` of `x + bias`.
pub fn activation<const D: usize>(
    x: Tensor<D>,
    bias: Option<Tensor<1>>,
    activation: Activation,
) -> Tensor<D> {
    let kind = match activation {
        Activation::Gelu => activation::Kind::Erf,
        Activation::GeluTanh => activation::Kind::Tanh,
        Activation::Relu2 => activation::Kind::Relu2,
    };
    let device = x.device();
    Tensor::from_dispatch(<Dispatch as Layers>::activation(
        x.into_dispatch(),
        or_empty(bias, &device),
        kind,
    ))
}

pub fn attention(qkv: Tensor<3>, layout: QkvLayout, mask: Option<Mask>) -> Tensor<3> {
    let (p, seed) = mask.map_or((0.0, 0), |m| (m.p, m.seed));
    Tensor::from_dispatch(<Dispatch as Layers>::attention(
        qkv.into_dispatch(),
        layout,
        p,
        seed,
    ))
}

pub fn dropout<const D: usize>(x: Tensor<D>, residual: Option<Tensor<D>>, mask: Mask) -> Tensor<D> {
    let device = x.device();
    Tensor::from_dispatch(<Dispatch as Layers>::dropout(
        x.into_dispatch(),
        or_empty(residual, &device),
        mask.p,
        mask.seed,
    ))
}

pub fn head_loss(x: Tensor<3>, w: Tensor<2>, targets: Tensor<2, Int>, softcap: f32) -> Tensor<1> {
    Tensor::from_dispatch(<Dispatch as Layers>::head_loss(
        x.into_dispatch(),
        w.into_dispatch(),
        targets.into_dispatch(),
        softcap,
    ))
}

pub fn head<const D: usize>(x: Tensor<D>, w: Tensor<2>, softcap: f32, columns: bool) -> Tensor<D> {
    Tensor::from_dispatch(<Dispatch as Inference>::head(
        x.into_dispatch(),
        w.into_dispatch(),
        softcap,
        columns,
    ))
}

pub fn cached_attention(
    qkv: Tensor<3>,
    cache: (Tensor<3>, Tensor<3>),
    starts: &[usize],
    places: &[usize],
    layout: QkvLayout,
    last_only: bool,
) -> (Tensor<3>, (Tensor<3>, Tensor<3>)) {
    let (y, k, v) = <Dispatch as Inference>::cached_attention(
        qkv.into_dispatch(),
        cache.0.into_dispatch(),
        cache.1.into_dispatch(),
        starts.to_vec(),
        places.to_vec(),
        layout,
        last_only,
    );
    let t = |x| Tensor::<3>::from_dispatch(x);
    (t(y), (t(k), t(v)))
}

/// One AdamW step of parameter `p` with gradient `g` and moments `m`, `v`: the new parameter
/// and moments.
pub fn adamw<const D: usize>(
    p: Tensor<D>,
    g: Tensor<D>,
    m: Tensor<D>,
    v: Tensor<D>,
    update: Update,
) -> (Tensor<D>, Tensor<D>, Tensor<D>) {
    let (p, m, v) = <Dispatch as Optim>::adamw(
        p.into_dispatch(),
        g.into_dispatch(),
        m.into_dispatch(),
        v.into_dispatch(),
        update,
    );
    let t = |x| Tensor::<D>::from_dispatch(x);
    (t(p), t(m), t(v))
}

/// `Σ x²`.
pub fn sum_squares<const D: usize>(x: Tensor<D>) -> f64 {
    Tensor::<1>::from_dispatch(<Dispatch as Optim>::sum_squares(x.into_dispatch()))
        .into_scalar::<f64>()
}

/// Muon's orthogonalisation of `u` `[in, out]`, seen as matrices of these widths side by side
/// (none: one matrix).
pub fn orthogonalise(u: Tensor<2>, widths: &[usize]) -> Tensor<2> {
    Tensor::from_dispatch(<Dispatch as Optim>::orthogonalise(
        u.into_dispatch(),
        widths.to_vec(),
    ))
}

/// Muon's orthogonalisation of several updates `[in, out]` at once, each seen as matrices of its
/// widths side by side (none: one matrix): in parallel, one to a thread.
pub fn orthogonalise_all(updates: Vec<(Tensor<2>, Vec<usize>)>) -> Vec<Tensor<2>> {
    if updates.is_empty() {
        return Vec::new();
    }
    let shapes: Vec<(usize, usize, Vec<usize>)> = updates
        .iter()
        .map(|(u, widths)| {
            let [rows, cols] = u.dims();
            (rows, cols, widths.clone())
        })
        .collect();
    let flat = Tensor::cat(
        updates
            .into_iter()
            .map(|(u, _)| {
                let n = u.shape().num_elements();
                u.reshape([n])
            })
            .collect(),
        0,
    );
    let out: Tensor<1> = Tensor::from_dispatch(<Dispatch as Optim>::orthogonalise_all(
        flat.into_dispatch(),
        shapes.clone(),
    ));
    let mut at = 0;
    shapes
        .iter()
        .map(|&(rows, cols, _)| {
            let part = out.clone().narrow(0, at, rows * cols).reshape([rows, cols]);
            at += rows * cols;
            part
        })
        .collect()
}

/// NorMuon's normalisation of `u` `[in, out]` (matrices of these widths side by side; never
/// empty) with the running means `second`: the update and the means.
pub fn normalise(
    u: Tensor<2>,
    second: Tensor<1>,
    widths: &[usize],
    beta2: f32,
) -> (Tensor<2>, Tensor<1>) {
    let (u, second) = <Dispatch as Optim>::normalise(
        u.into_dispatch(),
        second.into_dispatch(),
        widths.to_vec(),
        beta2,
    );
    (Tensor::from_dispatch(u), Tensor::from_dispatch(second))
}

// ---------------------------------------------------------------------------------------------
// The implementations.

fn mask(p: f32, seed: u64) -> Option<Mask> {
    (p > 0.0).then_some(Mask { p, seed })
}

/// The operations of [`Layers`] whose kernel runs alike with and without autodiff: written once,
/// for both implementations ([`Runs`]).
macro_rules! implemented_alike {
    () => {
        fn embed(
            idx: IntTensor<Self>,
            wte: FloatTensor<Self>,
            wpe: FloatTensor<Self>,
            starts: Vec<usize>,
        ) -> FloatTensor<Self> {
            let [_, seq] = dims(&idx).try_into().expect("ids are [B, T]");
            let kernel = Embed {
                ids: ids(&idx),
                seq,
                starts,
            };
            Self::run(kernel, [wte, wpe])
        }
        fn layer_norm(
            x: FloatTensor<Self>,
            g: FloatTensor<Self>,
            b: FloatTensor<Self>,
            eps: f32,
        ) -> FloatTensor<Self> {
            Self::run(LayerNorm { eps }, [x, g, b])
        }
        fn rms_norm(x: FloatTensor<Self>, eps: f32) -> FloatTensor<Self> {
            Self::run(RmsNorm { eps }, [x])
        }
        fn rotate_qk(qkv: FloatTensor<Self>, qk: rotary::Qk) -> FloatTensor<Self> {
            Self::run(RotateQk(qk), [qkv])
        }
        fn linear(
            x: FloatTensor<Self>,
            w: FloatTensor<Self>,
            b: FloatTensor<Self>,
            r: FloatTensor<Self>,
        ) -> FloatTensor<Self> {
            Self::run(Linear, [x, w, b, r])
        }
        fn attention(
            qkv: FloatTensor<Self>,
            layout: QkvLayout,
            p: f32,
            seed: u64,
        ) -> FloatTensor<Self> {
            let mask = mask(p, seed);
            Self::run(Attention { layout, mask }, [qkv])
        }
        fn dropout(
            x: FloatTensor<Self>,
            r: FloatTensor<Self>,
            p: f32,
            seed: u64,
        ) -> FloatTensor<Self> {
            let m = mask(p, seed).expect("dropout with p > 0");
            Self::run(Dropout(m), [x, r])
        }
        fn head_loss(
            x: FloatTensor<Self>,
            w: FloatTensor<Self>,
            targets: IntTensor<Self>,
            softcap: f32,
        ) -> FloatTensor<Self> {
            let targets = ids(&targets);
            Self::run(HeadLoss { targets, softcap }, [x, w])
        }
    };
}

impl Layers for Flex {
    implemented_alike!();

    fn activation(x: FlexTensor, bias: FlexTensor, kind: activation::Kind) -> FlexTensor {
        // Inference: the value alone, without the derivative the backward pass would need, in
        // place in the input's buffer (the linear layer's fresh output) when nothing else
        // holds it.
        let mut x = owned(x);
        let b = floats(&bias);
        activation::forward_in_place(
            kind,
            x.storage_mut::<f32>(),
            present(&bias).then_some(&b[..]),
        );
        x
    }
}

impl<C: CheckpointStrategy> Layers for Ad<C> {
    implemented_alike!();

    fn activation(x: AdTensor<C>, bias: AdTensor<C>, kind: activation::Kind) -> AdTensor<C> {
        Self::run(Activate(kind), [x, bias])
    }
}

impl Inference for Flex {
    fn cached_attention(
        qkv: FlexTensor,
        keys: FlexTensor,
        values: FlexTensor,
        starts: Vec<usize>,
        places: Vec<usize>,
        layout: QkvLayout,
        last_only: bool,
    ) -> (FlexTensor, FlexTensor, FlexTensor) {
        let [samples, new, width] = dims(&qkv).try_into().expect("qkv is [S, T, W]");
        let [room, block, kv] = dims(&values).try_into().expect("values are [P, block, KV]");
        assert_eq!(dims(&keys), [room, kv, block], "keys are [P, KV, block]");
        assert_eq!((width, kv), (layout.width(), layout.kv_width()));
        let s = CachedShape {
            samples,
            new,
            block,
            room,
            layout,
        };
        let c = layout.q_width();
        let rows = if last_only { 1 } else { new };
        let mut y = zeros(samples * rows * c);
        // Written in place when the cache is not shared (the sampler's own), else copied; a
        // view of part of a buffer is made whole first (the kernel takes the whole buffer).
        let (mut keys, mut values) = (owned(keys), owned(values));
        attention::forward_cached(
            &floats(&qkv),
            keys.storage_mut::<f32>(),
            values.storage_mut::<f32>(),
            s,
            &starts,
            &places,
            last_only,
            &mut y,
        );
        (tensor(y, [samples, rows, c]), keys, values)
    }

    fn head(x: FlexTensor, w: FlexTensor, softcap: f32, columns: bool) -> FlexTensor {
        let (shape, [rows, cols]) = (dims(&x), [dims(&w)[0], dims(&w)[1]]);
        let (xs, ws) = (floats(&x), floats(&w));
        let head = match columns {
            true => Mat::new(&ws, rows, cols),      // [C, V]
            false => Mat::new(&ws, rows, cols).t(), // [V, C], transposed as strides
        };
        let mut out = zeros(xs.len() / head.rows * head.cols);
        loss::logits(&xs, head, softcap, &mut out);
        tensor(out, with_last(&shape, head.cols))
    }
}

impl Optim for Flex {
    fn adamw(
        p: FlexTensor,
        g: FlexTensor,
        m: FlexTensor,
        v: FlexTensor,
        update: Update,
    ) -> (FlexTensor, FlexTensor, FlexTensor) {
        // In place where a tensor is not shared (the moments are the optimizer's own; the
        // parameter may still be held by the model), else on a copy.
        let [mut p, mut m, mut v] = [p, m, v].map(owned);
        adamw::update(
            p.storage_mut::<f32>(),
            &floats(&g),
            m.storage_mut::<f32>(),
            v.storage_mut::<f32>(),
            update,
        );
        (p, m, v)
    }

    fn sum_squares(x: FlexTensor) -> FlexTensor {
        tensor(vec![adamw::sum_squares(&floats(&x)) as f32], [1])
    }

    fn orthogonalise(u: FlexTensor, widths: Vec<usize>) -> FlexTensor {
        let [rows, cols] = dims(&u).try_into().expect("a Muon update is a matrix");
        tensor(
            muon::orthogonalise(&floats(&u), rows, &muon::matrices(&widths, cols)),
            [rows, cols],
        )
    }

    fn orthogonalise_all(u: FlexTensor, updates: Vec<(usize, usize, Vec<usize>)>) -> FlexTensor {
        let u = floats(&u);
        tensor(muon::orthogonalise_all(&u, &updates), [u.len()])
    }

    fn normalise(
        u: FlexTensor,
        second: FlexTensor,
        widths: Vec<usize>,
        beta2: f32,
    ) -> (FlexTensor, FlexTensor) {
        let [rows, _] = dims(&u).try_into().expect("a Muon update is a matrix");
        let [mut u, mut second] = [u, second].map(owned);
        muon::normalise(
            u.storage_mut::<f32>(),
            rows,
            &widths,
            second.storage_mut::<f32>(),
            beta2,
        );
        (u, second)
    }
}
