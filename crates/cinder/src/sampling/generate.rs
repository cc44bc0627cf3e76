//! Autoregressive generation, with or without the key/value cache.

use std::ops::ControlFlow;

use burn::prelude::*;
use cinder_model::{Gpt, KvCache};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::data::ids_tensor;
use crate::sampling::SamplingParams;

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

/// Generates `num_samples` continuations of `prompt` (at least one token) as one batch, calling
/// `on_token(sample, token)` as each token is chosen; an `on_token` that returns
/// `ControlFlow::Break` ends the generation after the current step. Returns the new tokens of
/// every sample.
pub fn generate<F: TokenFlow>(
    model: &Gpt,
    prompt: &[u32],
    opts: &GenerateOptions,
    device: &Device,
    mut on_token: impl FnMut(usize, u32) -> F,
) -> Vec<Vec<u32>> {
    assert!(
        !prompt.is_empty(),
        "the prompt must hold at least one token"
    );
    let n = opts.num_samples;
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed);
    let mut texts: Vec<Vec<u32>> = vec![prompt.to_vec(); n];
    let mut decoder = Decoder::new(model, opts.use_cache, device);
    let mut out = vec![Vec::with_capacity(opts.max_new_tokens); n];
    for _ in 0..opts.max_new_tokens {
        let last = decoder.next_logits(&texts); // (n, V) on the host
        let v = last.len() / n;
        let pickable = opts.tokens.min(v);
        let mut go_on = true;
        for (s, text) in texts.iter_mut().enumerate() {
            let token = opts.sampling.pick(&last[s * v..s * v + pickable], &mut rng);
            text.push(token);
            out[s].push(token);
            go_on &= on_token(s, token).go_on();
        }
        if !go_on {
            break;
        }
    }
    out
}

/// Produces the next-token logits of growing texts, with or without the key/value cache.
///
/// The context is the last `block_size` tokens. With the cache, each token costs one position's
/// work while the text fits in `block_size`; past that, the learned positions of every token in
/// the window shift at each step, so the window is run whole (and the cache refilled) per token,
/// which gives exactly the logits of the uncached path.
pub struct Decoder<'a> {
    model: &'a Gpt,
    cache: Option<KvCache>,
    device: Device,
}

impl<'a> Decoder<'a> {
    /// Decoding with `model` on `device`.
    pub fn new(model: &'a Gpt, use_cache: bool, device: &Device) -> Self {
        Self {
            model,
            cache: use_cache.then(|| KvCache::new(model.n_layer(), model.block_size())),
            device: device.clone(),
        }
    }

    /// Logits `[B * V]` (row after row) for the token after each text. The texts are the same
    /// length and only ever grow by one token per call.
    pub fn next_logits(&mut self, texts: &[Vec<u32>]) -> Vec<f32> {
        let (n, len) = (texts.len(), texts[0].len());
        let (model, device) = (self.model, &self.device);
        let block = model.block_size();
        let logits = match &mut self.cache {
            Some(cache) => {
                // One new token on a cache that still fits; else the window, from empty.
                let incremental = !cache.is_empty() && len == cache.len() + 1 && len <= block;
                let start = if incremental {
                    cache.len()
                } else {
                    cache.clear();
                    len.saturating_sub(block)
                };
                let new = ids_tensor(&window(texts, start, len), [n, len - start], device);
                model.forward_cached(new, cache) // (n, V)
            }
            None => {
                let start = len.saturating_sub(block);
                let ctx = ids_tensor(&window(texts, start, len), [n, len - start], device);
                let logits = model.forward(ctx); // (n, len - start, V)
                let [_, t, v] = logits.dims();
                logits.slice(s![.., t - 1..t, ..]).reshape([n, v])
            }
        };
        logits
            .into_data()
            .try_to_vec::<f32>()
            .expect("logits are f32")
    }
}

/// Tokens `from..to` of every sample, row after row.
fn window(texts: &[Vec<u32>], from: usize, to: usize) -> Vec<u32> {
    texts
        .iter()
        .flat_map(|t| t[from..to].iter().copied())
        .collect()
}
