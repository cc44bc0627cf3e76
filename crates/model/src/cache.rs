//! The key/value cache for sampling: each layer's keys and values of the tokens already seen,
//! in one place per text.

use burn::prelude::*;
use cinder_kernels::QkvLayout;

/// One layer's keys `[P, KV, block_size]` (a position's key is a column: a query meets every
/// position's key at once) and values `[P, block_size, KV]` (`P` places), the key/value heads
/// side by side (`cinder_kernels::QkvLayout::kv_width`); the text in place `p` keeps its
/// positions `..lens[p]` in slots `position % block_size` (its last `block_size`).
pub(crate) type LayerKv = (Tensor<3>, Tensor<3>);

/// Keys and values of every layer for the tokens already fed through
/// [`crate::Gpt::forward_cached`], for texts decoded together, each in a place of its own.
///
/// The buffers are made by the first pass, for the places asked for ([`crate::Gpt::new_cache`])
/// and `block_size` positions each (the model's context), and written in place (by
/// `slice_assign` on the composite layers). A text takes a free place when it joins
/// ([`KvCache::claim`]) and gives it back when it leaves ([`KvCache::release`]): no other
/// text's keys move, and nothing is allocated while texts come and go within the places there
/// are. A text that finds none free doubles them: the buffers grow to the most texts decoded at
/// once (at most twice as many places), once, and are kept.
/// Each text holds its own number of positions: texts decoded together may have started at
/// different times. Past `block_size`, a cache of rotary positions slides: position `p` is
/// kept in slot `p % block_size`, over the oldest ([`crate::Gpt::cache_slides`]).
#[derive(Debug, Clone)]
pub struct KvCache {
    layers: Vec<Option<LayerKv>>,
    /// Positions each place holds (the model's context).
    block_size: usize,
    /// Positions the text in each place has seen (the position of its next token; past
    /// `block_size`, the place holds the last `block_size` of them); none for a free place.
    lens: Vec<Option<usize>>,
}

impl KvCache {
    /// An empty cache for a model of `n_layer` blocks and a context of `block_size` positions,
    /// with room for `places` texts (its buffers are made by the first pass):
    /// [`crate::Gpt::new_cache`] makes one for a model.
    pub(crate) fn new(n_layer: usize, block_size: usize, places: usize) -> Self {
        Self {
            layers: vec![None; n_layer],
            block_size,
            lens: vec![None; places],
        }
    }

    /// A free place for a new text, which has seen nothing yet: the first free one. With none
    /// free, the cache grows to twice its places (its buffers with it).
    pub fn claim(&mut self) -> usize {
        let place = match self.lens.iter().position(Option::is_none) {
            Some(free) => free,
            None => {
                let taken = self.lens.len();
                self.lens.resize(2 * taken.max(1), None);
                taken
            }
        };
        self.lens[place] = Some(0);
        place
    }

    /// Frees `place`: its text has left.
    pub fn release(&mut self, place: usize) {
        assert!(self.lens[place].is_some(), "place {place} is not taken");
        self.lens[place] = None;
    }

    /// Forgets what the text in `place` has seen: it starts again from position 0.
    pub fn restart(&mut self, place: usize) {
        assert!(self.lens[place].is_some(), "place {place} is not taken");
        self.lens[place] = Some(0);
    }

    /// Positions the text in `place` has seen (the position of its next token; past
    /// `block_size`, the cache holds the last `block_size` of them); none for a free place.
    pub fn len(&self, place: usize) -> Option<usize> {
        self.lens[place]
    }

    /// Texts the cache has room for, taken or free.
    pub fn places(&self) -> usize {
        self.lens.len()
    }

    /// Frees every place, keeping the buffers for reuse.
    pub fn clear(&mut self) {
        self.lens.iter_mut().for_each(|len| *len = None);
    }

    /// Number of layers.
    pub fn n_layer(&self) -> usize {
        self.layers.len()
    }

    /// Positions the cache holds at most.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Bytes of keys and values the buffers hold (each layer's keys `[P, KV, block_size]` and
    /// values `[P, block_size, KV]`).
    pub fn bytes(&self) -> usize {
        let floats: usize = self
            .layers
            .iter()
            .flatten()
            .map(|(k, v)| k.shape().num_elements() + v.shape().num_elements())
            .sum();
        floats * std::mem::size_of::<f32>()
    }

    /// The first position of each text of a pass over the texts in `places`: taken, and
    /// distinct (each text has a place of its own).
    pub(crate) fn starts(&self, places: &[usize]) -> Vec<usize> {
        let mut distinct = places.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            places.len(),
            "two rows in one place: {places:?}"
        );
        places
            .iter()
            .map(|&p| self.lens[p].unwrap_or_else(|| panic!("place {p} is not taken")))
            .collect()
    }

    /// Records that a pass added `t_new` positions to the texts in `places`.
    pub(crate) fn advance(&mut self, places: &[usize], t_new: usize) {
        for &p in places {
            *self.lens[p].as_mut().expect("a pass feeds taken places") += t_new;
        }
    }

    /// The buffers of `layer`, for the `[B, T, W]` projection `qkv` laid out as `layout` says:
    /// the cache's own, made for its places when there are none or too few (the places already
    /// written kept).
    pub(crate) fn take(&mut self, layer: usize, qkv: &Tensor<3>, layout: QkvLayout) -> LayerKv {
        let (places, block, kv) = (self.places(), self.block_size, layout.kv_width());
        let zeros = |shape| Tensor::<3>::zeros(shape, &qkv.device());
        let kept = self.layers[layer].take();
        if let Some((k, v)) = &kept {
            assert!(
                k.dims()[1..] == [kv, block] && v.dims()[1..] == [block, kv],
                "a cache made for a model of other keys and values (Gpt::new_cache)"
            );
        }
        match kept {
            Some((k, v)) if v.dims()[0] == places => (k, v),
            Some((k, v)) => {
                let more = places - v.dims()[0];
                (
                    Tensor::cat(vec![k, zeros([more, kv, block])], 0),
                    Tensor::cat(vec![v, zeros([more, block, kv])], 0),
                )
            }
            None => (zeros([places, kv, block]), zeros([places, block, kv])),
        }
    }

    /// Gives back `layer`'s buffers, written by the pass.
    pub(crate) fn put(&mut self, layer: usize, kv: LayerKv) {
        self.layers[layer] = Some(kv);
    }
}
