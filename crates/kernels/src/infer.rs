//! Inference with a key/value cache: the forward pass over the tokens that follow those already
//! seen, returning each sample's next-token logits. For sampling.
//!
//! A cache is filled either from empty with any number of tokens (a prompt, or a window that
//! slid past `block_size`: the causal attention of [`crate::attention`]), or one token at a time
//! (that token's query against every cached key).

use std::sync::OnceLock;

use rayon::prelude::*;

use crate::attention::{self, Shape};
use crate::matmul::{Mat, matmul};
use crate::params::Params;
use crate::simd::{add_assign, dot, exp_shifted_sum, max};
use crate::{gelu, layernorm, linear};

/// Keys and values of the tokens seen, per layer: `[S, block_size, C]` each, heads side by side.
pub struct KvCache {
    samples: usize,
    len: usize,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

impl KvCache {
    /// An empty cache for `samples` texts decoded together.
    pub fn new(p: &Params, samples: usize) -> Self {
        let d = p.dims;
        let size = samples * d.block_size * d.n_embd;
        Self {
            samples,
            len: 0,
            keys: (0..d.n_layer).map(|_| vec![0.0; size]).collect(),
            values: (0..d.n_layer).map(|_| vec![0.0; size]).collect(),
        }
    }

    /// Positions seen.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets every position (the buffers are kept).
    pub fn clear(&mut self) {
        self.len = 0;
    }
}

/// Feeds `tokens` (`[S, n]`, row-major: `n` new tokens per sample) after those in `cache` and
/// returns the logits of the token after the last, `[S, V]`. The cache must be empty or `n`
/// must be 1, and it may hold at most `block_size` positions.
pub fn extend(p: &Params, cache: &mut KvCache, tokens: &[u32]) -> Vec<f32> {
    // Small passes (one token, or a tiny model) spend more on waking threads than they gain
    // from them: they run on a pool of one thread (measured in BENCHMARKS.md).
    let weights: usize = p.vectors().iter().map(|v| v.len()).sum();
    if tokens.len() * weights < SMALL_PASS {
        static ONE_THREAD: OnceLock<rayon::ThreadPool> = OnceLock::new();
        let pool = ONE_THREAD.get_or_init(|| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .expect("a one-thread pool")
        });
        pool.install(|| extend_on(p, cache, tokens))
    } else {
        extend_on(p, cache, tokens)
    }
}

/// Multiply-adds (tokens x weights) below which a pass runs on one thread.
const SMALL_PASS: usize = 200_000_000;

fn extend_on(p: &Params, cache: &mut KvCache, tokens: &[u32]) -> Vec<f32> {
    let d = p.dims;
    let (s, c) = (cache.samples, d.n_embd);
    let n = tokens.len() / s;
    let start = cache.len;
    assert_eq!(
        tokens.len(),
        s * n,
        "tokens do not match the cache's samples"
    );
    assert!(
        n >= 1 && (start == 0 || n == 1),
        "extend an empty cache, or one token at a time"
    );
    assert!(
        start + n <= d.block_size,
        "the cache holds at most block_size positions"
    );
    let rows = s * n;
    let z = |len: usize| vec![0.0f32; len];

    // Token plus position embeddings. (rows, C)
    let mut x = z(rows * c);
    for (r, row) in x.chunks_exact_mut(c).enumerate() {
        let (tok, pos) = (tokens[r] as usize, start + r % n);
        row.copy_from_slice(&p.wte[tok * c..(tok + 1) * c]);
        add_assign(row, &p.wpe[pos * c..(pos + 1) * c]);
    }
    let shape = Shape {
        batch: s,
        seq: n,
        n_head: d.n_head,
        n_embd: c,
    };
    for (l, b) in p.blocks.iter().enumerate() {
        let rows = x.len() / c;
        let (mut ln, mut mean, mut rstd) = (z(rows * c), z(rows), z(rows));
        let mut qkv = z(rows * 3 * c);
        layernorm::forward(&x, &b.ln_1, &mut ln, &mut mean, &mut rstd);
        linear::forward(&ln, &b.c_attn, &mut qkv); // (rows, 3C)
        // The new keys and values join the cache.
        for (r, row) in qkv.chunks_exact(3 * c).enumerate() {
            let at = ((r / n) * d.block_size + start + r % n) * c;
            cache.keys[l][at..at + c].copy_from_slice(&row[c..2 * c]);
            cache.values[l][at..at + c].copy_from_slice(&row[2 * c..]);
        }
        let last_block = l + 1 == d.n_layer;
        if last_block && n > 1 {
            // Only the last position of each sample matters from here on: its query against
            // the cache, and the rest of the block on those rows alone. (S, C)
            x = last_rows(&x, n, c);
            qkv = last_rows(&qkv, n, 3 * c);
        }
        let rows = x.len() / c;
        let mut att_y = z(rows * c);
        if rows == s {
            attend(&qkv, cache, l, start + n, d.n_head, &mut att_y);
        } else {
            let mut att = z(s * d.n_head * n * n);
            attention::forward(&qkv, shape, &mut att, &mut att_y);
        }
        let (mut ln, mut mean, mut rstd) = (z(rows * c), z(rows), z(rows));
        let (mut x_mid, mut fc, mut fc_gelu) = (z(rows * c), z(rows * 4 * c), z(rows * 4 * c));
        linear::forward_residual(&att_y, &b.attn_proj, &x, &mut x_mid);
        layernorm::forward(&x_mid, &b.ln_2, &mut ln, &mut mean, &mut rstd);
        linear::forward(&ln, &b.c_fc, &mut fc); // (rows, 4C)
        gelu::forward(&fc, &mut fc_gelu);
        linear::forward_residual(&fc_gelu, &b.mlp_proj, &x_mid, &mut x);
    }
    cache.len += n;

    // The last position of each sample: final LayerNorm and the tied head. (S, V)
    let last = if x.len() == s * c {
        x
    } else {
        last_rows(&x, n, c)
    };
    let (mut out, mut mean, mut rstd) = (z(s * c), z(s), z(s));
    layernorm::forward(&last, &p.ln_f, &mut out, &mut mean, &mut rstd);
    let mut logits = z(s * d.vocab_size);
    matmul(
        &mut logits,
        Mat::new(&out, s, c),
        Mat::new(&p.wte, d.vocab_size, c).t(),
        false,
    );
    logits
}

/// Rows `n - 1, 2n - 1, ...` of a `[S * n, width]` matrix: each sample's last position.
fn last_rows(m: &[f32], n: usize, width: usize) -> Vec<f32> {
    m.chunks_exact(width)
        .skip(n - 1)
        .step_by(n)
        .flatten()
        .copied()
        .collect()
}

/// Attention of one query per sample (the position `seen - 1`) over the first `seen` cached
/// positions.
///
/// # Shapes
/// - qkv: `[S, 3C]`; y: `[S, C]` written
fn attend(qkv: &[f32], cache: &KvCache, layer: usize, seen: usize, n_head: usize, y: &mut [f32]) {
    let c = y.len() / cache.samples;
    let hs = c / n_head;
    let block = cache.keys[layer].len() / (cache.samples * c);
    let scale = 1.0 / (hs as f32).sqrt();
    y.par_chunks_mut(hs).enumerate().for_each(|(sh, out)| {
        let (sample, h) = (sh / n_head, sh % n_head);
        let q = &qkv[sample * 3 * c + h * hs..][..hs];
        let at = |t: usize| (sample * block + t) * c + h * hs;
        let keys = &cache.keys[layer];
        let values = &cache.values[layer];
        let mut w: Vec<f32> = (0..seen)
            .map(|t| dot(q, &keys[at(t)..at(t) + hs]) * scale)
            .collect();
        let shift = max(&w);
        let total = exp_shifted_sum(&mut w, shift);
        out.fill(0.0);
        for (t, wt) in w.iter().enumerate() {
            let wt = wt / total;
            for (o, v) in out.iter_mut().zip(&values[at(t)..at(t) + hs]) {
                *o += wt * v;
            }
        }
    });
}
