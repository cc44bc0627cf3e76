//! Passes over the rows of a row-major matrix, in blocks of rows fixed by the shape alone: each
//! block is one rayon task, and sums over rows are taken block by block in order, so results
//! do not depend on the number of threads.

use rayon::prelude::*;

use crate::simd::add_assign;

/// Rows per block of a sum over rows.
const SUM_ROWS: usize = 256;

/// Rows handed to one rayon task by an element-wise pass: enough work to outweigh the hand-off.
pub fn per_task(width: usize) -> usize {
    (16 * 1024 / width.max(1)).max(1)
}

/// `f(rows of out, the same rows of x)` for blocks of rows, in parallel.
pub fn zip_mut(
    out: &mut [f32],
    x: &[f32],
    width: usize,
    f: impl Fn(&mut [f32], &[f32]) + Sync + Send,
) {
    let n = per_task(width) * width;
    out.par_chunks_mut(n)
        .zip(x.par_chunks(n))
        .for_each(|(o, x)| f(o, x));
}

/// `f(rows of out)` for blocks of rows, in parallel.
pub fn each_mut(out: &mut [f32], width: usize, f: impl Fn(&mut [f32]) + Sync + Send) {
    out.par_chunks_mut(per_task(width) * width).for_each(f);
}

/// `out = Σ_blocks f(block)`: `f` adds its block of rows (of `width`-wide `m`) into a zeroed
/// accumulator of `out.len()`; the blocks' accumulators are added in order.
pub fn sum<T: Sync>(
    m: &[T],
    width: usize,
    out: &mut [f32],
    f: impl Fn(usize, &[T], &mut [f32]) + Sync + Send,
) {
    let partials: Vec<Vec<f32>> = m
        .par_chunks(SUM_ROWS * width)
        .enumerate()
        .map(|(i, block)| {
            let mut acc = vec![0.0f32; out.len()];
            f(i * SUM_ROWS, block, &mut acc);
            acc
        })
        .collect();
    out.fill(0.0);
    for p in &partials {
        add_assign(out, p);
    }
}
