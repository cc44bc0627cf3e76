//! Causal multi-head self-attention.
//!
//! Each position's embedding is projected to a query, a key and a value (one fused linear layer),
//! split into `n_head` heads. A position's scores are its query against every key, scaled by
//! `1 / sqrt(head_size)`; positions in the future are masked out, the softmax turns scores into
//! weights, and the weights mix the values. Heads are concatenated and projected back.

use burn::nn::{Dropout, Linear};
use burn::prelude::*;
use burn::tensor::activation::softmax;

use crate::cache::{KvCache, LayerKv};
#[cfg(feature = "flex")]
use crate::ops::fused;
use crate::ops::{self, Pass, Site, fused_or};
use cinder_kernels::position_rows;

/// What a pass through the blocks keeps besides the residual stream: the one switch between
/// training and evaluation, cached sampling, and `inspect`'s attention maps.
pub(crate) enum Keep<'a> {
    /// Nothing: every position attends over the pass's own tokens (training, evaluation).
    Nothing,
    /// The tokens follow those in the cache, which is extended with theirs; only the last
    /// position leaves the last block (the next token's logits are all a sampler needs).
    Cache(&'a mut KvCache),
    /// Every layer's attention weights, `[B, H, T, T]` each, are recorded (composite path).
    Weights(&'a mut Vec<Tensor<4>>),
}

impl Keep<'_> {
    /// Each row's first position in a pass over `rows` rows (none when all start at 0).
    pub fn starts(&self, rows: usize) -> Vec<usize> {
        match self {
            Keep::Cache(cache) => cache.starts(rows),
            _ => Vec::new(),
        }
    }

    /// Whether only the last position goes on after block `layer`'s attention.
    fn last_only(&self, layer: usize) -> bool {
        matches!(self, Keep::Cache(cache) if layer + 1 == cache.n_layer())
    }
}

/// Masked multi-head self-attention.
#[derive(Module, Debug)]
pub struct CausalSelfAttention {
    /// `n_embd -> 3 * n_embd`: queries, keys and values of all heads at once.
    pub c_attn: Linear,
    /// `n_embd -> n_embd`: the output projection (a residual projection).
    pub c_proj: Linear,
    /// Dropout on the attention weights.
    pub attn_dropout: Dropout,
    /// Dropout on the output.
    pub resid_dropout: Dropout,
    /// Number of heads.
    pub n_head: usize,
    /// Rotary embeddings turn the queries and keys by their position.
    #[module(skip)]
    pub rope: bool,
    /// Each head's queries and keys are RMS-normalised (before RoPE).
    #[module(skip)]
    pub qk_norm: bool,
}

impl CausalSelfAttention {
    /// The projected attention output, on the composite path, without dropout (QK-norm with
    /// the default epsilon, [`crate::LAYER_NORM_EPSILON`]).
    ///
    /// # Shapes
    /// - x: `[B, T, C]` -> `[B, T, C]`
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let residual = x.zeros_like();
        let pass = Pass::composite(crate::LAYER_NORM_EPSILON as f32);
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
        let qkv = ops::linear(&self.c_attn, x, pass); // (B, T, 3C)
        let starts = keep.starts(qkv.dims()[0]);
        let qkv = ops::rotate_qk(qkv, self.n_head, &starts, self.rope, self.qk_norm, pass);
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

    /// The attention of block `layer` on the `[B, T, 3C]` projection `qkv`: `[B, T, C]`, the
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
                    fused::attention(qkv, self.n_head, mask)
                },
                composite => self.composite(qkv, None, &[], pass).0,
            ),
            Keep::Cache(cache) => {
                let starts = cache.starts(qkv.dims()[0]);
                let kv = cache.take(layer, &qkv);
                let (y, kv) = fused_or!(pass.fused,
                    fused => fused::cached_attention(qkv, kv, &starts, self.n_head, last_only),
                    composite => self.composite_cached(qkv, kv, &starts, pass),
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
    /// cache's `[B, block, C]` buffers, `starts[b]` positions of row `b` filled), which are
    /// written in: position `p` at slot `p % block`, a ring, as the fused kernel does
    /// (`cinder_kernels::attention::forward_cached`).
    fn composite_cached(
        &self,
        qkv: Tensor<3>,
        (keys, values): LayerKv,
        starts: &[usize],
        pass: Pass,
    ) -> (Tensor<3>, LayerKv) {
        let [b, t, c3] = qkv.dims();
        let (c, block) = (c3 / 3, keys.dims()[1]);
        let slots: Vec<usize> = position_rows(starts).iter().map(|s| s % block).collect();
        let write = |mut buffer: Tensor<3>, part: usize| {
            let new = qkv.clone().narrow(2, part * c, c); // (B, T, C)
            if slots.iter().all(|&s| s == slots[0]) {
                let s = slots[0];
                return buffer.slice_assign([0..b, s..s + t, 0..c], new);
            }
            for (r, &s) in slots.iter().enumerate() {
                let row = new.clone().narrow(0, r, 1);
                buffer = buffer.slice_assign([r..r + 1, s..s + t, 0..c], row);
            }
            buffer
        };
        let (keys, values) = (write(keys, 1), write(values, 2));
        // Past block positions a row sees every slot: its last block, in ring order.
        let end = (starts.iter().max().copied().unwrap_or(0) + t).min(block);
        let seen = |buffer: &Tensor<3>| buffer.clone().narrow(1, 0, end);
        let (y, _) = self.composite(qkv, Some((seen(&keys), seen(&values))), starts, pass);
        (y, (keys, values))
    }

    /// The composite attention of the `[B, T, 3C]` projection `qkv`: the mix `[B, T, C]` and
    /// the weights `[B, H, T, T_keys]`. Its keys and values are `qkv`'s own, or `kv`,
    /// `[B, T_keys, C]` each, in which row `b`'s new tokens sit from position `starts[b]`
    /// (none: each row's end, `T_keys - T`).
    fn composite(
        &self,
        qkv: Tensor<3>,
        kv: Option<(Tensor<3>, Tensor<3>)>,
        starts: &[usize],
        pass: Pass,
    ) -> (Tensor<3>, Tensor<4>) {
        let [b, t, c3] = qkv.dims();
        let c = c3 / 3;
        let h = self.n_head;
        let hs = c / h;
        let heads = |x: Tensor<3>| {
            let t = x.dims()[1];
            x.reshape([b, t, h, hs]).swap_dims(1, 2) // (B, H, T, hs)
        };
        let part = |i: usize| qkv.clone().narrow(2, i * c, c);
        let (k, v) = kv.unwrap_or_else(|| (part(1), part(2)));
        let (q, k, v) = (heads(part(0)), heads(k), heads(v));
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
