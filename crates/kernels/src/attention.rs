//! Causal multi-head self-attention on the fused `qkv` projection, one (sequence, head) pair per
//! rayon task. The attention weights are kept for the backward pass.

use std::ops::Range;

use rayon::prelude::*;

use crate::matmul::{Mat, matmul_into_strided};
use crate::simd::{dot, exp_shifted_sum, max, multiversion};

/// The shape of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub batch: usize,
    pub seq: usize,
    pub n_head: usize,
    pub n_embd: usize,
}

impl Shape {
    fn head_size(&self) -> usize {
        self.n_embd / self.n_head
    }
}

/// A pointer that rayon tasks may share: each task writes only its own head's columns.
#[derive(Clone, Copy)]
struct SharedMut(*mut f32);
// SAFETY: used only to write disjoint elements from different tasks (see the call sites).
unsafe impl Send for SharedMut {}
unsafe impl Sync for SharedMut {}

impl SharedMut {
    /// The element `offset` places on (a method, so closures capture the wrapper, not the field).
    fn at(&self, offset: usize) -> *mut f32 {
        self.0.wrapping_add(offset)
    }
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
/// - qkv: `[B*T, 3C]` (queries, keys, values side by side; head h at columns `h*hs..`)
/// - att: `[B, H, T, T]` written: the attention weights
/// - y: `[B*T, C]` written: heads side by side
pub fn forward(qkv: &[f32], s: Shape, att: &mut [f32], y: &mut [f32]) {
    let (t, c, hs) = (s.seq, s.n_embd, s.head_size());
    assert_eq!(qkv.len(), s.batch * t * 3 * c);
    assert_eq!(att.len(), s.batch * s.n_head * t * t);
    assert_eq!(y.len(), s.batch * t * c);
    let scale = 1.0 / (hs as f32).sqrt();
    let y_ptr = SharedMut(y.as_mut_ptr());
    att.par_chunks_mut(t * t).enumerate().for_each(|(bh, p)| {
        let (b, h) = (bh / s.n_head, bh % s.n_head);
        let [q, k, v] = head(qkv, s, b, h);
        // Row block by row block, each against the keys it may see: the blocks above the
        // diagonal are never computed.
        for rows in row_blocks(t) {
            let seen = rows.end; // keys 0..seen
            block_scores(p, t, rows.clone(), q, k); // (rows, seen) scores
            for i in rows.clone() {
                causal_softmax_row(&mut p[i * t..(i + 1) * t], i, scale);
            }
            let weights = Mat::new(p, t, t).rows(rows.clone()).cols(0..seen);
            let y_rows = y_ptr.at((b * t + rows.start) * c + h * hs);
            // SAFETY: y's block for (b, h) is rows b*T.., columns h*hs.., which no other task
            // writes.
            unsafe {
                matmul_into_strided(y_rows, (c, 1), weights, v.rows(0..seen), false); // (rows, hs)
            }
        }
    });
}

/// Queries, keys and values of head `h` of sequence `b`: `[T, hs]` views into `qkv`.
fn head(qkv: &[f32], s: Shape, b: usize, h: usize) -> [Mat<'_>; 3] {
    let (t, c, hs) = (s.seq, s.n_embd, s.head_size());
    let seq = &qkv[b * t * 3 * c..(b + 1) * t * 3 * c];
    [0, 1, 2].map(|part| Mat::strided(&seq[part * c + h * hs..], t, hs, 3 * c, 1))
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

/// Backward of [`forward`]: writes `dqkv` from `dy` and the saved weights `att`.
///
/// # Shapes
/// - dy: `[B*T, C]`; qkv, dqkv: `[B*T, 3C]`; att: `[B, H, T, T]`
pub fn backward(dy: &[f32], qkv: &[f32], att: &[f32], s: Shape, dqkv: &mut [f32]) {
    let (t, c, hs) = (s.seq, s.n_embd, s.head_size());
    assert_eq!(qkv.len(), s.batch * t * 3 * c);
    assert_eq!(dqkv.len(), qkv.len());
    assert_eq!(att.len(), s.batch * s.n_head * t * t);
    assert_eq!(dy.len(), s.batch * t * c);
    let scale = 1.0 / (hs as f32).sqrt();
    let d_ptr = SharedMut(dqkv.as_mut_ptr());
    att.par_chunks(t * t).enumerate().for_each_init(
        || vec![0.0f32; t * t],
        |dp, (bh, p)| {
            let (b, h) = (bh / s.n_head, bh % s.n_head);
            let [q, k, v] = head(qkv, s, b, h);
            let dy_bh = Mat::strided(&dy[b * t * c + h * hs..], t, hs, c, 1);
            let p = Mat::new(p, t, t);
            let d_part =
                |part: usize, row: usize| d_ptr.at((b * t + row) * 3 * c + part * c + h * hs);
            // dP = dY Vᵀ and dS, row block by row block (entries above the diagonal are 0).
            for rows in row_blocks(t) {
                block_scores(dp, t, rows.clone(), dy_bh, v); // dP
                for i in rows {
                    softmax_backward_row(
                        &p.data[i * t..(i + 1) * t],
                        &mut dp[i * t..(i + 1) * t],
                        i,
                        scale,
                    );
                }
            }
            let ds = Mat::new(dp, t, t);
            // SAFETY: the dqkv blocks written (rows b*T.., columns h*hs.. of the q, k and v
            // parts) belong to (b, h) alone.
            for block in row_blocks(t) {
                let seen = block.end;
                let later = block.start..t; // the queries that see keys of this block
                unsafe {
                    // dQ = dS K for the block's queries.
                    matmul_into_strided(
                        d_part(0, block.start),
                        (3 * c, 1),
                        ds.rows(block.clone()).cols(0..seen),
                        k.rows(0..seen),
                        false,
                    );
                    // dK = dSᵀ Q and dV = Pᵀ dY for the block's keys.
                    matmul_into_strided(
                        d_part(1, block.start),
                        (3 * c, 1),
                        ds.rows(later.clone()).cols(block.clone()).t(),
                        q.rows(later.clone()),
                        false,
                    );
                    matmul_into_strided(
                        d_part(2, block.start),
                        (3 * c, 1),
                        p.rows(later.clone()).cols(block.clone()).t(),
                        dy_bh.rows(later),
                        false,
                    );
                }
            }
        },
    );
}
