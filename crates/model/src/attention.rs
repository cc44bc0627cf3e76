//! Causal multi-head self-attention.
//!
//! Each position's embedding is projected to a query, a key and a value (one fused linear layer),
//! split into `n_head` heads. A position's scores are its query against every key, scaled by
//! `1 / sqrt(head_size)`; positions in the future are masked out, the softmax turns scores into
//! weights, and the weights mix the values. Heads are concatenated and projected back.

use burn::nn::{Dropout, Linear};
use burn::prelude::*;
use burn::tensor::activation::softmax;

/// Keys and values of one layer for the tokens already seen: `[B, H, T_seen, hs]` each.
pub(crate) type LayerCache = Option<(Tensor<4>, Tensor<4>)>;

/// What the attention layer returns.
pub(crate) struct AttentionOutput {
    /// `[B, T, C]`: the projected mix of values.
    pub y: Tensor<3>,
    /// `[B, H, T, T_keys]`: the attention weights, when asked for.
    pub weights: Option<Tensor<4>>,
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
}

impl CausalSelfAttention {
    /// # Shapes
    /// - x: `[B, T, C]` -> `[B, T, C]`
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        self.forward_with(x, None, false).y
    }

    /// Attention over `x` and, with a cache, over the keys and values of the tokens seen before
    /// (which `x` follows); the cache is extended with `x`'s keys and values.
    pub(crate) fn forward_with(
        &self,
        x: Tensor<3>,
        cache: Option<&mut LayerCache>,
        want_weights: bool,
    ) -> AttentionOutput {
        let [b, t, c] = x.dims();
        let h = self.n_head;
        let hs = c / h;
        let qkv = self.c_attn.forward(x); // (B, T, 3C)
        let heads = |i: usize| {
            qkv.clone()
                .narrow(2, i * c, c)
                .reshape([b, t, h, hs])
                .swap_dims(1, 2) // (B, H, T, hs)
        };
        let (q, mut k, mut v) = (heads(0), heads(1), heads(2));
        if let Some(cache) = cache {
            if let Some((k_seen, v_seen)) = cache.take() {
                k = Tensor::cat(vec![k_seen, k], 2); // (B, H, T_keys, hs)
                v = Tensor::cat(vec![v_seen, v], 2);
            }
            *cache = Some((k.clone(), v.clone()));
        }
        let t_keys = k.dims()[2];

        let scores = q.matmul(k.swap_dims(2, 3)) * (1.0 / (hs as f64).sqrt()); // (B, H, T, T_keys)
        // Query i sits at position (t_keys - t + i): it may see keys up to that position.
        let future =
            Tensor::<2, Bool>::tril_mask([t, t_keys], (t_keys - t) as i64, &scores.device())
                .reshape([1, 1, t, t_keys]);
        let scores = scores.mask_fill(future, f32::NEG_INFINITY);
        let weights = softmax(scores, 3); // (B, H, T, T_keys), rows sum to 1
        let y = self.attn_dropout.forward(weights.clone()).matmul(v); // (B, H, T, hs)
        let y = y.swap_dims(1, 2).reshape([b, t, c]); // (B, T, C): heads side by side
        AttentionOutput {
            y: self.resid_dropout.forward(self.c_proj.forward(y)),
            weights: want_weights.then_some(weights),
        }
    }
}
