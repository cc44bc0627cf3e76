//! Token plus (learned) position embeddings, and their backward pass. Without learned positions
//! (`wpe` empty: rotary embeddings turn queries and keys instead) the token embedding alone.

use crate::simd::add_assign;

/// `out[b, t] = wte[ids[b, t]] + wpe[starts[b] + t]` (see [`crate::start_of`]).
///
/// # Shapes
/// - ids: `[B, T]`; starts: `[B]` or `[0]`; wte: `[V, C]`; wpe: `[block_size, C]` or `[0]` ->
///   out: `[B, T, C]`
pub fn forward(
    ids: &[u32],
    seq: usize,
    starts: &[usize],
    wte: &[f32],
    wpe: &[f32],
    out: &mut [f32],
) {
    let c = out.len() / ids.len().max(1);
    for (i, (row, &tok)) in out.chunks_exact_mut(c).zip(ids).enumerate() {
        let (tok, pos) = (tok as usize, crate::start_of(starts, i / seq) + i % seq);
        row.copy_from_slice(&wte[tok * c..(tok + 1) * c]);
        if !wpe.is_empty() {
            add_assign(row, &wpe[pos * c..(pos + 1) * c]);
        }
    }
}

/// Backward of [`forward`] (every sequence from position 0): each row's gradient is added to its token's and
/// its position's rows of `dwte` and `dwpe`, in row order (the same sums on any thread count).
///
/// # Shapes
/// - dout: `[B, T, C]`; dwte: `[V, C]`, dwpe: `[block_size, C]` or `[0]`, both added to
pub fn backward(dout: &[f32], ids: &[u32], seq: usize, dwte: &mut [f32], dwpe: &mut [f32]) {
    let c = dout.len() / ids.len().max(1);
    for (i, (row, &tok)) in dout.chunks_exact(c).zip(ids).enumerate() {
        let (tok, pos) = (tok as usize, i % seq);
        add_assign(&mut dwte[tok * c..(tok + 1) * c], row);
        if !dwpe.is_empty() {
            add_assign(&mut dwpe[pos * c..(pos + 1) * c], row);
        }
    }
}
