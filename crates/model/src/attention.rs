//! Causal multi-head self-attention.
//!
//! Each position's embedding is projected to a query, a key and a value (one fused linear layer),
//! split into `n_head` heads. A position's scores are its query against every key, scaled by
//! `1 / sqrt(head_size)`; positions in the future are masked out, the softmax turns scores into
//! weights, and the weights mix the values. Heads are concatenated and projected back.

use burn::nn::{Dropout, Linear};
use burn::prelude::*;
use burn::tensor::activation::softmax;

use crate::ops::{self, Pass, Site};

/// Keys and values of one layer for the tokens already seen: `[B, H, T_seen, hs]` each.
pub(crate) type LayerCache = Option<(Tensor<4>, Tensor<4>)>;

/// What the composite attention returns.
pub(crate) struct AttentionOutput {
    /// `[B, T, C]`: the mix of values, heads side by side (before the output projection).
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
    /// The projected attention output, on the composite path, without dropout.
    ///
    /// # Shapes
    /// - x: `[B, T, C]` -> `[B, T, C]`
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let pass = Pass {
            fused: false,
            dropout: None,
            eps: 0.0, // no LayerNorm in attention
        };
        let qkv = self.c_attn.forward(x);
        self.c_proj
            .forward(self.composite(qkv, None, false, pass).y)
    }

    /// `residual + attention(x)`, block `layer` of a pass.
    ///
    /// # Shapes
    /// - x, residual: `[B, T, C]` -> `[B, T, C]`
    pub(crate) fn forward_pass(
        &self,
        x: Tensor<3>,
        residual: Tensor<3>,
        pass: Pass,
        layer: usize,
    ) -> Tensor<3> {
        let qkv = ops::linear(&self.c_attn, x, pass); // (B, T, 3C)
        let y = if pass.fused {
            let mask = pass.mask(&self.attn_dropout, layer, Site::AttentionWeights);
            ops::fused::attention(qkv, self.n_head, mask)
        } else {
            self.composite(qkv, None, false, pass).y
        };
        let at = (layer, Site::AttentionOutput);
        ops::project_residual(&self.c_proj, &self.resid_dropout, y, residual, pass, at)
    }

    /// The attention of the composite path on the `[B, T, 3C]` projection `qkv`, over the
    /// cached keys and values of the tokens seen before (which these follow) when given; the
    /// cache is extended with these tokens'.
    pub(crate) fn composite(
        &self,
        qkv: Tensor<3>,
        cache: Option<&mut LayerCache>,
        want_weights: bool,
        pass: Pass,
    ) -> AttentionOutput {
        let [b, t, c3] = qkv.dims();
        let c = c3 / 3;
        let h = self.n_head;
        let hs = c / h;
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
        let y = pass
            .composite_dropout(&self.attn_dropout, weights.clone())
            .matmul(v); // (B, H, T, hs)
        AttentionOutput {
            y: y.swap_dims(1, 2).reshape([b, t, c]), // (B, T, C): heads side by side
            weights: want_weights.then_some(weights),
        }
    }
}
