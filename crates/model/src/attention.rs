//! Causal multi-head self-attention.
//!
//! Each position's embedding is projected to queries, keys and values (one fused linear layer,
//! laid out as [`QkvLayout`] says): `n_head` query heads, and `n_kv_head` key/value heads, each
//! shared by `n_head / n_kv_head` query heads (grouped-query attention; multi-head when they are
//! as many). A position's scores are its query against every key, scaled by
//! `1 / sqrt(head_size)`; positions in the future are masked out, the softmax turns scores into
//! weights, and the weights mix the values. Heads are concatenated and projected back.

use burn::nn::{Dropout, DropoutConfig, Linear};
use burn::prelude::*;
use burn::tensor::activation::softmax;

use crate::cache::{KvPart, LayerKv};
use crate::config::{GptConfig, Position};
use crate::init::{self, INIT_STD};
#[cfg(feature = "flex")]
use crate::ops::fused;
use crate::ops::{self, Pass, Site, fused_or};
use cinder_kernels::QkvLayout;

/// What a pass through the blocks keeps besides the residual stream: the one switch between
/// training and evaluation, cached sampling, and `inspect`'s attention maps.
pub(crate) enum Keep<'a> {
    /// Nothing: every position attends over the pass's own tokens (training, evaluation).
    Nothing,
    /// Row `b`'s tokens follow the `starts[b]` of the text in place `places[b]` of a part of the
    /// cache (read once per pass: `KvCache::split`), which is extended with theirs; only the last
    /// position leaves the last block (the next token's logits are all a sampler needs).
    Cache {
        cache: &'a mut KvPart,
        places: &'a [usize],
        starts: &'a [usize],
    },
    /// Every layer's attention weights, `[B, H, T, T]` each, are recorded (composite path).
    Weights(&'a mut Vec<Tensor<4>>),
}

impl Keep<'_> {
    /// Each row's first position (none when all start at 0).
    pub fn starts(&self) -> Vec<usize> {
        match self {
            Keep::Cache { starts, .. } => starts.to_vec(),
            _ => Vec::new(),
        }
    }

    /// Whether only the last position goes on after block `layer`'s attention.
    fn last_only(&self, layer: usize) -> bool {
        matches!(self, Keep::Cache { cache, .. } if layer + 1 == cache.n_layer())
    }
}

/// Masked multi-head self-attention.
#[derive(Module, Debug)]
pub struct CausalSelfAttention {
    /// `n_embd -> W`: queries, keys and values of all heads at once (`W`: the layout's width).
    pub c_attn: Linear,
    /// `C -> n_embd` (`C`: the queries' width): the output projection (a residual projection).
    pub c_proj: Linear,
    /// Dropout on the attention weights.
    pub attn_dropout: Dropout,
    /// Dropout on the output.
    pub resid_dropout: Dropout,
    /// Where the heads' queries, keys and values sit in `c_attn`'s output.
    #[module(skip)]
    pub layout: QkvLayout,
    /// Rotary embeddings turn the queries and keys by their position.
    #[module(skip)]
    pub rope: bool,
    /// Each head's queries and keys are RMS-normalised (before RoPE).
    #[module(skip)]
    pub qk_norm: bool,
    /// The epsilon of QK-norm (the model's `layer_norm_epsilon`).
    #[module(skip)]
    pub eps: f64,
}

impl CausalSelfAttention {
    /// The attention of a block of a model of `config`, GPT-2's initialisation (see
    /// [`crate::init`]).
    pub fn new(config: &GptConfig, device: &Device) -> Self {
        let (c, layout) = (config.n_embd, config.qkv_layout());
        let residual_std = init::residual_std(config);
        Self {
            c_attn: init::linear(config, c, layout.width(), INIT_STD, device),
            c_proj: init::linear(config, layout.q_width(), c, residual_std, device),
            attn_dropout: DropoutConfig::new(config.dropout).init(),
            resid_dropout: DropoutConfig::new(config.dropout).init(),
            layout,
            rope: config.position == Position::Rope,
            qk_norm: config.qk_norm,
            eps: config.layer_norm_epsilon,
        }
    }

    /// The projected attention output, on the composite path, without dropout.
    ///
    /// # Shapes
    /// - x: `[B, T, C]` -> `[B, T, C]`
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let residual = x.zeros_like();
        let pass = Pass::composite(self.eps as f32);
        self.forward_pass(x, residual, pass, 0, &mut Keep::Nothing)
    }

    /// `residual + attention(x)`, block `layer` of a pass, keeping what `keep` asks for.
    ///
    /// # Shapes
    /// - x, residual: `[B, T, C]` -> `[B, T, C]`, or `[B, 1, C]` when only the last position
    ///   goes on ([`Keep::Cache`] in the last block)
    pub(crate) fn forward_pass(
        &self,
        x: Tensor<3>,
        mut residual: Tensor<3>,
        pass: Pass,
        layer: usize,
        keep: &mut Keep,
    ) -> Tensor<3> {
        let qkv = ops::linear(&self.c_attn, x, pass); // (B, T, W)
        let starts = keep.starts();
        let qkv = ops::rotate_qk(qkv, self.layout, &starts, self.rope, self.qk_norm, pass);
        let last_only = keep.last_only(layer);
        let mut y = self.mix(qkv, pass, layer, keep, last_only);
        if last_only {
            let t = residual.dims()[1];
            residual = residual.narrow(1, t - 1, 1);
            if y.dims()[1] != 1 {
                y = y.narrow(1, t - 1, 1);
            }
        }
        let at = (layer, Site::AttentionOutput);
        ops::project_residual(&self.c_proj, &self.resid_dropout, y, residual, pass, at)
    }

    /// The attention of block `layer` on the `[B, T, W]` projection `qkv`: `[B, T, C]`, the
    /// heads side by side (`[B, 1, C]` may come back when `last_only`).
    #[cfg_attr(not(feature = "flex"), allow(unused_variables))] // last_only: the fused path's
    fn mix(
        &self,
        qkv: Tensor<3>,
        pass: Pass,
        layer: usize,
        keep: &mut Keep,
        last_only: bool,
    ) -> Tensor<3> {
        match keep {
            Keep::Nothing => fused_or!(pass.fused,
                fused => {
                    let mask = pass.mask(&self.attn_dropout, layer, Site::AttentionWeights);
                    fused::attention(qkv, self.layout, mask)
                },
                composite => self.composite(qkv, None, &[], pass).0,
            ),
            Keep::Cache {
                cache,
                places,
                starts,
            } => {
                let kv = cache.take(layer, &qkv, self.layout);
                let layout = self.layout;
                let (y, kv) = fused_or!(pass.fused,
                    fused => fused::cached_attention(qkv, kv, starts, places, layout, last_only),
                    composite => self.composite_cached(qkv, kv, starts, places, pass),
                );
                cache.put(layer, kv);
                y
            }
            Keep::Weights(weights) => {
                let (y, w) = self.composite(qkv, None, &[], pass);
                weights.push(w);
                y
            }
        }
    }

    /// The composite attention over the keys and values of the tokens seen before (`kv`, the
    /// cache's buffers, keys `[P, KV, block]` and values `[P, block, KV]`: row `b`'s text in place
    /// `places[b]`, its first `starts[b]` positions filled), which are written in: position `p`
    /// at slot `p % block`, a ring, as the fused kernel does
    /// (`cinder_kernels::attention::forward_cached`).
    fn composite_cached(
        &self,
        qkv: Tensor<3>,
        (keys, values): LayerKv,
        starts: &[usize],
        places: &[usize],
        pass: Pass,
    ) -> (Tensor<3>, LayerKv) {
        let [b, t, _] = qkv.dims();
        let (kv, block) = (self.layout.kv_width(), values.dims()[1]);
        let slots: Vec<usize> = starts.iter().map(|s| s % block).collect();
        // Rows in places side by side, in order (a text's samples): one slice for all.
        let first = places[0];
        let run = places.iter().enumerate().all(|(r, &p)| p == first + r);
        // Positions along `dim` (1 for values, 2 for keys, which are `[B, KV, T]` once swapped).
        let write = |mut buffer: Tensor<3>, part: std::ops::Range<usize>, dim: usize| {
            let new = qkv.clone().narrow(2, part.start, kv); // (B, T, KV)
            let new = if dim == 2 { new.swap_dims(1, 2) } else { new };
            let at = |p: std::ops::Range<usize>, s: usize| {
                let (positions, width) = (s..s + t, 0..kv);
                if dim == 2 {
                    [p, width, positions]
                } else {
                    [p, positions, width]
                }
            };
            if run && slots.iter().all(|&s| s == slots[0]) {
                return buffer.slice_assign(at(first..first + b, slots[0]), new);
            }
            for (r, (&p, &s)) in places.iter().zip(&slots).enumerate() {
                let row = new.clone().narrow(0, r, 1);
                buffer = buffer.slice_assign(at(p..p + 1, s), row);
            }
            buffer
        };
        let keys = write(keys, self.layout.k(), 2);
        let values = write(values, self.layout.v(), 1);
        // Past block positions a row sees every slot: its last block, in ring order.
        let end = (starts.iter().max().copied().unwrap_or(0) + t).min(block);
        // The pass's rows' first `end` positions, `[B, end, KV]`.
        let index = (!run).then(|| {
            let places: Vec<i64> = places.iter().map(|&p| p as i64).collect();
            Tensor::<1, Int>::from_data(TensorData::new(places, [b]), &values.device())
        });
        let seen = |buffer: &Tensor<3>, dim: usize| {
            let rows = match &index {
                None => buffer.clone().narrow(0, first, b),
                Some(index) => buffer.clone().select(0, index.clone()),
            };
            let rows = rows.narrow(dim, 0, end);
            if dim == 2 { rows.swap_dims(1, 2) } else { rows }
        };
        let (y, _) = self.composite(qkv, Some((seen(&keys, 2), seen(&values, 1))), starts, pass);
        (y, (keys, values))
    }

    /// The composite attention of the `[B, T, W]` projection `qkv`: the mix `[B, T, C]` and
    /// the weights `[B, H, T, T_keys]`. Its keys and values are `qkv`'s own, or `kv`,
    /// `[B, T_keys, KV]` each, in which row `b`'s new tokens sit from position `starts[b]`
    /// (none: each row's end, `T_keys - T`).
    fn composite(
        &self,
        qkv: Tensor<3>,
        kv: Option<(Tensor<3>, Tensor<3>)>,
        starts: &[usize],
        pass: Pass,
    ) -> (Tensor<3>, Tensor<4>) {
        let [b, t, _] = qkv.dims();
        let l = self.layout;
        let (c, hs) = (l.q_width(), l.head_size);
        // (B, T, n * hs) -> (B, H, T, hs): n heads, each key/value head repeated for the query
        // heads of its group (Hugging Face's `repeat_kv`).
        let heads = |x: Tensor<3>, n: usize| {
            let t = x.dims()[1];
            let x = x.reshape([b, t, n, hs]).swap_dims(1, 2); // (B, n, T, hs)
            let group = l.n_head / n;
            if group == 1 {
                return x;
            }
            x.reshape([b, n, 1, t, hs])
                .repeat_dim(2, group)
                .reshape([b, l.n_head, t, hs])
        };
        let part = |cols: std::ops::Range<usize>| qkv.clone().narrow(2, cols.start, cols.len());
        let (k, v) = kv.unwrap_or_else(|| (part(l.k()), part(l.v())));
        let kv_heads = l.n_kv_head;
        let (q, k, v) = (
            heads(part(l.q()), l.n_head),
            heads(k, kv_heads),
            heads(v, kv_heads),
        );
        let t_keys = k.dims()[2];

        let scores = q.matmul(k.swap_dims(2, 3)) * (1.0 / (hs as f64).sqrt()); // (B, H, T, T_keys)
        let device = scores.device();
        let uniform = starts.iter().all(|&s| s + t == t_keys);
        let future = if uniform {
            // Query i sits at position (t_keys - t + i): it may see keys up to that position.
            Tensor::<2, Bool>::tril_mask([t, t_keys], (t_keys - t) as i64, &device)
                .reshape([1, 1, t, t_keys])
        } else {
            // Each row's query i sits at its own position starts[b] + i; the keys after it
            // (later tokens, or a shorter row's unwritten end) are masked.
            let hidden: Vec<bool> = (0..b)
                .flat_map(|r| (0..t).flat_map(move |i| (0..t_keys).map(move |j| j > starts[r] + i)))
                .collect();
            Tensor::<4, Bool>::from_data(TensorData::new(hidden, [b, 1, t, t_keys]), &device)
        };
        let scores = scores.mask_fill(future, f32::NEG_INFINITY);
        let weights = softmax(scores, 3); // (B, H, T, T_keys), rows sum to 1
        let y = pass
            .composite_dropout(&self.attn_dropout, weights.clone())
            .matmul(v); // (B, H, T, hs)
        (y.swap_dims(1, 2).reshape([b, t, c]), weights) // (B, T, C): heads side by side
    }
}
