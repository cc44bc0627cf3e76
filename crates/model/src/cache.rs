//! The key/value cache for sampling: each layer's keys and values of the tokens already seen.

use burn::prelude::*;

/// One layer's keys and values, `[B, block_size, C]` each, heads side by side; the first
/// [`KvCache::len`] positions are filled.
pub(crate) type LayerKv = (Tensor<3>, Tensor<3>);

/// Keys and values of every layer for the tokens already fed through [`crate::Gpt::forward_cached`].
///
/// The buffers are allocated once, for `block_size` positions (the learned position
/// embeddings), and written in place by the fused layers (by `slice_assign` on the composite
/// ones); a sampler that needs to go further clears the cache and starts again over the last
/// window.
#[derive(Debug, Clone)]
pub struct KvCache {
    layers: Vec<Option<LayerKv>>,
    /// Positions the buffers hold (the model's context).
    block_size: usize,
    len: usize,
}

impl KvCache {
    /// An empty cache for a model of `n_layer` blocks and a context of `block_size` positions
    /// ([`crate::Gpt::n_layer`], [`crate::Gpt::block_size`]).
    pub fn new(n_layer: usize, block_size: usize) -> Self {
        Self {
            layers: vec![None; n_layer],
            block_size,
            len: 0,
        }
    }

    /// Number of positions cached (the position of the next token).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no token has been seen yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets every position, keeping the buffers for reuse.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Number of layers.
    pub fn n_layer(&self) -> usize {
        self.layers.len()
    }

    /// Records that a pass added `t_new` positions.
    pub(crate) fn advance(&mut self, t_new: usize) {
        self.len += t_new;
    }

    /// Positions the cache holds at most.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The buffers of `layer` for the `[B, T, 3C]` projection `qkv`: the cache's own while
    /// their shape fits, else new zeros.
    pub(crate) fn take(&mut self, layer: usize, qkv: &Tensor<3>) -> LayerKv {
        let [samples, _, c3] = qkv.dims();
        let shape = [samples, self.block_size, c3 / 3];
        match self.layers[layer].take() {
            Some((k, v)) if k.dims() == shape => (k, v),
            _ => {
                let zeros = || Tensor::<3>::zeros(shape, &qkv.device());
                (zeros(), zeros())
            }
        }
    }

    /// Gives back `layer`'s buffers, written by the pass.
    pub(crate) fn put(&mut self, layer: usize, kv: LayerKv) {
        self.layers[layer] = Some(kv);
    }
}
