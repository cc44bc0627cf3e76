//! Causal self-attention on the fused `qkv` projection laid out as [`QkvLayout`] says: multi-head,
//! or grouped-query when several query heads share a key/value head. The forward pass takes one
//! (sequence, query head) pair per rayon task, the backward one (sequence, key/value head), so
//! that a shared key's gradient is summed by one task, in head order. The attention weights
//! (before dropout) are kept for the backward pass; dropout's mask is recomputed from its seed.
//! [`forward_cached`] is the inference pass over a key/value cache, for sampling.

use std::ops::Range;

use rayon::prelude::*;

use crate::QkvLayout;
use crate::dropout::Mask;
use crate::matmul::{Mat, SharedMut, matmul_into_strided};
use crate::simd::{dot, exp_shifted_sum, max, multiversion};

/// The shape of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub batch: usize,
    pub seq: usize,
    pub layout: QkvLayout,
}

multiversion! {
    /// Scales row `i` of the scores, and turns its first `i + 1` entries into softmax weights;
    /// the entries after them (the future) become 0.
    pub fn causal_softmax_row(row: &mut [f32], i: usize, scale: f32) {
        let (seen, future) = row.split_at_mut(i + 1);
        for s in seen.iter_mut() {
            *s *= scale;
        }
        let total = exp_shifted_sum(seen, max(seen));
        let inv = 1.0 / total;
        for s in seen.iter_mut() {
            *s *= inv;
        }
        future.fill(0.0);
    }
}

multiversion! {
    /// `dS = P ⊙ (dP - Σ_j P dP) * scale` for row `i`, in place in `dp`.
    pub fn softmax_backward_row(p: &[f32], dp: &mut [f32], i: usize, scale: f32) {
        let n = i + 1;
        let d = dot(&p[..n], &dp[..n]);
        for (g, w) in dp[..n].iter_mut().zip(&p[..n]) {
            *g = w * (*g - d) * scale;
        }
        dp[n..].fill(0.0);
    }
}

/// # Shapes
/// - qkv: `[B*T, W]` (queries, keys, values side by side as `s.layout` says: `W` its width)
/// - att: `[B, H, T, T]` written: the attention weights, before dropout
/// - y: `[B*T, C]` written: the `H` query heads side by side (`C` the queries' width)
///
/// With `dropout`, the weights that mix the values are `att ⊙ mask`, element `(b, h, i, j)` of
/// the mask being [`Mask::factor`] of its index in `att`.
pub fn forward(qkv: &[f32], s: Shape, dropout: Option<Mask>, att: &mut [f32], y: &mut [f32]) {
    let (t, l) = (s.seq, s.layout);
    let (c, hs) = (l.q_width(), l.head_size);
    assert_eq!(qkv.len(), s.batch * t * l.width());
    assert_eq!(att.len(), s.batch * l.n_head * t * t);
    assert_eq!(y.len(), s.batch * t * c);
    let scale = 1.0 / (hs as f32).sqrt();
    let y_ptr = SharedMut(y.as_mut_ptr());
    att.par_chunks_mut(t * t).enumerate().for_each_init(
        || {
            if dropout.is_some() {
                vec![0.0f32; t * t]
            } else {
                Vec::new()
            }
        },
        |dropped, (bh, p)| {
            let (b, h) = (bh / l.n_head, bh % l.n_head);
            let [q, k, v] = head(qkv, s, b, h);
            // Row block by row block, each against the keys it may see: the blocks above the
            // diagonal are never computed.
            for rows in row_blocks(t) {
                let seen = rows.end; // keys 0..seen
                block_scores(p, t, rows.clone(), q, k); // (rows, seen) scores
                for i in rows.clone() {
                    causal_softmax_row(&mut p[i * t..(i + 1) * t], i, scale);
                }
                let weights = match dropout {
                    Some(mask) => {
                        apply_mask(p, dropped, t, rows.clone(), mask, bh);
                        Mat::new(dropped, t, t)
                    }
                    None => Mat::new(p, t, t),
                };
                let weights = weights.rows(rows.clone()).cols(0..seen);
                let y_rows = y_ptr.at((b * t + rows.start) * c + h * hs);
                // SAFETY: y's block for (b, h) is rows b*T.., columns h*hs.., which no other
                // task writes.
                unsafe {
                    matmul_into_strided(y_rows, (c, 1), weights, v.rows(0..seen), false); // (rows, hs)
                }
            }
        },
    );
}

/// Rows `rows` of `out = p ⊙ mask` for the `[T, T]` weights of (sequence, head) `bh`; the
/// entries after the diagonal (the future) are 0.
fn apply_mask(p: &[f32], out: &mut [f32], t: usize, rows: Range<usize>, mask: Mask, bh: usize) {
    for i in rows {
        let first = ((bh * t + i) * t) as u64;
        let (seen, future) = out[i * t..(i + 1) * t].split_at_mut(i + 1);
        for (j, (o, w)) in seen.iter_mut().zip(&p[i * t..]).enumerate() {
            *o = w * mask.factor(first + j as u64);
        }
        future.fill(0.0);
    }
}

/// Queries of head `h` of sequence `b`, and the keys and values it attends with: `[T, hs]`
/// views into `qkv`.
fn head(qkv: &[f32], s: Shape, b: usize, h: usize) -> [Mat<'_>; 3] {
    let (t, l) = (s.seq, s.layout);
    let (w, g) = (l.width(), l.kv_head(h));
    let seq = &qkv[b * t * w..(b + 1) * t * w];
    [l.q_head(h), l.k_head(g), l.v_head(g)]
        .map(|cols| Mat::strided(&seq[cols.start..], t, l.head_size, w, 1))
}

/// `a[rows] · b[0..rows.end]ᵀ` into rows `rows` of the `[T, T]` matrix `out`: a block of
/// queries against the keys they may see (or the same for the scores' gradient).
fn block_scores(out: &mut [f32], t: usize, rows: Range<usize>, a: Mat, b: Mat) {
    let seen = rows.end;
    let out = &mut out[rows.start * t..rows.end * t];
    // SAFETY: `out` holds rows.len() rows of t, and the product writes rows.len() x seen of
    // them, seen <= t.
    unsafe {
        matmul_into_strided(
            out.as_mut_ptr(),
            (t, 1),
            a.rows(rows),
            b.rows(0..seen).t(),
            false,
        );
    }
}

/// Rows of the score matrix handled together: big enough for efficient products, small
/// enough that little of the masked upper triangle is computed.
fn row_blocks(t: usize) -> impl Iterator<Item = Range<usize>> {
    const BLOCK: usize = 64;
    (0..t.div_ceil(BLOCK)).map(move |i| i * BLOCK..((i + 1) * BLOCK).min(t))
}

/// Backward of [`forward`]: writes `dqkv` from `dy`, the saved weights `att` and the same
/// `dropout`. One task per (sequence, key/value head): its query heads one after another, the
/// first writing the shared keys' and values' gradients and the others adding to them.
///
/// # Shapes
/// - dy: `[B*T, C]`; qkv, dqkv: `[B*T, W]`; att: `[B, H, T, T]`
pub fn backward(
    dy: &[f32],
    qkv: &[f32],
    att: &[f32],
    s: Shape,
    dropout: Option<Mask>,
    dqkv: &mut [f32],
) {
    let (t, l) = (s.seq, s.layout);
    let (c, w, hs, group) = (l.q_width(), l.width(), l.head_size, l.group());
    assert_eq!(qkv.len(), s.batch * t * w);
    assert_eq!(dqkv.len(), qkv.len());
    assert_eq!(att.len(), s.batch * l.n_head * t * t);
    assert_eq!(dy.len(), s.batch * t * c);
    let scale = 1.0 / (hs as f32).sqrt();
    let d_ptr = SharedMut(dqkv.as_mut_ptr());
    // The query heads of one key/value head are consecutive: so are their weights.
    att.par_chunks(group * t * t).enumerate().for_each_init(
        || {
            let dropped = if dropout.is_some() { t * t } else { 0 };
            (vec![0.0f32; t * t], vec![0.0f32; dropped])
        },
        |(dp, dropped), (bg, ps)| {
            let (b, g) = (bg / l.n_kv_head, bg % l.n_kv_head);
            for (member, p) in ps.chunks_exact(t * t).enumerate() {
                let h = g * group + member;
                let bh = b * l.n_head + h;
                let [q, k, v] = head(qkv, s, b, h);
                let dy_bh = Mat::strided(&dy[b * t * c + h * hs..], t, hs, c, 1);
                // The weights that mixed the values: after dropout, if any.
                let mixed = match dropout {
                    Some(mask) => {
                        apply_mask(p, dropped, t, 0..t, mask, bh);
                        Mat::new(dropped, t, t)
                    }
                    None => Mat::new(p, t, t),
                };
                let d_at =
                    |cols: Range<usize>, row: usize| d_ptr.at((b * t + row) * w + cols.start);
                // dP = (dY Vᵀ) ⊙ mask and dS, row block by row block (entries above the
                // diagonal are 0).
                for rows in row_blocks(t) {
                    block_scores(dp, t, rows.clone(), dy_bh, v);
                    for i in rows {
                        let row = &mut dp[i * t..(i + 1) * t];
                        if let Some(mask) = dropout {
                            let first = ((bh * t + i) * t) as u64;
                            for (j, d) in row[..=i].iter_mut().enumerate() {
                                *d *= mask.factor(first + j as u64);
                            }
                        }
                        softmax_backward_row(&p[i * t..(i + 1) * t], row, i, scale);
                    }
                }
                let ds = Mat::new(dp, t, t);
                // The group's first head writes the keys' and values' gradients, the others
                // add theirs.
                let add = member > 0;
                // SAFETY: the dqkv blocks written (rows b*T.., the columns of query head h and
                // of key/value head g) belong to (b, g) alone.
                for block in row_blocks(t) {
                    let seen = block.end;
                    let later = block.start..t; // the queries that see keys of this block
                    unsafe {
                        // dQ = dS K for the block's queries.
                        matmul_into_strided(
                            d_at(l.q_head(h), block.start),
                            (w, 1),
                            ds.rows(block.clone()).cols(0..seen),
                            k.rows(0..seen),
                            false,
                        );
                        // dK = dSᵀ Q and dV = (P ⊙ mask)ᵀ dY for the block's keys.
                        matmul_into_strided(
                            d_at(l.k_head(g), block.start),
                            (w, 1),
                            ds.rows(later.clone()).cols(block.clone()).t(),
                            q.rows(later.clone()),
                            add,
                        );
                        matmul_into_strided(
                            d_at(l.v_head(g), block.start),
                            (w, 1),
                            mixed.rows(later.clone()).cols(block.clone()).t(),
                            dy_bh.rows(later),
                            add,
                        );
                    }
                }
            }
        },
    );
}

/// The shape of one call of [`forward_cached`].
#[derive(Debug, Clone, Copy)]
pub struct CachedShape {
    /// Texts decoded together.
    pub samples: usize,
    /// New positions per text.
    pub new: usize,
    /// Positions the cache holds for each text.
    pub block: usize,
    /// Texts the buffers have room for (their places, one per text, some of them free): a
    /// part of the model's cache.
    pub room: usize,
    pub layout: QkvLayout,
}

/// Attention for inference over a key/value cache: the new positions' keys and values are
/// written into text `t`'s place in the cache, `places[t]`, after the `starts[t]` positions it
/// has there already (each text its own length; [`crate::start_of`]), and each new query
/// attends to every position of its text up to its own that the cache holds (the last `block`,
/// past them: see below). The other places are neither read nor written: texts join a free
/// place and leave one without moving the others. With `last_only`, only each text's last query
/// is computed (all a sampler needs of the last block).
///
/// The cache is a ring: position `p` sits in slot `p % block`. A text past `block` positions
/// (one new position per pass, then) writes over its oldest and attends to its last `block`:
/// the sliding window of rotary positions, whose keys carry only their distance to the query.
///
/// # Shapes
/// - qkv: `[S, new, W]` (as `s.layout` says); keys: `[P, KV, block]` (a position's key is a
///   column), values: `[P, block, KV]`, the key/value heads side by side (`P`: `s.room`);
///   starts: `[S]` or `[0]`; places: `[S]`, distinct, each below `P`
/// - y: `[S, new, C]` written, or `[S, 1, C]` with `last_only` (`C` the queries' width)
#[allow(clippy::too_many_arguments)] // the slices, and what says where they lie
pub fn forward_cached(
    qkv: &[f32],
    keys: &mut [f32],
    values: &mut [f32],
    s: CachedShape,
    starts: &[usize],
    places: &[usize],
    last_only: bool,
    y: &mut [f32],
) {
    let (n, l) = (s.new, s.layout);
    let (c, kv, w) = (l.q_width(), l.kv_width(), l.width());
    let start = |text: usize| crate::start_of(starts, text);
    assert!(
        (0..s.samples).all(|t| start(t) + n <= s.block || n == 1),
        "a pass fits in the cache's block positions, or slides it by one"
    );
    assert_eq!(qkv.len(), s.samples * n * w);
    assert_eq!(keys.len(), s.room * s.block * kv);
    assert_eq!(values.len(), keys.len());
    assert_eq!(places.len(), s.samples, "one place per text");
    // Distinct: the model's cache checks it for both its paths (`KvCache::starts`).
    let out_rows = if last_only { 1 } else { n };
    assert_eq!(y.len(), s.samples * out_rows * c);
    for (r, row) in qkv.chunks_exact(w).enumerate() {
        let (place, slot) = (places[r / n], (start(r / n) + r % n) % s.block);
        let at = (place * s.block + slot) * kv;
        values[at..at + kv].copy_from_slice(&row[l.v()]);
        // A position's key is a column of its place's `[KV, block]`.
        let place_keys = &mut keys[place * kv * s.block..(place + 1) * kv * s.block];
        for (column, &k) in place_keys.chunks_exact_mut(s.block).zip(&row[l.k()]) {
            column[slot] = k;
        }
    }
    if starts.iter().all(|&p| p == 0) && n > 1 {
        // A window from an empty cache: the training pass's causal attention (matrix products).
        let shape = Shape {
            batch: s.samples,
            seq: n,
            layout: l,
        };
        let mut att = vec![0.0f32; s.samples * l.n_head * n * n];
        if last_only {
            let mut all = vec![0.0f32; s.samples * n * c];
            forward(qkv, shape, None, &mut att, &mut all);
            for (dst, src) in y.chunks_exact_mut(c).zip(all.chunks_exact(n * c)) {
                dst.copy_from_slice(&src[(n - 1) * c..]);
            }
        } else {
            forward(qkv, shape, None, &mut att, y);
        }
        return;
    }
    let scale = 1.0 / (l.head_size as f32).sqrt();
    let (keys, values) = (&*keys, &*values);
    // One task per (text, output row): its query, every head, against the positions it may see.
    y.par_chunks_mut(c)
        .enumerate()
        .for_each_init(Vec::new, |weights, (row, out)| {
            let (sample, i) = (row / out_rows, row % out_rows + (n - out_rows));
            let q = &qkv[(sample * n + i) * w..][l.q()];
            let place = places[sample];
            // Keys [KV, block] and values [block, KV].
            let cache = place * s.block * kv..(place + 1) * s.block * kv;
            // Past block positions, every slot: the last block, in ring order (the sums ignore it).
            let seen = (start(sample) + i + 1).min(s.block);
            weights.resize(l.n_head * seen, 0.0);
            let at = Attend {
                layout: l,
                seen,
                scale,
            };
            attend_row(q, &keys[cache.clone()], &values[cache], at, weights, out);
        });
}

/// What [`attend_row`] needs besides its slices.
#[derive(Clone, Copy)]
struct Attend {
    layout: QkvLayout,
    /// Cached positions the query sees: the first `seen` of the text's.
    seen: usize,
    scale: f32,
}

multiversion! {
    /// One position's query `q` `[C]` (heads side by side) against the first `a.seen` cached
    /// positions of its text, `keys` `[KV, block]` (a position's key is a column) and `values`
    /// `[block, KV]`: `out` `[C]` written, `scratch` `[H * seen]` (each head's weights). A
    /// head's scores are summed over its dimensions, each a row of keys times one number of the
    /// query: a vector over the positions, with no sums across a vector's lanes.
    fn attend_row(
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        a: Attend,
        scratch: &mut [f32],
        out: &mut [f32],
    ) {
        let (l, seen) = (a.layout, a.seen);
        let (hs, kv, group) = (l.head_size, l.kv_width(), l.group());
        let block = keys.len() / kv;
        let weights = &mut scratch[..l.n_head * seen];
        // Key/value head g serves query heads g * group.. (g + 1) * group.
        for (h, (q, w)) in q.chunks_exact(hs).zip(weights.chunks_exact_mut(seen)).enumerate() {
            let head_keys = &keys[h / group * hs * block..];
            w.fill(0.0);
            for (&q, k) in q.iter().zip(head_keys.chunks_exact(block)) {
                axpy(w, q, &k[..seen]);
            }
            w.iter_mut().for_each(|w| *w *= a.scale);
        }
        for w in weights.chunks_exact_mut(seen) {
            let shift = max(w);
            let total = exp_shifted_sum(w, shift);
            w.iter_mut().for_each(|w| *w /= total);
        }
        match hs {
            32 => return weighted_values::<32>(weights, values, l, out),
            64 => return weighted_values::<64>(weights, values, l, out),
            _ => {}
        }
        out.fill(0.0);
        for (t, v) in values.chunks_exact(kv).take(seen).enumerate() {
            if group == 1 {
                for (h, (o, v)) in out.chunks_exact_mut(hs).zip(v.chunks_exact(hs)).enumerate() {
                    axpy(o, weights[h * seen + t], v);
                }
                continue;
            }
            let heads = out.chunks_exact_mut(hs * group).zip(v.chunks_exact(hs));
            for (g, (o, v)) in heads.enumerate() {
                for (j, o) in o.chunks_exact_mut(hs).enumerate() {
                    axpy(o, weights[(g * group + j) * seen + t], v);
                }
            }
        }
    }
}

/// `out` `[C]`: each query head's `weights` `[H, seen]` over the `values` `[block, KV]` of its
/// key/value head, for heads of `HS`. Each head's sum is kept in registers over the positions
/// (summed in the same order as position after position through `out`: the same bits).
#[inline(always)]
fn weighted_values<const HS: usize>(
    weights: &[f32],
    values: &[f32],
    l: QkvLayout,
    out: &mut [f32],
) {
    let (kv, seen) = (l.kv_width(), weights.len() / l.n_head);
    for (h, (o, w)) in out
        .chunks_exact_mut(HS)
        .zip(weights.chunks_exact(seen))
        .enumerate()
    {
        let at = h / l.group() * HS;
        let mut acc = [0f32; HS];
        for (&w, v) in w.iter().zip(values.chunks_exact(kv)) {
            let v: &[f32; HS] = v[at..at + HS].try_into().expect("a head of HS values");
            for (a, v) in acc.iter_mut().zip(v) {
                *a += w * v;
            }
        }
        o.copy_from_slice(&acc);
    }
}

/// `o += w * v`.
#[inline(always)]
fn axpy(o: &mut [f32], w: f32, v: &[f32]) {
    for (o, v) in o.iter_mut().zip(v) {
        *o += w * v;
    }
}
