//! The whole model: embeddings, blocks, final LayerNorm, and the head tied to the token embedding.

use burn::nn::{Dropout, Embedding, LayerNorm};
use burn::prelude::*;

use crate::block::Block;
use crate::cache::KvCache;

/// A decoder-only transformer over characters. Build it with [`crate::GptConfig::init`].
#[derive(Module, Debug)]
pub struct Gpt {
    /// Token embedding `[vocab_size, n_embd]`; also the output head (weight tying).
    pub wte: Embedding,
    /// Learned position embedding `[block_size, n_embd]`.
    pub wpe: Embedding,
    /// Dropout on the summed embeddings.
    pub drop: Dropout,
    pub blocks: Vec<Block>,
    pub ln_f: LayerNorm,
}

impl Gpt {
    /// Logits for the next token at every position.
    ///
    /// # Shapes
    /// - idx: `[B, T]` token ids, `T <= block_size`
    /// - output: `[B, T, vocab_size]`
    pub fn forward(&self, idx: Tensor<2, Int>) -> Tensor<3> {
        let mut x = self.embed(idx, 0);
        for block in &self.blocks {
            x = block.forward(x);
        }
        self.head(x)
    }

    /// The forward pass that also returns every layer's attention weights, `[B, H, T, T]` each,
    /// computed by the same code as [`Gpt::forward`].
    pub fn forward_with_attention(&self, idx: Tensor<2, Int>) -> (Tensor<3>, Vec<Tensor<4>>) {
        let mut x = self.embed(idx, 0);
        let mut weights = Vec::with_capacity(self.blocks.len());
        for block in &self.blocks {
            let (y, w) = block.forward_with(x, None, true);
            x = y;
            weights.extend(w);
        }
        (self.head(x), weights)
    }

    /// Logits for `idx`, the tokens that follow those already in `cache`; the cache is extended.
    /// Gives the same logits as [`Gpt::forward`] over all the tokens seen.
    ///
    /// # Shapes
    /// - idx: `[B, T_new]`, with `cache.len() + T_new <= block_size`
    /// - output: `[B, T_new, vocab_size]`
    pub fn forward_cached(&self, idx: Tensor<2, Int>, cache: &mut KvCache) -> Tensor<3> {
        let t_new = idx.dims()[1];
        assert!(
            cache.len + t_new <= self.block_size(),
            "the cache holds at most block_size positions"
        );
        let mut x = self.embed(idx, cache.len);
        for (block, layer) in self.blocks.iter().zip(cache.layers.iter_mut()) {
            x = block.forward_with(x, Some(layer), false).0;
        }
        cache.len += t_new;
        self.head(x)
    }

    /// Longest context the model accepts.
    pub fn block_size(&self) -> usize {
        self.wpe.weight.dims()[0]
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.wte.weight.dims()[0]
    }

    /// Number of blocks.
    pub fn n_layer(&self) -> usize {
        self.blocks.len()
    }

    /// Token plus position embeddings for tokens starting at position `start`.
    fn embed(&self, idx: Tensor<2, Int>, start: usize) -> Tensor<3> {
        let t = idx.dims()[1];
        let device = idx.device();
        let pos =
            Tensor::<1, Int>::arange(start as i64..(start + t) as i64, &device).reshape([1, t]);
        let x = self.wte.forward(idx) + self.wpe.forward(pos); // (B, T, C) + (1, T, C)
        self.drop.forward(x) // (B, T, C)
    }

    /// Final LayerNorm and the tied head: logits = ln_f(x) @ wteᵀ.
    fn head(&self, x: Tensor<3>) -> Tensor<3> {
        let x = self.ln_f.forward(x);
        let w = self.wte.weight.val(); // (V, C)
        let [v, c] = w.dims();
        x.matmul(w.transpose().reshape([1, c, v])) // (B, T, V)
    }
}
