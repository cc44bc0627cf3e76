//! Queries and keys before attention: each head's RMS-normalised (QK-norm) and then rotated by
//! its position (rotary embeddings, RoPE), on the fused `[N, W]` projection ([`QkvLayout`]).
//! Values pass unchanged. RoPE pairs the two halves of a head (GPT-NeoX's layout): element `i` and
//! `i + hs/2` turn by the angle `pos · base^(-i / (hs/2))`.

use std::cell::RefCell;
use std::collections::HashMap;

use rayon::prelude::*;

use crate::{QkvLayout, rmsnorm, rows};

/// RoPE's base (RoFormer's, Llama's, the nanoGPT speedrun's).
pub const ROPE_BASE: f64 = 10_000.0;

/// What happens to the queries and keys of a `[B·T, W]` projection whose rows are the
/// positions `starts[b]..starts[b] + seq` of each sequence `b`.
#[derive(Debug, Clone, PartialEq)]
pub struct Qk {
    pub layout: QkvLayout,
    pub seq: usize,
    /// Each sequence's first position, or none when all start at 0 ([`crate::start_of`]).
    pub starts: Vec<usize>,
    /// Rotate by position (RoPE).
    pub rope: bool,
    /// RMS-normalise each head, with this epsilon (QK-norm).
    pub norm_eps: Option<f32>,
}

/// Positions whose angles each thread keeps once computed (per head size): every pass of a
/// decoding step turns by the same few positions, layer after layer and step after step.
/// Past them (a sliding cache far along) angles are computed for each pass.
const KEPT_POSITIONS: usize = 1 << 13;

/// The cosines and sines of consecutive positions' angles: `[positions, hs/2]` each.
type Table = (Vec<f32>, Vec<f32>);

thread_local! {
    /// Head size -> the cosines and sines of positions `0..len / (hs/2)`, as [`angles`]
    /// computes them.
    static KEPT: RefCell<HashMap<usize, Table>> = RefCell::default();
}

/// The cosines and sines of RoPE's angles for positions `start..start + seq`: `[seq, hs/2]` each.
/// The composite version builds its tensors from this table too.
pub fn rope_table(start: usize, seq: usize, head_size: usize) -> Table {
    let half = head_size / 2;
    let end = start + seq;
    let kept = end.min(KEPT_POSITIONS);
    let (mut cos, mut sin) = (
        Vec::with_capacity(seq * half),
        Vec::with_capacity(seq * half),
    );
    if start < kept {
        KEPT.with_borrow_mut(|tables| {
            let (c, s) = tables.entry(head_size).or_default();
            let have = c.len() / half.max(1);
            if have < kept {
                // Grown by doubling, so that a stream's growing positions rarely come here.
                let (more_c, more_s) = angles(have, (2 * kept).min(KEPT_POSITIONS), head_size);
                c.extend(more_c);
                s.extend(more_s);
            }
            cos.extend_from_slice(&c[start * half..kept * half]);
            sin.extend_from_slice(&s[start * half..kept * half]);
        });
    }
    let (c, s) = angles(start.max(kept), end, head_size);
    cos.extend(c);
    sin.extend(s);
    (cos, sin)
}

/// The cosines and sines of RoPE's angles for positions `from..to` (none if `to <= from`):
/// `[to - from, hs/2]` each.
fn angles(from: usize, to: usize, head_size: usize) -> Table {
    if to <= from {
        return (Vec::new(), Vec::new());
    }
    let half = head_size / 2;
    let inv: Vec<f32> = (0..half)
        .map(|i| ROPE_BASE.powf(-(i as f64) / half as f64) as f32)
        .collect();
    let angles = || (from..to).flat_map(|p| inv.iter().map(move |f| (p as f32 * f) as f64));
    (
        angles().map(|a| a.cos() as f32).collect(),
        angles().map(|a| a.sin() as f32).collect(),
    )
}

/// Turns one head `x` `[hs]` by the angles whose cosines and sines are `cos`, `sin` `[hs/2]`;
/// `inverse` turns it back (the transpose: the backward pass).
fn rotate(x: &mut [f32], cos: &[f32], sin: &[f32], inverse: bool) {
    let (lo, hi) = x.split_at_mut(cos.len());
    for (((a, b), &c), &s) in lo.iter_mut().zip(hi.iter_mut()).zip(cos).zip(sin) {
        let s = if inverse { -s } else { s };
        (*a, *b) = (*a * c - *b * s, *a * s + *b * c);
    }
}

/// The cosine and sine tables of `s`, `[rows, hs/2]` each, one row of angles per position row
/// ([`crate::position_rows`]: the `seq` positions of each sequence, or of all at once); empty
/// without RoPE. Only the positions the pass has are computed: a text decoded past its context
/// with a sliding cache is at positions that grow without end.
fn tables(s: &Qk) -> (Vec<f32>, Vec<f32>) {
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    if s.rope {
        for start in crate::position_rows(&s.starts) {
            let (c, sn) = rope_table(start, s.seq, s.layout.head_size);
            cos.extend(c);
            sin.extend(sn);
        }
    }
    (cos, sin)
}

impl Qk {
    /// The row of [`tables`] that row `row` of the `[B·T, W]` projection turns by.
    fn table_row(&self, row: usize) -> usize {
        if self.starts.is_empty() {
            row % self.seq
        } else {
            row
        }
    }

    /// Heads turned per row: the queries', then the keys' (whose columns follow them).
    pub fn heads(&self) -> usize {
        self.layout.n_head + self.layout.n_kv_head
    }
}

/// `out` = `qkv` with its queries and keys normalised and rotated as `s` says; each head's
/// 1/rms goes to `rstd` (queries' heads, then keys'; 1 without QK-norm).
///
/// # Shapes
/// - qkv, out: `[N, W]` with `N` a multiple of `s.seq`; rstd: `[N, H + KV]` ([`Qk::heads`])
pub fn forward(qkv: &[f32], s: &Qk, out: &mut [f32], rstd: &mut [f32]) {
    let (w, h, hs) = (s.layout.width(), s.heads(), s.layout.head_size);
    let (cos, sin) = tables(s);
    let rows = rows_per(w);
    out.par_chunks_mut(w * rows)
        .zip(qkv.par_chunks(w * rows))
        .zip(rstd.par_chunks_mut(h * rows))
        .enumerate()
        .for_each(|(task, ((out, qkv), rstd))| {
            let rows = out.chunks_exact_mut(w).zip(qkv.chunks_exact(w));
            for (i, ((o, x), r)) in rows.zip(rstd.chunks_exact_mut(h)).enumerate() {
                let t = s.table_row(task * rows_per(w) + i);
                o.copy_from_slice(x);
                for (head, r) in r.iter_mut().enumerate() {
                    let at = head * hs..(head + 1) * hs; // queries' heads, then keys'
                    *r = match s.norm_eps {
                        Some(eps) => rmsnorm::norm_row(&x[at.clone()], eps, &mut o[at.clone()]),
                        None => 1.0,
                    };
                    if s.rope {
                        let angles = t * (hs / 2)..(t + 1) * (hs / 2);
                        rotate(&mut o[at], &cos[angles.clone()], &sin[angles], false);
                    }
                }
            }
        });
}

/// Backward of [`forward`]: writes `∂loss/∂qkv` to `dqkv`, from the forward's output `out`
/// and `rstd`.
///
/// # Shapes
/// - dout, out, dqkv: `[N, W]`; rstd: `[N, H + KV]`
pub fn backward(dout: &[f32], out: &[f32], rstd: &[f32], s: &Qk, dqkv: &mut [f32]) {
    let (w, h, hs) = (s.layout.width(), s.heads(), s.layout.head_size);
    let (cos, sin) = tables(s);
    let rows = rows_per(w);
    dqkv.par_chunks_mut(w * rows)
        .zip(dout.par_chunks(w * rows).zip(out.par_chunks(w * rows)))
        .zip(rstd.par_chunks(h * rows))
        .enumerate()
        .for_each_init(
            || (vec![0.0; hs], vec![0.0; hs]),
            |(dy, y), (task, ((dx, (dout, out)), rstd))| {
                let rows = dx.chunks_exact_mut(w).zip(dout.chunks_exact(w));
                let rows = rows.zip(out.chunks_exact(w).zip(rstd.chunks_exact(h)));
                for (i, ((dx, dout), (out, rstd))) in rows.enumerate() {
                    let t = s.table_row(task * rows_per(w) + i);
                    dx.copy_from_slice(dout);
                    for (head, &r) in rstd.iter().enumerate() {
                        let at = head * hs..(head + 1) * hs;
                        let angles = t * (hs / 2)..(t + 1) * (hs / 2);
                        let (cos, sin) = if s.rope {
                            (&cos[angles.clone()], &sin[angles])
                        } else {
                            (&cos[..0], &sin[..0])
                        };
                        // The rotation's gradient is the gradient turned back.
                        rotate(&mut dx[at.clone()], cos, sin, true);
                        if s.norm_eps.is_some() {
                            // The normalised head before its rotation: the output turned back.
                            y.copy_from_slice(&out[at.clone()]);
                            rotate(y, cos, sin, true);
                            dy.copy_from_slice(&dx[at.clone()]);
                            rmsnorm::backward_row(dy, y, r, &mut dx[at]);
                        }
                    }
                }
            },
        );
}

/// Rows per rayon task for a projection `width` wide.
fn rows_per(width: usize) -> usize {
    rows::per_task(width)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kept angles are the ones computed for the pass: asked for in any order, across the
    /// kept positions' end, on threads of their own.
    #[test]
    fn kept_angles_are_the_computed_ones() {
        let hs = 16;
        let asks = [
            (3, 5),
            (0, 1),
            (KEPT_POSITIONS - 2, 4),
            (100, 900),
            (KEPT_POSITIONS + 7, 3),
            (0, 64),
        ];
        for (start, seq) in asks {
            let kept = rope_table(start, seq, hs);
            assert_eq!(kept, angles(start, start + seq, hs), "{start}+{seq}");
            assert_eq!(kept.0.len(), seq * hs / 2);
        }
        let other = std::thread::spawn(move || rope_table(40, 30, hs))
            .join()
            .unwrap();
        assert_eq!(other, angles(40, 70, hs));
    }
}
