//! The key/value cache for sampling: each layer's keys and values of the tokens already seen.

use burn::prelude::*;

use crate::attention::LayerCache;

/// Keys and values of every layer for the tokens already fed through [`crate::Gpt::forward_cached`].
///
/// The cache holds at most `block_size` positions (the learned position embeddings); a sampler that
/// needs to go further clears it and starts again over the last window.
#[derive(Debug, Clone)]
pub struct KvCache {
    /// The composite path's: `[B, H, T_seen, hs]` each, grown by concatenation.
    pub(crate) layers: Vec<LayerCache>,
    /// The fused path's: `[B, block_size, C]` each, allocated once and written in place.
    pub(crate) buffers: Vec<Option<(Tensor<3>, Tensor<3>)>>,
    pub(crate) len: usize,
}

impl KvCache {
    /// An empty cache for a model of `n_layer` blocks.
    pub fn new(n_layer: usize) -> Self {
        Self {
            layers: vec![None; n_layer],
            buffers: vec![None; n_layer],
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

    /// Forgets every position, keeping the fused path's buffers for reuse.
    pub fn clear(&mut self) {
        self.layers.iter_mut().for_each(|l| *l = None);
        self.len = 0;
    }

    /// The fused path's buffers of `layer` for `samples` texts, `[samples, block, C]` each.
    pub(crate) fn take_buffers(
        &mut self,
        layer: usize,
        [samples, block, c]: [usize; 3],
        device: &Device,
    ) -> (Tensor<3>, Tensor<3>) {
        match self.buffers[layer].take() {
            Some((k, v)) if k.dims() == [samples, block, c] => (k, v),
            _ => {
                let zeros = || Tensor::<3>::zeros([samples, block, c], device);
                (zeros(), zeros())
            }
        }
    }
}
