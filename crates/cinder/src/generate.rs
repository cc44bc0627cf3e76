//! Autoregressive generation, with or without the key/value cache.

use burn::prelude::*;
use cinder_model::{Gpt, KvCache};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::data::ids_tensor;
use crate::kernels::params_of;
use crate::sampling::SamplingParams;
use cinder_kernels::{Params, infer as kernels};

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub num_samples: usize,
    pub sampling: SamplingParams,
    pub seed: u64,
    /// Use the key/value cache (same text, faster); off re-runs the whole window per token.
    pub use_cache: bool,
    /// Run on cinder's hand-written CPU kernels (on a copy of the weights) instead of Burn.
    pub kernels: bool,
}

/// Generates `num_samples` continuations of `prompt` (at least one token) as one batch, calling
/// `on_token(sample, token)` as each token is chosen. Returns the new tokens of every sample.
pub fn generate(
    model: &Gpt,
    prompt: &[u32],
    opts: &GenerateOptions,
    device: &Device,
    mut on_token: impl FnMut(usize, u32),
) -> Vec<Vec<u32>> {
    assert!(
        !prompt.is_empty(),
        "the prompt must hold at least one token"
    );
    let n = opts.num_samples;
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed);
    let mut texts: Vec<Vec<u32>> = vec![prompt.to_vec(); n];
    let mut decoder = if opts.kernels {
        Decoder::kernels(model, opts.use_cache, n)
    } else {
        Decoder::new(model, opts.use_cache, device)
    };
    let mut out = vec![Vec::with_capacity(opts.max_new_tokens); n];
    for _ in 0..opts.max_new_tokens {
        let last = decoder.next_logits(&texts); // (n, V) on the host
        let v = last.len() / n;
        for (s, text) in texts.iter_mut().enumerate() {
            let token = opts.sampling.pick(&last[s * v..(s + 1) * v], &mut rng);
            text.push(token);
            out[s].push(token);
            on_token(s, token);
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
    inner: Inner<'a>,
}

enum Inner<'a> {
    Burn {
        model: &'a Gpt,
        cache: Option<KvCache>,
        device: Device,
    },
    Kernels {
        params: Params,
        cache: kernels::KvCache,
        use_cache: bool,
    },
}

impl<'a> Decoder<'a> {
    /// Decoding with the Burn model on `device`.
    pub fn new(model: &'a Gpt, use_cache: bool, device: &Device) -> Self {
        Self {
            inner: Inner::Burn {
                model,
                cache: use_cache.then(|| KvCache::new(model.n_layer())),
                device: device.clone(),
            },
        }
    }

    /// Decoding `samples` texts at a time on the hand-written CPU kernels, with a copy of the
    /// model's weights.
    pub fn kernels(model: &Gpt, use_cache: bool, samples: usize) -> Self {
        let params = params_of(model);
        Self {
            inner: Inner::Kernels {
                cache: kernels::KvCache::new(&params, samples),
                params,
                use_cache,
            },
        }
    }

    /// Logits `[B * V]` (row after row) for the token after each text. The texts are the same
    /// length and only ever grow by one token per call.
    pub fn next_logits(&mut self, texts: &[Vec<u32>]) -> Vec<f32> {
        let (n, len) = (texts.len(), texts[0].len());
        match &mut self.inner {
            Inner::Burn {
                model,
                cache,
                device,
            } => {
                let block = model.block_size();
                let logits = match cache {
                    Some(cache) => {
                        if len > block {
                            *cache = KvCache::new(model.n_layer()); // the window slid: run it whole
                        }
                        let start = if len > block {
                            len - block
                        } else {
                            cache.len()
                        };
                        let new = ids_tensor(&window(texts, start, len), [n, len - start], device);
                        model.forward_cached(new, cache) // (n, len - start, V)
                    }
                    None => {
                        let start = len.saturating_sub(block);
                        let ctx = ids_tensor(&window(texts, start, len), [n, len - start], device);
                        model.forward(ctx) // (n, len - start, V)
                    }
                };
                last_position(logits)
            }
            Inner::Kernels {
                params,
                cache,
                use_cache,
            } => {
                let block = params.dims.block_size;
                // One new token on a cache that still fits; else the window, from empty.
                let incremental =
                    *use_cache && !cache.is_empty() && len == cache.len() + 1 && len <= block;
                let start = if incremental {
                    cache.len()
                } else {
                    cache.clear();
                    len.saturating_sub(block)
                };
                kernels::extend(params, cache, &window(texts, start, len)) // (n, V)
            }
        }
    }
}

/// Tokens `from..to` of every sample, row after row.
fn window(texts: &[Vec<u32>], from: usize, to: usize) -> Vec<u32> {
    texts
        .iter()
        .flat_map(|t| t[from..to].iter().copied())
        .collect()
}

/// The logits of the last position of each row, `[B, V]` flattened, on the host.
fn last_position(logits: Tensor<3>) -> Vec<f32> {
    let [b, t, v] = logits.dims();
    logits
        .slice(s![.., t - 1..t, ..])
        .reshape([b * v])
        .into_data()
        .try_to_vec::<f32>()
        .expect("logits are f32")
}
