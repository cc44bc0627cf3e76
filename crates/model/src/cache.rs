//! The key/value cache for sampling: each layer's keys and values of the tokens already seen.

use burn::prelude::*;
use cinder_kernels::QkvLayout;

/// One layer's keys and values, `[B, block_size, KV]` each, the key/value heads side by side
/// (`cinder_kernels::QkvLayout::kv_width`); row `b`'s positions `..lens[b]` are in slots
/// `p % block_size` (its last `block_size`).
pub(crate) type LayerKv = (Tensor<3>, Tensor<3>);

/// Keys and values of every layer for the tokens already fed through [`crate::Gpt::forward_cached`],
/// one row per text.
///
/// The buffers are allocated once, for `block_size` positions (the learned position
/// embeddings), and written in place by the fused layers (by `slice_assign` on the composite
/// ones). Each row holds its own number of positions: texts decoded together may have started
/// at different times. Rows leave ([`KvCache::retain_rows`]) and join ([`KvCache::append`])
/// between passes. Past `block_size`, a cache of rotary positions slides: position `p` is
/// kept in slot `p % block_size`, over the oldest ([`crate::Gpt::cache_slides`]); with learned
/// positions a sampler starts a new cache over the last window.
#[derive(Debug, Clone)]
pub struct KvCache {
    layers: Vec<Option<LayerKv>>,
    /// Positions the buffers hold (the model's context).
    block_size: usize,
    /// Positions each row has seen (the position of its next token; past `block_size`, the
    /// cache holds the last `block_size` of them); none before the first pass.
    lens: Vec<usize>,
}

impl KvCache {
    /// An empty cache for a model of `n_layer` blocks and a context of `block_size` positions
    /// ([`crate::Gpt::n_layer`], [`crate::Gpt::block_size`]).
    pub fn new(n_layer: usize, block_size: usize) -> Self {
        Self {
            layers: vec![None; n_layer],
            block_size,
            lens: Vec::new(),
        }
    }

    /// Positions each row has seen (the position of its next token; past `block_size`, the
    /// cache holds the last `block_size` of them).
    pub fn lens(&self) -> &[usize] {
        &self.lens
    }

    /// Rows (texts) held.
    pub fn rows(&self) -> usize {
        self.lens.len()
    }

    /// Whether no token has been seen yet.
    pub fn is_empty(&self) -> bool {
        self.lens.iter().all(|&len| len == 0)
    }

    /// Forgets every row and position, keeping the buffers for reuse.
    pub fn clear(&mut self) {
        self.lens.clear();
    }

    /// Number of layers.
    pub fn n_layer(&self) -> usize {
        self.layers.len()
    }

    /// Positions the cache holds at most.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Bytes of keys and values the buffers hold (each layer's two `[B, block_size, KV]`).
    pub fn bytes(&self) -> usize {
        let floats: usize = self
            .layers
            .iter()
            .flatten()
            .map(|(k, v)| k.shape().num_elements() + v.shape().num_elements())
            .sum();
        floats * std::mem::size_of::<f32>()
    }

    /// Each row's first position in a pass over `rows` rows (none when all are at 0: see
    /// `cinder_kernels::start_of`).
    pub(crate) fn starts(&self, rows: usize) -> Vec<usize> {
        assert!(
            self.lens.is_empty() || self.lens.len() == rows,
            "a pass over a cache feeds every row it holds ({} rows, not {rows})",
            self.lens.len()
        );
        self.lens.clone()
    }

    /// Records that a pass added `t_new` positions to each of `rows` rows.
    pub(crate) fn advance(&mut self, rows: usize, t_new: usize) {
        if self.lens.is_empty() {
            self.lens = vec![0; rows];
        }
        self.lens.iter_mut().for_each(|len| *len += t_new);
    }

    /// The buffers of `layer` for the `[B, T, W]` projection `qkv` laid out as `layout` says:
    /// the cache's own while their shape fits, else new zeros.
    pub(crate) fn take(&mut self, layer: usize, qkv: &Tensor<3>, layout: QkvLayout) -> LayerKv {
        let samples = qkv.dims()[0];
        let shape = [samples, self.block_size, layout.kv_width()];
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

    /// Keeps the rows `keep` (indices into the rows held), in that order: texts that ended
    /// leave.
    pub fn retain_rows(&mut self, keep: &[usize]) {
        if keep.iter().copied().eq(0..self.rows()) {
            return; // all of them, in order
        }
        self.lens = keep.iter().map(|&r| self.lens[r]).collect();
        for kv in self.layers.iter_mut() {
            if keep.is_empty() {
                *kv = None;
            } else if let Some((k, v)) = kv.take() {
                let device = k.device();
                let rows: Vec<i64> = keep.iter().map(|&r| r as i64).collect();
                let rows =
                    Tensor::<1, Int>::from_data(TensorData::new(rows, [keep.len()]), &device);
                *kv = Some((k.select(0, rows.clone()), v.select(0, rows)));
            }
        }
    }

    /// Adds the rows of `other`, a cache of the same model, after these: texts that join (their
    /// prompts run through a cache of their own first).
    pub fn append(&mut self, other: KvCache) {
        assert_eq!(
            (self.n_layer(), self.block_size),
            (other.n_layer(), other.block_size),
            "caches of different models"
        );
        if self.lens.is_empty() {
            *self = other;
            return;
        }
        if other.lens.is_empty() {
            return;
        }
        for (mine, theirs) in self.layers.iter_mut().zip(other.layers) {
            *mine = match (mine.take(), theirs) {
                (Some((k, v)), Some((k2, v2))) => {
                    Some((Tensor::cat(vec![k, k2], 0), Tensor::cat(vec![v, v2], 0)))
                }
                _ => panic!("a cache with rows has every layer's buffers"),
            };
        }
        self.lens.extend(other.lens);
    }
}
