//! The whole model: embeddings, blocks, final norm, and the head (tied to the token embedding,
//! or a matrix of its own).

use std::ops::Range;

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::{Dropout, DropoutConfig, Embedding, LayerNorm};
use burn::prelude::*;

use cinder_kernels::matmul::ROWS_ALIKE;

use crate::attention::Keep;
use crate::block::Block;
use crate::cache::{KvCache, PartPass};
use crate::config::{ConfigError, GptConfig, Norm, Position};
use crate::init::{self, INIT_STD};
use crate::ops::{self, DropoutKey, HeadWeight, Ops, Pass};

/// A decoder-only transformer. Build it with [`GptConfig::init`].
#[derive(Module, Debug)]
pub struct Gpt {
    /// Token embedding `[vocab_size, n_embd]`; also the output head when tied.
    pub wte: Embedding,
    /// Learned position embedding `[block_size, n_embd]`; none with rotary embeddings.
    pub wpe: Option<Embedding>,
    /// Dropout on the embeddings.
    pub drop: Dropout,
    pub blocks: Vec<Block>,
    /// The final LayerNorm; none with RMSNorm (no weights).
    pub ln_f: Option<LayerNorm>,
    /// The untied head `[vocab_size, n_embd]` (Hugging Face's `lm_head.weight`): logits are
    /// `x lm_headᵀ`. None when the head is `wte`.
    pub lm_head: Option<Param<Tensor<2>>>,
    /// The architecture the model was built with (`block_size` cropped by
    /// [`Gpt::crop_block_size`]); the options a pass reads.
    #[module(skip)]
    pub config: GptConfig,
    /// Which version of the layers runs (not part of the weights).
    #[module(skip)]
    pub ops: Ops,
}

impl GptConfig {
    /// Builds the model ([`Gpt::new`]) once the configuration is valid.
    pub fn init(&self, device: &Device) -> Result<Gpt, ConfigError> {
        self.validate()?;
        Ok(Gpt::new(self, device))
    }
}

impl Gpt {
    /// The model of a valid `config` with GPT-2's initialisation (see [`crate::init`]); an
    /// untied head starts normal(0, 0.02), or zero with `zero_init`.
    ///
    /// Random draws come from the device's generator: seed it first for a reproducible model.
    pub fn new(config: &GptConfig, device: &Device) -> Self {
        let model = Gpt {
            wte: init::embedding(config, config.vocab_size, device),
            wpe: (config.position == Position::Learned)
                .then(|| init::embedding(config, config.block_size, device)),
            drop: DropoutConfig::new(config.dropout).init(),
            blocks: (0..config.n_layer)
                .map(|_| Block::new(config, device))
                .collect(),
            ln_f: init::layer_norm(config, device),
            lm_head: (!config.tie_embeddings).then(|| {
                let std = if config.zero_init { 0.0 } else { INIT_STD };
                init::normal(std).init([config.vocab_size, config.n_embd], device)
            }),
            config: config.clone(),
            ops: Default::default(),
        };
        drawn(model)
    }

    /// Logits for the next token at every position, without dropout.
    ///
    /// # Shapes
    /// - idx: `[B, T]` token ids, `T <= block_size`
    /// - output: `[B, T, vocab_size]`
    pub fn forward(&self, idx: Tensor<2, Int>) -> Tensor<3> {
        let [b, t] = idx.dims();
        let pass = self.pass(&idx.device(), None);
        if let Some(groups) = alike_groups(pass, b, t) {
            let logits = groups.map(|rows| self.forward(idx.clone().slice([rows, 0..t])));
            return Tensor::cat(logits.collect(), 0);
        }
        in_pool(pass, || {
            self.logits(idx, pass, &mut Keep::Nothing, self.own_head())
        })
    }

    /// Mean cross-entropy of `targets` (the token after each of `idx`): the training objective.
    /// With `dropout` (a training step's key), dropout applies.
    ///
    /// # Shapes
    /// - idx, targets: `[B, T]` -> `[1]`
    pub fn loss(
        &self,
        idx: Tensor<2, Int>,
        targets: Tensor<2, Int>,
        dropout: Option<DropoutKey>,
    ) -> Tensor<1> {
        let pass = self.pass(&idx.device(), dropout);
        let x = self.trunk(idx, pass, &mut Keep::Nothing);
        let x = ops::norm(self.ln_f.as_ref(), x, pass);
        ops::head_loss(self.head_weight(), self.softcap(), x, targets, pass)
    }

    /// The forward pass that also returns every layer's attention weights, `[B, H, T, T]` each,
    /// on the composite path.
    pub fn forward_with_attention(&self, idx: Tensor<2, Int>) -> (Tensor<3>, Vec<Tensor<4>>) {
        let pass = Pass::composite(self.config.layer_norm_epsilon as f32);
        let mut weights = Vec::with_capacity(self.blocks.len());
        let logits = self.logits(idx, pass, &mut Keep::Weights(&mut weights), self.own_head());
        (logits, weights)
    }

    /// Logits of the token after the last of each row of `idx`, whose tokens follow those of
    /// the text in its place of `cache` (`places[b]` for row `b`, each text its own number of
    /// tokens); the cache is extended. Gives each row's last logits of [`Gpt::forward`] over all
    /// the tokens of its text. Only the last position goes through the last block's attention
    /// output and MLP; on the fused path, small passes run on one thread.
    ///
    /// # Shapes
    /// - idx: `[B, T_new]`, each row's place taken ([`KvCache::claim`]), with the positions its
    ///   text has there ([`KvCache::len`]) `+ T_new <= block_size`, or `T_new = 1` when the
    ///   cache slides ([`Gpt::cache_slides`])
    /// - places: `[B]`, distinct
    /// - output: `[B, vocab_size]`
    pub fn forward_cached(
        &self,
        idx: Tensor<2, Int>,
        cache: &mut KvCache,
        places: &[usize],
    ) -> Tensor<2> {
        let [b, t_new] = idx.dims();
        assert!(
            cache.n_layer() == self.n_layer() && cache.block_size() == self.block_size(),
            "a cache made for another model (Gpt::new_cache)"
        );
        assert_eq!(places.len(), b, "one place per row");
        if b == 0 {
            return Tensor::zeros([0, self.vocab_size()], &idx.device());
        }
        let head = cache.head();
        assert_eq!(
            head.dims(),
            [self.head_weight().dims()[1], self.vocab_size()],
            "a cache made for another model (Gpt::new_cache)"
        );
        let mut parts = cache.split(places);
        let slides = t_new == 1 && self.cache_slides();
        assert!(
            slides
                || (parts.iter().flat_map(|p| &p.starts))
                    .all(|&len| len + t_new <= self.block_size()),
            "the cache holds at most block_size positions (past them, rotary positions slide one \
             token at a time)"
        );
        let pass = self.pass(&idx.device(), None);
        if let Some(groups) = alike_groups(pass, b, t_new) {
            drop(parts); // checked above for every row, before any group extends the cache
            let logits = groups.map(|rows| {
                let idx = idx.clone().slice([rows.clone(), 0..t_new]);
                self.forward_cached(idx, cache, &places[rows])
            });
            return Tensor::cat(logits.collect(), 0);
        }
        if let [part] = &mut parts[..] {
            return self.part_pass(idx, part, pass, head); // its rows are all the pass's, in order
        }
        // Texts in several parts: where each part's pass is small (fused), the threads of
        // `apart` take the parts in turn, each whole on one thread; else one after the other on
        // every core. Their logits put back in the rows' order.
        let device = idx.device();
        let ints = |v: &[usize]| {
            let ints: Vec<i64> = v.iter().map(|&i| i as i64).collect();
            Tensor::<1, Int>::from_data(TensorData::new(ints, [v.len()]), &device)
        };
        let run = |part: &mut PartPass| {
            let rows = idx.clone().select(0, ints(&part.rows));
            self.part_pass(rows, part, pass, head.clone())
        };
        let small = |p: &PartPass| self.small_pass(p.rows.len() * t_new);
        let logits = if pass.fused && parts.iter().all(small) {
            pools::apart(&mut parts, run)
        } else {
            parts.iter_mut().map(run).collect()
        };
        let mut order = vec![0; b]; // row r's logits are at order[r] of the parts' in turn
        for (at, &row) in parts.iter().flat_map(|p| &p.rows).enumerate() {
            order[row] = at;
        }
        Tensor::cat(logits, 0).select(0, ints(&order))
    }

    /// The pass of [`Gpt::forward_cached`] over the texts of one part of its cache, which is
    /// extended.
    ///
    /// # Shapes
    /// - idx: `[B, T_new]`, `part`'s rows, in order
    /// - output: `[B, vocab_size]`
    /// - head: `[C, V]`, the cache's copy of the head's weight
    fn part_pass(
        &self,
        idx: Tensor<2, Int>,
        part: &mut PartPass,
        pass: Pass,
        head: Tensor<2>,
    ) -> Tensor<2> {
        let [b, t_new] = idx.dims();
        let mut keep = Keep::Cache {
            cache: part.part,
            places: &part.places,
            starts: &part.starts,
        };
        let run = || self.logits(idx, pass, &mut keep, HeadWeight::Columns(head)); // (B, 1, V)
        let logits = if pass.fused && self.small_pass(b * t_new) {
            pools::one_thread(run)
        } else {
            in_pool(pass, run)
        };
        part.part.advance(&part.places, t_new);
        logits.reshape([b, self.vocab_size()])
    }

    /// An empty key/value cache for this model, with room for `places` texts (a text that
    /// finds none free in its part doubles the part's), its `cache_bytes(places)` allocated
    /// now, with a copy of the head's weight laid out `n_embd x vocab_size` ([`KvCache`]: make
    /// a new cache once the weights change): [`Gpt::forward_cached`]'s.
    pub fn new_cache(&self, places: usize) -> KvCache {
        self.new_cache_in_parts(places, self.cache_parts(places))
    }

    /// [`Gpt::new_cache`] with its places in `parts` parts (at least one; [`KvCache`]), given
    /// where `new_cache` chooses them from the model. The logits are the same ([`KvCache`]).
    pub fn new_cache_in_parts(&self, places: usize, parts: usize) -> KvCache {
        let shape = [self.n_layer(), self.block_size(), self.kv_width()];
        let w = self.head_weight();
        let device = w.device();
        // The head's weight laid out [C, V] for the product (ops::HeadWeight::Columns).
        let head = Tensor::from_data(w.transpose().into_data(), &device);
        KvCache::new(shape, head, places, parts, PART_TEXTS, &device)
    }

    /// Parts of a cache for `places` texts ([`KvCache`]): on the fused layers, for a model whose
    /// pass over `PART_TEXTS` texts runs on one thread (`SMALL_PASS`), as many as have room for
    /// twice `PART_TEXTS` texts each, `PARTS` at most; else one. A larger model's weights, read
    /// once per part, cost more than the threads save.
    fn cache_parts(&self, places: usize) -> usize {
        let fused = self.ops.fused_on(&self.head_weight().device());
        if !fused || !self.small_pass(PART_TEXTS) {
            return 1;
        }
        (places / (2 * PART_TEXTS)).clamp(1, PARTS)
    }

    /// Whether a cached pass over `tokens` tokens runs on one thread (`SMALL_PASS`).
    fn small_pass(&self, tokens: usize) -> bool {
        tokens * self.num_params() < SMALL_PASS
    }

    /// Bytes of keys and values a cache of `places` texts holds ([`KvCache::bytes`]), from when
    /// it is made.
    pub fn cache_bytes(&self, places: usize) -> usize {
        let floats = 2 * self.n_layer() * places * self.block_size() * self.kv_width();
        floats * std::mem::size_of::<f32>()
    }

    /// Bytes of the copy of the head's weight that a cache keeps besides its keys and values
    /// ([`KvCache`]).
    pub fn cache_head_bytes(&self) -> usize {
        self.head_weight().shape().num_elements() * std::mem::size_of::<f32>()
    }

    /// Width of a position's keys (and of its values) in every layer's cache.
    fn kv_width(&self) -> usize {
        self.blocks.first().map_or(0, |b| b.attn.layout.kv_width())
    }

    /// Whether the key/value cache may go on past `block_size`, one token at a time, each token
    /// attending to the cached keys and values of the last `block_size` tokens (a sliding
    /// window). True with rotary positions: a query meets every key at its distance, never more
    /// than `block_size - 1`, as in training. Learned positions end at `block_size`: past it, a
    /// sampler runs the last window whole per token instead.
    pub fn cache_slides(&self) -> bool {
        self.config.position == Position::Rope
    }

    /// Longest context the model accepts.
    pub fn block_size(&self) -> usize {
        self.config.block_size
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.wte.weight.lazy_shape()[0]
    }

    /// Number of blocks.
    pub fn n_layer(&self) -> usize {
        self.blocks.len()
    }

    /// This model with a context of `block_size` positions, the first of its learned ones
    /// (nanoGPT's `crop_block_size`: fine-tune a long-context model on short windows).
    pub fn crop_block_size(mut self, block_size: usize) -> Self {
        assert!(
            block_size > 0 && block_size <= self.block_size(),
            "a model can only be cropped to a shorter context"
        );
        if let Some(wpe) = &mut self.wpe {
            let require_grad = wpe.weight.is_require_grad();
            wpe.weight = wpe.weight.clone().map(|w| {
                let cropped = w.narrow(0, 0, block_size).detach();
                if require_grad {
                    cropped.require_grad()
                } else {
                    cropped
                }
            });
        }
        self.config.block_size = block_size;
        self
    }

    /// This model with the layers of `ops`.
    pub fn with_ops(mut self, ops: Ops) -> Self {
        self.ops = ops;
        self
    }

    fn pass(&self, device: &Device, dropout: Option<DropoutKey>) -> Pass {
        Pass {
            fused: self.ops.fused_on(device),
            dropout,
            eps: self.config.layer_norm_epsilon as f32,
        }
    }

    /// The logits' soft-cap (0: none).
    fn softcap(&self) -> f32 {
        self.config.logit_softcap as f32
    }

    /// The head's weight `[V, C]`: its own, or the token embedding's.
    fn head_weight(&self) -> Tensor<2> {
        match &self.lm_head {
            Some(w) => w.val(),
            None => self.wte.weight.val(),
        }
    }

    /// Embeddings and blocks: the residual stream after the last block. Every pass goes
    /// through here; `keep` says what it keeps besides (a cache, attention weights).
    fn trunk(&self, idx: Tensor<2, Int>, pass: Pass, keep: &mut Keep) -> Tensor<3> {
        let (wpe, normalise) = (self.wpe.as_ref(), self.config.norm == Norm::Rmsnorm);
        let starts = keep.starts();
        let mut x = ops::embed(&self.wte, wpe, normalise, &self.drop, idx, &starts, pass);
        for (layer, block) in self.blocks.iter().enumerate() {
            x = block.forward(x, pass, layer, keep);
        }
        x
    }

    /// The trunk, the final norm and the head: logits `[B, T, V]` (`[B, 1, V]` with a cache),
    /// through the head's weight as `head` gives it (a cache's copy, or the model's own:
    /// [`Gpt::own_head`]).
    fn logits(
        &self,
        idx: Tensor<2, Int>,
        pass: Pass,
        keep: &mut Keep,
        head: HeadWeight,
    ) -> Tensor<3> {
        let x = self.trunk(idx, pass, keep);
        let x = ops::norm(self.ln_f.as_ref(), x, pass);
        ops::head(head, self.softcap(), x, pass)
    }

    /// The head's weight as the model holds it, for a pass without a cache.
    fn own_head(&self) -> HeadWeight {
        HeadWeight::Rows(self.head_weight())
    }
}

/// `model` with every weight drawn now, in the model's order. Burn draws a weight lazily, from
/// the device's generator as it is when the weight is first read: without this, the values would
/// depend on what ran in between (a training step reseeds the generator), and on the order in
/// which a pass first reads the weights (which differs between the fused and composite layers).
/// The order is the one in which a forward pass reads them, so the values are those of models
/// initialised before.
fn drawn(model: Gpt) -> Gpt {
    struct Draw;
    impl ModuleVisitor for Draw {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            let _ = p.val();
        }
    }
    model.visit(&mut Draw);
    model
}

/// Multiply-adds (tokens x weights) below which a cached pass runs on one thread: waking
/// threads costs more than they gain: one token of the default model (0.8 M weights) or of the
/// 6-layer one (10.7 M), or up to 24 texts' tokens of the default model (BENCHMARKS.md,
/// sections 10 and 33).
const SMALL_PASS: usize = 20_000_000;

/// Groups of the rows of a fused pass over `b` texts of `t` tokens each, where their `b * t`
/// rows are more than the fused layers' products sum alike (`ROWS_ALIKE`; texts' prompts, or
/// that many texts decoding): groups of whole texts, one text where `t` alone is more, so that
/// each text gets the bits it gets alone (BENCHMARKS.md section 41). None where the pass is
/// within it, or composite (Burn's own products, which a GPU runs best whole).
fn alike_groups(pass: Pass, b: usize, t: usize) -> Option<impl Iterator<Item = Range<usize>>> {
    (pass.fused && b > 1 && b * t > ROWS_ALIKE).then(|| {
        let texts = (ROWS_ALIKE / t).max(1);
        (0..b)
            .step_by(texts)
            .map(move |from| from..(from + texts).min(b))
    })
}

/// Texts the first part of a cache takes before the others take any ([`KvCache::claim`]): a
/// part's pass reads the weights once for its texts, which fewer would not repay
/// (BENCHMARKS.md section 36).
const PART_TEXTS: usize = 8;

/// Parts of a small model's cache, when it has room for them: a number of its own, not the
/// machine's cores, so that which texts share a pass never depends on the machine (gemm sums a
/// product of one row and of several rows in different orders at some widths, so a text's
/// last bits may depend on the texts beside it). Four: room for `serve`'s 64 texts in parts of
/// 16 (a pass over 8 texts makes a fifth fewer tokens a second than one over 16; BENCHMARKS.md
/// section 37), taken by the threads as each finishes one; a machine of one core runs the parts
/// one after the other, one of more uses up to four of them for a small model's decoding.
const PARTS: usize = 4;

/// Runs `f` on one of rayon's threads when the pass is fused: the kernels' parallel loops then
/// start without a hand-off to the pool and back. Inside [`sampling`], on every core of a pool of
/// its own (rayon's default size, whatever pool the caller of `sampling` was in).
fn in_pool<R: Send>(pass: Pass, f: impl FnOnce() -> R + Send) -> R {
    if !pass.fused {
        f()
    } else if pools::sampling_here() {
        pools::wide().install(f)
    } else {
        rayon::scope(|_| f())
    }
}

/// Runs `f`, a sampling loop, on the thread that runs this thread's small cached passes
/// ([`Gpt::forward_cached`]), so that each of them starts at once instead of handing its work
/// to that thread and waiting for it to come back: on a 2-core machine that hand-off cost more
/// than the default model's whole pass (BENCHMARKS.md section 20). Larger passes inside `f`
/// still run on every core, and the parts of a cache's passes on up to `PARTS` cores, each part
/// whole on one of them. Each calling thread has a thread of its own for this: loops started on
/// different threads wait for each other only where both run parts at once. The results are
/// the same either way.
pub fn sampling<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    pools::on_one(|| {
        let _here = pools::Sampling::start();
        f()
    })
}

/// The thread pools of sampling.
mod pools {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Mutex, OnceLock};

    use rayon::{ThreadPool, ThreadPoolBuilder};

    thread_local! {
        /// This thread's one-thread pool: its small cached passes, and its sampling loops.
        static ONE: ThreadPool = build(1);
        /// Whether a sampling loop runs on this thread (one of the [`ONE`] pools' threads).
        static HERE: Cell<bool> = const { Cell::new(false) };
    }

    static WIDE: OnceLock<ThreadPool> = OnceLock::new();

    /// A sampling loop running on this thread, until dropped (a panic included), when the
    /// flag is as it was before.
    pub struct Sampling {
        was: bool,
    }

    impl Sampling {
        pub fn start() -> Self {
            Sampling {
                was: HERE.replace(true),
            }
        }
    }

    impl Drop for Sampling {
        fn drop(&mut self) {
            HERE.set(self.was);
        }
    }

    /// Whether a sampling loop runs on this thread: a pass here runs at once, on this thread
    /// alone (a one-thread pool's).
    pub fn sampling_here() -> bool {
        HERE.get()
    }

    /// Runs the small pass `f` on one thread: this one inside a sampling loop, else this
    /// thread's one-thread pool.
    pub fn one_thread<R: Send>(f: impl FnOnce() -> R + Send) -> R {
        if sampling_here() { f() } else { on_one(f) }
    }

    /// Runs `f` on this thread's one-thread pool.
    pub fn on_one<R: Send>(f: impl FnOnce() -> R + Send) -> R {
        ONE.with(|pool| pool.install(f))
    }

    /// Rayon's default number of threads: the larger passes of a sampling loop.
    pub fn wide() -> &'static ThreadPool {
        WIDE.get_or_init(|| build(0))
    }

    /// A one-thread pool for each thread but one that [`apart`] uses (`PARTS` at most, and no
    /// more than the cores): the threads besides a caller's.
    static OTHERS: OnceLock<Vec<ThreadPool>> = OnceLock::new();

    /// `f` of each item, results in order, on this thread (its one-thread pool outside a
    /// sampling loop) and [`OTHERS`], up to one thread per item: each thread takes the next
    /// item not yet taken as it finishes one, so that a thread the machine delays takes fewer.
    /// Each item runs whole on one thread, where its passes run at once as in a sampling loop:
    /// which thread takes it never changes its result. No item's work is shared between
    /// threads, so no thread waits for another until all are done. Loops on different threads
    /// share those pools: their items may wait for each other.
    pub fn apart<T: Send, R: Send>(items: &mut [T], f: impl Fn(&mut T) -> R + Sync) -> Vec<R> {
        let others = OTHERS.get_or_init(|| {
            (1..wide().current_num_threads().min(super::PARTS))
                .map(|_| build(1))
                .collect()
        });
        let slots: Vec<Mutex<(Option<&mut T>, Option<R>)>> = items
            .iter_mut()
            .map(|item| Mutex::new((Some(item), None)))
            .collect();
        let next = AtomicUsize::new(0);
        let take = || {
            while let Some(slot) = slots.get(next.fetch_add(1, Ordering::Relaxed)) {
                let mut slot = slot.lock().expect("an item's slot");
                let item = slot.0.take().expect("each item taken once");
                slot.1 = Some(f(item));
            }
        };
        let helpers = &others[..others.len().min(slots.len().saturating_sub(1))];
        one_thread(|| {
            let _here = Sampling::start(); // this thread's items' passes run here at once
            with_helpers(helpers, &take)
        });
        let results = slots
            .into_iter()
            .map(|slot| slot.into_inner().expect("an item's slot").1);
        results.map(|r| r.expect("each item ran")).collect()
    }

    /// `take` on this thread and on each of `pools` at once, until all have returned.
    fn with_helpers(pools: &[ThreadPool], take: &(impl Fn() + Sync)) {
        match pools.split_first() {
            Some((pool, pools)) => pool.in_place_scope(|scope| {
                scope.spawn(|_| {
                    let _here = Sampling::start();
                    take()
                });
                with_helpers(pools, take)
            }),
            None => take(),
        }
    }

    fn build(threads: usize) -> ThreadPool {
        ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a thread pool")
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// Whether the flag is down on the pools `apart` uses besides the caller's.
        fn flags_down() -> bool {
            let others = OTHERS.get().map_or(&[][..], Vec::as_slice);
            !on_one(sampling_here) && others.iter().all(|pool| !pool.install(sampling_here))
        }

        #[test]
        fn apart_runs_each_item_once_in_order_and_restores_the_flag() {
            let mut items: Vec<(usize, usize)> = (0..9).map(|i| (i, 0)).collect();
            let out = apart(&mut items, |item| {
                item.1 += 1;
                (10 * item.0, sampling_here())
            });
            let order: Vec<usize> = out.iter().map(|o| o.0).collect();
            assert_eq!(order, (0..9).map(|i| 10 * i).collect::<Vec<_>>());
            assert!(out.iter().all(|o| o.1), "each item's passes run at once");
            assert!(items.iter().all(|i| i.1 == 1), "each item once");
            assert!(flags_down());
            let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                apart(&mut items, |item| assert_ne!(item.0, 5, "a failing item"))
            }));
            assert!(failed.is_err(), "an item's panic reaches the caller");
            assert!(flags_down());
        }
    }
}
