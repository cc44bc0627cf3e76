//! Autoregressive generation, with or without the key/value cache.

use std::collections::BTreeMap;
use std::ops::{ControlFlow, Range};

use burn::prelude::*;
use cinder_model::{Gpt, KvCache};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::data::ids_tensor;
use crate::sampling::{SamplingParams, Seen};

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub num_samples: usize,
    pub sampling: SamplingParams,
    pub seed: u64,
    /// Use the key/value cache (same text, faster); off re-runs the whole window per token.
    pub use_cache: bool,
    /// Tokens the tokenizer has: ids past them (a model vocabulary padded beyond the
    /// tokenizer's) are never picked.
    pub tokens: usize,
}

/// A token `generate` chose, for its `on_token`.
#[derive(Debug, Clone, Copy)]
pub struct Token<'a> {
    /// Which sample it continues.
    pub sample: usize,
    pub id: u32,
    /// The logits it was chosen from, over the tokenizer's tokens: what the model thought
    /// ([`crate::sampling::token_probs`]).
    pub logits: &'a [f32],
}

/// What `generate`'s `on_token` says: nothing (go on), or whether to go on.
pub trait TokenFlow {
    fn go_on(self) -> bool;
}

impl TokenFlow for () {
    fn go_on(self) -> bool {
        true
    }
}

impl TokenFlow for ControlFlow<()> {
    fn go_on(self) -> bool {
        self.is_continue()
    }
}

/// Generates `num_samples` continuations of `prompt` (at least one token) as rows of one
/// [`Decoder`], calling
/// `on_token` with each [`Token`] as it is chosen; an `on_token` that returns
/// `ControlFlow::Break` ends the generation after the current step. Returns the new tokens of
/// every sample. It runs on the sampling thread ([`cinder_model::sampling`]).
pub fn generate<F: TokenFlow>(
    model: &Gpt,
    prompt: &[u32],
    opts: &GenerateOptions,
    device: &Device,
    mut on_token: impl FnMut(Token<'_>) -> F + Send,
) -> Vec<Vec<u32>> {
    assert!(
        !prompt.is_empty(),
        "the prompt must hold at least one token"
    );
    cinder_model::sampling(|| sample(model, prompt, opts, device, &mut on_token))
}

/// [`generate`]'s loop.
fn sample<F: TokenFlow>(
    model: &Gpt,
    prompt: &[u32],
    opts: &GenerateOptions,
    device: &Device,
    on_token: &mut impl FnMut(Token<'_>) -> F,
) -> Vec<Vec<u32>> {
    let n = opts.num_samples;
    let mut picker = Picker::new(opts.sampling, opts.seed, opts.tokens, prompt, n);
    let mut decoder = Decoder::new(model, opts.use_cache, device, n);
    decoder.join(vec![prompt.to_vec(); n]);
    let mut out = vec![Vec::with_capacity(opts.max_new_tokens); n];
    for _ in 0..opts.max_new_tokens {
        let logits = decoder.next_logits();
        let tokens = picker.pick(&logits);
        let v = logits.len() / n;
        let pickable = opts.tokens.min(v);
        let mut go_on = true;
        for (sample, id) in tokens.into_iter().enumerate() {
            decoder.push(sample, id);
            out[sample].push(id);
            let logits = &logits[sample * v..sample * v + pickable];
            go_on &= on_token(Token { sample, id, logits }).go_on();
        }
        if !go_on {
            break;
        }
    }
    out
}

/// The next tokens of one prompt's samples: `generate`'s random stream for a seed, drawn row
/// after row at each step, and what each row has said for the penalties.
pub struct Picker {
    sampling: SamplingParams,
    rng: ChaCha8Rng,
    /// Tokens the tokenizer has: ids past them (a vocabulary padded beyond the tokenizer's)
    /// are never picked.
    tokens: usize,
    /// Each row's prompt and tokens so far (kept only if a penalty is on).
    seen: Vec<Seen>,
}

impl Picker {
    /// Picking for `rows` samples of `prompt`.
    pub fn new(
        sampling: SamplingParams,
        seed: u64,
        tokens: usize,
        prompt: &[u32],
        rows: usize,
    ) -> Self {
        let seen = if sampling.penalises() {
            Seen::new(prompt)
        } else {
            Seen::default()
        };
        Self {
            sampling,
            rng: ChaCha8Rng::seed_from_u64(seed),
            tokens,
            seen: vec![seen; rows],
        }
    }

    /// The next token of each row, whose logits `logits` holds row after row.
    pub fn pick(&mut self, logits: &[f32]) -> Vec<u32> {
        let v = logits.len() / self.seen.len();
        let pickable = self.tokens.min(v);
        let penalises = self.sampling.penalises();
        logits
            .chunks_exact(v)
            .zip(&mut self.seen)
            .map(|(row, seen)| {
                let token = self.sampling.pick(&row[..pickable], seen, &mut self.rng);
                if penalises {
                    seen.push(token);
                }
                token
            })
            .collect()
    }
}

/// Produces the next-token logits of growing texts (rows) decoded together, with or without
/// the key/value cache. Rows join and leave between steps, each at its own length: `generate`
/// decodes its samples as rows, and a server the requests of many clients.
///
/// A row's context is its last `block_size` tokens. With the cache, each row has a place of its
/// own in it from the time it joins to the time it leaves (the cache's buffers are made for the
/// rows asked for, in parts: `KvCache`); each token costs one position's work. A row that joins first runs
/// its text's last window into its place (rows of one length together). Past `block_size`:
/// - rotary positions: the cache slides ([`Gpt::cache_slides`]): each token attends to the
///   cached keys and values of the last `block_size` tokens, as they were computed when each was
///   new, at one position's cost;
/// - learned positions: every token's position shifts at each step, so the window is run whole
///   into the row's place, from its start, per token: the logits of the uncached path (up to
///   their last bits: the cache's copy of the head is laid out for its product).
///
/// Without the cache, every token's window is run whole (exact windows), whatever the
/// positions; with rotary positions that differs from the cache past `block_size`.
pub struct Decoder<'a> {
    model: &'a Gpt,
    device: Device,
    /// Each row's text: every token, prompt included.
    texts: Vec<Vec<u32>>,
    /// The cache, and each row's place in it.
    cache: Option<(KvCache, Vec<usize>)>,
    /// Tokens of each row's text its place accounts for: all it had at the last pass (0: not
    /// run yet). Past `block_size` the place holds the last `block_size` of them.
    fed: Vec<usize>,
}

impl<'a> Decoder<'a> {
    /// Decoding with `model` on `device`, no rows yet; with the cache, made for `rows` rows at
    /// once (more grow it).
    pub fn new(model: &'a Gpt, use_cache: bool, device: &Device, rows: usize) -> Self {
        Self::with(model, device, use_cache.then(|| model.new_cache(rows)))
    }

    /// Decoding with `model` on `device` and the cache `cache`, made for `model` with its
    /// weights as they are (an earlier decoder's, [`Decoder::into_cache`]; it holds a copy of
    /// the head): its buffers are kept, its places all freed.
    pub fn with_cache(model: &'a Gpt, device: &Device, cache: KvCache) -> Self {
        Self::with(model, device, Some(cache))
    }

    fn with(model: &'a Gpt, device: &Device, mut cache: Option<KvCache>) -> Self {
        cache.iter_mut().for_each(KvCache::clear);
        Self {
            model,
            device: device.clone(),
            texts: Vec::new(),
            cache: cache.map(|cache| (cache, Vec::new())),
            fed: Vec::new(),
        }
    }

    /// The cache, for a later decoder of the same model (none without it).
    pub fn into_cache(self) -> Option<KvCache> {
        self.cache.map(|(cache, _)| cache)
    }

    /// Rows decoded now.
    pub fn rows(&self) -> usize {
        self.texts.len()
    }

    /// Bytes of keys and values the cache holds (none without it).
    pub fn cache_bytes(&self) -> usize {
        self.cache.as_ref().map_or(0, |(cache, _)| cache.bytes())
    }

    /// Adds a row for each text (at least one token each) after the rows there.
    pub fn join(&mut self, texts: impl IntoIterator<Item = Vec<u32>>) {
        for text in texts {
            assert!(!text.is_empty(), "a row's text holds at least one token");
            if let Some((cache, places)) = &mut self.cache {
                places.push(cache.claim());
            }
            self.texts.push(text);
            self.fed.push(0);
        }
    }

    /// Removes the rows `rows`, freeing their places; the rows after them move up.
    pub fn leave(&mut self, rows: Range<usize>) {
        if let Some((cache, places)) = &mut self.cache {
            places.drain(rows.clone()).for_each(|p| cache.release(p));
        }
        self.texts.drain(rows.clone());
        self.fed.drain(rows);
    }

    /// Appends `token` to row `row`'s text.
    pub fn push(&mut self, row: usize, token: u32) {
        self.texts[row].push(token);
    }

    /// Logits `[rows * V]` (row after row) for the token after each row's text. Each row has
    /// grown by one token since the last call, or joined since.
    pub fn next_logits(&mut self) -> Vec<f32> {
        let (model, block) = (self.model, self.model.block_size());
        let (n, v) = (self.texts.len(), model.vocab_size());
        let mut logits = vec![0.0f32; n * v];
        let mut put = |rows: &[usize], out: Tensor<2>| {
            let out = out.into_data().try_to_vec::<f32>().expect("logits are f32");
            for (&r, row) in rows.iter().zip(out.chunks_exact(v)) {
                logits[r * v..(r + 1) * v].copy_from_slice(row);
            }
        };
        let window = |r: usize| {
            let text = &self.texts[r];
            &text[text.len().saturating_sub(block)..]
        };
        let Some((cache, places)) = &mut self.cache else {
            for rows in by_window(&self.texts, block, 0..n) {
                let t = window(rows[0]).len();
                let tokens: Vec<u32> = rows.iter().flat_map(|&r| window(r)).copied().collect();
                let out = model.forward(ids_tensor(&tokens, [rows.len(), t], &self.device));
                put(
                    &rows,
                    out.slice(s![.., t - 1..t, ..]).reshape([rows.len(), v]),
                );
            }
            return logits;
        };
        let places_of = |rows: &[usize]| rows.iter().map(|&r| places[r]).collect::<Vec<_>>();
        // Rows whose place has seen all their text but the last token go on with one position
        // (past block_size, only if the cache slides).
        let slides = model.cache_slides();
        let on = |r: usize| {
            let len = self.texts[r].len();
            self.fed[r] > 0 && len == self.fed[r] + 1 && (len <= block || slides)
        };
        let going_on: Vec<usize> = (0..n).filter(|&r| on(r)).collect();
        if !going_on.is_empty() {
            let last: Vec<u32> = going_on
                .iter()
                .map(|&r| *self.texts[r].last().unwrap())
                .collect();
            let ids = ids_tensor(&last, [going_on.len(), 1], &self.device);
            put(
                &going_on,
                model.forward_cached(ids, cache, &places_of(&going_on)),
            );
        }
        // The others run their window into their place from its start, rows of one length
        // together.
        for rows in by_window(&self.texts, block, (0..n).filter(|&r| !on(r))) {
            let t = window(rows[0]).len();
            let tokens: Vec<u32> = rows.iter().flat_map(|&r| window(r)).copied().collect();
            let ids = ids_tensor(&tokens, [rows.len(), t], &self.device);
            let rows_places = places_of(&rows);
            rows_places.iter().for_each(|&p| cache.restart(p));
            put(&rows, model.forward_cached(ids, cache, &rows_places));
        }
        for (fed, text) in self.fed.iter_mut().zip(&self.texts) {
            *fed = text.len();
        }
        logits
    }
}

/// `rows` grouped by the length of their window (the last `block` tokens), in a fixed order.
fn by_window(
    texts: &[Vec<u32>],
    block: usize,
    rows: impl Iterator<Item = usize>,
) -> Vec<Vec<usize>> {
    let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for r in rows {
        groups.entry(texts[r].len().min(block)).or_default().push(r);
    }
    groups.into_values().collect()
}
