//! The key/value cache for sampling: each layer's keys and values of the tokens already seen.

use crate::attention::LayerCache;

/// Keys and values of every layer for the tokens already fed through [`crate::Gpt::forward_cached`].
///
/// The cache holds at most `block_size` positions (the learned position embeddings); a sampler that
/// needs to go further starts a fresh cache over the last window.
#[derive(Debug, Clone)]
pub struct KvCache {
    pub(crate) layers: Vec<LayerCache>,
    pub(crate) len: usize,
}

impl KvCache {
    /// An empty cache for a model of `n_layer` blocks.
    pub fn new(n_layer: usize) -> Self {
        Self {
            layers: vec![None; n_layer],
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
}
