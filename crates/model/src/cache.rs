//! The key/value cache for sampling: each layer's keys and values of the tokens already seen,
//! in one place per text.

use burn::prelude::*;
use cinder_kernels::QkvLayout;

/// One layer's keys `[P, KV, block_size]` (a position's key is a column: a query meets every
/// position's key at once) and values `[P, block_size, KV]` (`P` places of a part), the key/value heads
/// side by side (`cinder_kernels::QkvLayout::kv_width`); the text in place `p` keeps its
/// positions `..lens[p]` in slots `position % block_size` (its last `block_size`).
pub(crate) type LayerKv = (Tensor<3>, Tensor<3>);

/// Keys and values of every layer for the tokens already fed through
/// [`crate::Gpt::forward_cached`], for texts decoded together, each in a place of its own.
///
/// The places lie in parts, each with buffers of its own: a pass over texts of several parts
/// runs each part's texts on one thread, from the embedding to the logits, the threads taking
/// the parts in turn ([`crate::Gpt::forward_cached`]), instead of sharing every layer's work
/// between the threads (BENCHMARKS.md sections 36 and 37). A text's logits are those it gets
/// alone, bit for bit on the fused layers: the cache keeps the head's weight laid out for its
/// product, which then sums every row alike, and a pass runs no more rows at once than a
/// product sums alike (`cinder_kernels::matmul::ROWS_ALIKE`; BENCHMARKS.md section 41). A
/// cache has one part unless [`crate::Gpt::new_cache`] gives it more.
///
/// A part's buffers are made with the cache, for its places and `block_size` positions each
/// (the model's context: allocated once, for `serve`'s `--max-batch` texts, not when load
/// first reaches a part; BENCHMARKS.md section 37), and written in place (by `slice_assign` on
/// the composite layers). A text takes a free place when it joins ([`KvCache::claim`]) and
/// gives it back when it leaves ([`KvCache::release`]): no other text's keys move, and nothing
/// is allocated while texts come and go within each part's places. A text that finds none free
/// in its part doubles the part's (even where another part has some free): its buffers grow to
/// the most texts it has held at once (at most twice as many places), once, and are kept.
/// Each text holds its own number of positions: texts decoded together may have started at
/// different times. Past `block_size`, a cache of rotary positions slides: position `p` is
/// kept in slot `p % block_size`, over the oldest ([`crate::Gpt::cache_slides`]).
#[derive(Debug, Clone)]
pub struct KvCache {
    /// Place `p` is place `p / parts.len()` of part `p % parts.len()`: a part's places keep
    /// their numbers when it grows.
    parts: Vec<KvPart>,
    /// Texts the first part takes before the others take any ([`KvCache::claim`]).
    first_alone: usize,
    /// The model's head weight laid out `[C, V]`, copied when the cache was made (a cache is
    /// for the weights it was made with: make a new one once they change, by training,
    /// fine-tuning or a reload; and no gradient reaches the head through it): the logits'
    /// product over it gives a row the same bits whatever rows are beside it, where the
    /// weight `[V, C]` taken transposed does not (`HeadWeight::Columns`; BENCHMARKS.md
    /// section 37).
    head: Tensor<2>,
}

/// Some of a cache's places, with buffers of their own: what one pass over its texts reads and
/// extends ([`crate::Gpt::forward_cached`]).
#[derive(Debug, Clone)]
pub(crate) struct KvPart {
    layers: Vec<Option<LayerKv>>,
    /// Positions each place holds (the model's context).
    block_size: usize,
    /// Positions the text in each place has seen (the position of its next token; past
    /// `block_size`, the place holds the last `block_size` of them); none for a free place.
    lens: Vec<Option<usize>>,
}

/// The rows of a pass whose texts lie in one part of the cache: [`KvCache::split`].
pub(crate) struct PartPass<'a> {
    /// The part.
    pub part: &'a mut KvPart,
    /// The pass's rows whose texts lie there, in order.
    pub rows: Vec<usize>,
    /// Each row's place in the part, and the positions its text has there.
    pub places: Vec<usize>,
    pub starts: Vec<usize>,
}

impl KvCache {
    /// An empty cache for a model of `n_layer` blocks, a context of `block_size` positions,
    /// keys and values `kv` wide and the head `head` (`[C, V]`), with room for `places` texts
    /// in `parts` parts (the first takes `first_alone` texts before the others take any), its
    /// buffers made now on `device`: [`crate::Gpt::new_cache`] makes one for a model.
    pub(crate) fn new(
        [n_layer, block_size, kv]: [usize; 3],
        head: Tensor<2>,
        places: usize,
        parts: usize,
        first_alone: usize,
        device: &Device,
    ) -> Self {
        let parts = parts.max(1);
        // The places shared out, the first parts taking one more where they do not divide.
        let part = |i: usize| {
            let places = places / parts + usize::from(i < places % parts);
            let zeros = |shape| Tensor::<3>::zeros(shape, device);
            let layer = || {
                Some((
                    zeros([places, kv, block_size]),
                    zeros([places, block_size, kv]),
                ))
            };
            KvPart {
                layers: (0..n_layer).map(|_| layer()).collect(),
                block_size,
                lens: vec![None; places],
            }
        };
        Self {
            parts: (0..parts).map(part).collect(),
            first_alone,
            head,
        }
    }

    /// Part and place within it of place `place`.
    fn locate(&self, place: usize) -> (usize, usize) {
        (place % self.parts.len(), place / self.parts.len())
    }

    /// The length (or none, free) of place `place`, which exists.
    fn len_mut(&mut self, place: usize) -> &mut Option<usize> {
        let (part, at) = self.locate(place);
        self.parts[part]
            .lens
            .get_mut(at)
            .unwrap_or_else(|| panic!("place {place} is not taken"))
    }

    /// A free place for a new text, which has seen nothing yet. The first part takes
    /// `first_alone` texts before the others take any; then the texts are shared by the first
    /// two parts, and one more part opens for each further `2 * first_alone` texts held (with
    /// `first_alone` 8, the 33rd text opens a third part, the 49th a fourth): of the open parts,
    /// the one that holds the fewest texts (the first of those) takes it, in its first free
    /// place. With none free there, the part grows to twice its places (its buffers with it).
    pub fn claim(&mut self) -> usize {
        let taken = |p: &KvPart| p.lens.iter().filter(|l| l.is_some()).count();
        let part = if taken(&self.parts[0]) < self.first_alone {
            0
        } else {
            let held: usize = self.parts.iter().map(taken).sum();
            let open = (held / (2 * self.first_alone).max(1) + 1)
                .max(2)
                .min(self.parts.len());
            (0..open)
                .min_by_key(|&i| taken(&self.parts[i]))
                .expect("a cache has a part")
        };
        let lens = &mut self.parts[part].lens;
        let at = match lens.iter().position(Option::is_none) {
            Some(free) => free,
            None => {
                let held = lens.len();
                lens.resize(2 * held.max(1), None);
                held
            }
        };
        lens[at] = Some(0);
        at * self.parts.len() + part
    }

    /// Frees `place`: its text has left.
    pub fn release(&mut self, place: usize) {
        let len = self.len_mut(place);
        assert!(len.is_some(), "place {place} is not taken");
        *len = None;
    }

    /// Forgets what the text in `place` has seen: it starts again from position 0.
    pub fn restart(&mut self, place: usize) {
        let len = self.len_mut(place);
        assert!(len.is_some(), "place {place} is not taken");
        *len = Some(0);
    }

    /// Positions the text in `place` has seen (the position of its next token; past
    /// `block_size`, the cache holds the last `block_size` of them); none for a free place.
    pub fn len(&self, place: usize) -> Option<usize> {
        let (part, at) = self.locate(place);
        self.parts[part].lens.get(at).copied().flatten()
    }

    /// Texts the cache has room for, taken or free.
    pub fn places(&self) -> usize {
        self.parts.iter().map(|p| p.lens.len()).sum()
    }

    /// Frees every place, keeping the buffers for reuse.
    pub fn clear(&mut self) {
        let lens = self.parts.iter_mut().flat_map(|p| &mut p.lens);
        lens.for_each(|len| *len = None);
    }

    /// The model's head weight `[C, V]`, as the cache's passes take it.
    pub(crate) fn head(&self) -> Tensor<2> {
        self.head.clone()
    }

    /// Parts the places lie in, each with buffers of its own.
    pub fn parts(&self) -> usize {
        self.parts.len()
    }

    /// Number of layers.
    pub fn n_layer(&self) -> usize {
        self.parts[0].n_layer()
    }

    /// Positions the cache holds at most.
    pub fn block_size(&self) -> usize {
        self.parts[0].block_size
    }

    /// Bytes of keys and values the buffers hold (each layer's keys `[P, KV, block_size]` and
    /// values `[P, block_size, KV]`, in every part).
    pub fn bytes(&self) -> usize {
        let floats: usize = (self.parts.iter().flat_map(|p| &p.layers))
            .flatten()
            .map(|(k, v)| k.shape().num_elements() + v.shape().num_elements())
            .sum();
        floats * std::mem::size_of::<f32>()
    }

    /// A pass over the texts in `places` (taken, and distinct: each text has a place of its
    /// own), by part: each part with texts in the pass, with its rows.
    pub(crate) fn split(&mut self, places: &[usize]) -> Vec<PartPass<'_>> {
        let mut distinct = places.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            places.len(),
            "two rows in one place: {places:?}"
        );
        let n = self.parts.len();
        let mut passes: Vec<_> = (self.parts.iter_mut())
            .map(|part| PartPass {
                part,
                rows: Vec::new(),
                places: Vec::new(),
                starts: Vec::new(),
            })
            .collect();
        for (row, &place) in places.iter().enumerate() {
            let pass = &mut passes[place % n];
            let at = place / n;
            let len = pass.part.lens.get(at).copied().flatten();
            pass.starts
                .push(len.unwrap_or_else(|| panic!("place {place} is not taken")));
            pass.rows.push(row);
            pass.places.push(at);
        }
        passes.retain(|p| !p.rows.is_empty());
        passes
    }
}

impl KvPart {
    /// Number of layers.
    pub(crate) fn n_layer(&self) -> usize {
        self.layers.len()
    }

    /// Records that a pass added `t_new` positions to the texts in `places` (of this part).
    pub(crate) fn advance(&mut self, places: &[usize], t_new: usize) {
        for &p in places {
            *self.lens[p].as_mut().expect("a pass feeds taken places") += t_new;
        }
    }

    /// The buffers of `layer`, for the `[B, T, W]` projection `qkv` laid out as `layout` says:
    /// the part's own, grown to its places where it has more than they were made for (the
    /// places already written kept).
    pub(crate) fn take(&mut self, layer: usize, qkv: &Tensor<3>, layout: QkvLayout) -> LayerKv {
        let (places, block, kv) = (self.lens.len(), self.block_size, layout.kv_width());
        let zeros = |shape| Tensor::<3>::zeros(shape, &qkv.device());
        let (k, v) = self.layers[layer]
            .take()
            .expect("a layer's buffers, given back after each pass");
        assert!(
            k.dims()[1..] == [kv, block] && v.dims()[1..] == [block, kv],
            "a cache made for a model of other keys and values (Gpt::new_cache)"
        );
        match places - v.dims()[0] {
            0 => (k, v),
            more => (
                Tensor::cat(vec![k, zeros([more, kv, block])], 0),
                Tensor::cat(vec![v, zeros([more, block, kv])], 0),
            ),
        }
    }

    /// Gives back `layer`'s buffers, written by the pass.
    pub(crate) fn put(&mut self, layer: usize, kv: LayerKv) {
        self.layers[layer] = Some(kv);
    }
}
