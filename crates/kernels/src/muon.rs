//! Muon's orthogonalisation of an update (Keller Jordan's Muon): each matrix replaced by the
//! quintic Newton-Schulz iteration's approximation of `UVᵀ` (for `USVᵀ` its SVD), scaled by its
//! shape; and NorMuon's normalisation of that update, neuron by neuron ([`normalise`]). The
//! optimizer's momentum and the update around them are the model crate's.

use rayon::prelude::*;

use crate::matmul::{Mat, matmul};

/// The iteration's coefficients `(a, b, c)`: `X ← aX + (bA + cA²)X`, `A = XXᵀ`.
pub const COEFFICIENTS: (f32, f32, f32) = (3.4445, -4.7750, 2.0315);
/// Iterations per orthogonalisation.
pub const STEPS: usize = 5;
/// Added to the Frobenius norm before a matrix is normalised.
pub const EPSILON: f32 = 1e-7;

/// Output rows per share of one of the iteration's products: a 128-row matrix keeps two
/// threads busy. A share count set by the shape alone keeps results thread-independent.
const ROWS_PER_SHARE: usize = 64;

/// `u` (`[rows, cols]`, row-major) read as matrices of `widths` columns side by side (attention's
/// queries, keys and values: [`crate::QkvLayout::widths`]; else one), each orthogonalised and
/// multiplied by `sqrt(max(1, width / rows))` (Burn's `[in, out]` layout, so the factor is
/// `fan_out / fan_in`).
///
/// # Shapes
/// - u: `[rows, cols]`, `cols` the sum of `widths`; output: the same
pub fn orthogonalise(u: &[f32], rows: usize, widths: &[usize]) -> Vec<f32> {
    let cols: usize = widths.iter().sum();
    assert_eq!(u.len(), rows * cols, "update does not match its shape");
    assert!(
        widths.iter().all(|&w| w > 0),
        "an empty matrix in {widths:?}"
    );
    let firsts: Vec<usize> = widths
        .iter()
        .scan(0, |at, &w| {
            *at += w;
            Some(*at - w)
        })
        .collect();
    // Each matrix in the orientation with no more rows than columns, contiguous: [m, n].
    let oriented = |width: usize| {
        let tall = rows > width;
        let (m, n) = if tall { (width, rows) } else { (rows, width) };
        let at = move |i: usize, j: usize| if tall { j * n + i } else { i * n + j };
        (m, n, at)
    };
    let parts: Vec<Vec<f32>> = widths
        .par_iter()
        .zip(&firsts)
        .map(|(&width, &first)| {
            let (m, n, at) = oriented(width);
            let mut x = vec![0.0f32; m * n];
            for i in 0..rows {
                for j in 0..width {
                    x[at(i, j)] = u[i * cols + first + j];
                }
            }
            newton_schulz(&mut x, m, n);
            x
        })
        .collect();
    let mut out = vec![0.0f32; rows * cols];
    for ((x, &width), &first) in parts.iter().zip(widths).zip(&firsts) {
        let (_, _, at) = oriented(width);
        let scale = (width as f32 / rows as f32).max(1.0).sqrt();
        for i in 0..rows {
            for j in 0..width {
                out[i * cols + first + j] = scale * x[at(i, j)];
            }
        }
    }
    out
}

/// [`orthogonalise`] of several updates laid end to end in `u`, each `[rows, cols]` read as
/// matrices of `widths` columns (none: one), all at once: the updates run in parallel, one to a
/// thread, where one alone splits each of its small products between the threads, which then
/// spend much of their time handing work over (BENCHMARKS.md, section 26). Each is computed as
/// [`orthogonalise`] computes it alone (a product's result never depends on the threads:
/// `matmul`), so the result is the same, bit for bit.
///
/// # Shapes
/// - u: the updates' `rows * cols` values, one after the other; output: the same
pub fn orthogonalise_all(u: &[f32], updates: &[(usize, usize, Vec<usize>)]) -> Vec<f32> {
    let ends: Vec<usize> = updates
        .iter()
        .scan(0, |at, (rows, cols, _)| {
            *at += rows * cols;
            Some(*at)
        })
        .collect();
    assert_eq!(
        ends.last().copied().unwrap_or(0),
        u.len(),
        "updates do not match their shapes"
    );
    let parts: Vec<Vec<f32>> = updates
        .par_iter()
        .zip(&ends)
        .map(|((rows, cols, widths), &end)| {
            orthogonalise(&u[end - rows * cols..end], *rows, &matrices(widths, *cols))
        })
        .collect();
    parts.concat()
}

/// `x` normalised by its Frobenius norm, then [`STEPS`] iterations of
/// `X ← aX + (bA + cA²)X` with `A = XXᵀ`, in place.
///
/// # Shapes
/// - x: `[m, n]`, row-major, `m <= n` (so that `A` is the smaller Gram matrix)
pub fn newton_schulz(x: &mut [f32], m: usize, n: usize) {
    assert_eq!(x.len(), m * n, "matrix does not match its shape");
    let norm = x
        .iter()
        .map(|&v| f64::from(v) * f64::from(v))
        .sum::<f64>()
        .sqrt() as f32;
    let inv = 1.0 / (norm + EPSILON);
    x.iter_mut().for_each(|v| *v *= inv);
    let (a, b, c) = COEFFICIENTS;
    let mut gram = vec![0.0f32; m * m];
    let mut poly = vec![0.0f32; m * m];
    let mut next = vec![0.0f32; m * n];
    for _ in 0..STEPS {
        let xm = Mat::new(x, m, n);
        product(&mut gram, xm, xm.t(), false); // A = X Xᵀ
        let g = Mat::new(&gram, m, m);
        product(&mut poly, g, g, false); // A²
        for (p, &g) in poly.iter_mut().zip(&gram) {
            *p = b * g + c * *p;
        }
        for (y, &v) in next.iter_mut().zip(x.iter()) {
            *y = a * v;
        }
        product(&mut next, Mat::new(&poly, m, m), Mat::new(x, m, n), true);
        x.copy_from_slice(&next);
    }
}

/// The widths of the matrices side by side in an update of `cols` columns: `widths` as given,
/// or, when none are given, one matrix of all the columns.
pub fn matrices(widths: &[usize], cols: usize) -> Vec<usize> {
    if widths.is_empty() {
        vec![cols]
    } else {
        widths.to_vec()
    }
}

/// Below this a neuron's running mean of squares, or a matrix's norm, is not divided by.
pub const NORMUON_FLOOR: f32 = 1e-10;

/// The number of NorMuon's running means for `u` of `rows` rows read as matrices of `widths`
/// columns (see [`normalise`]): a matrix's columns when it has at least as many as rows, else
/// its rows.
pub fn neurons(rows: usize, widths: &[usize]) -> usize {
    widths
        .iter()
        .map(|&w| if w >= rows { w } else { rows })
        .sum()
}

/// NorMuon (arXiv 2510.05491, as the modded-nanogpt speedrun writes it), in place: for each
/// matrix of `u` (`widths` columns side by side), each neuron's mean squared entry is folded into
/// its running mean (`second ← β₂·second + (1-β₂)·mean`), the neuron's entries divided by the
/// root of that mean (at least [`NORMUON_FLOOR`]), and the matrix scaled back to its norm before.
/// A neuron is a column when the matrix has at least as many columns as rows (Burn's `[in, out]`:
/// an output of PyTorch's `[out, in]` with no fewer outputs than inputs), else a row: the mean
/// runs along the shorter side. Sums in f64, in a fixed order: the same on any thread count.
///
/// # Shapes
/// - u: `[rows, cols]`, row-major, `cols` the sum of `widths`
/// - second: `[neurons(rows, widths)]`, the matrices' running means one after another
pub fn normalise(u: &mut [f32], rows: usize, widths: &[usize], second: &mut [f32], beta2: f32) {
    let cols: usize = widths.iter().sum();
    assert_eq!(u.len(), rows * cols, "update does not match its shape");
    assert_eq!(
        second.len(),
        neurons(rows, widths),
        "one running mean per neuron"
    );
    let (mut first, mut at) = (0, 0);
    for &width in widths {
        let by_column = width >= rows;
        let (n, per) = if by_column {
            (width, rows)
        } else {
            (rows, width)
        };
        let neuron = |i: usize, j: usize| if by_column { j } else { i };
        let cells = |i: usize| i * cols + first..i * cols + first + width;
        let mut sums = vec![0.0f64; n];
        let mut before = 0.0f64;
        for i in 0..rows {
            for (j, &v) in u[cells(i)].iter().enumerate() {
                let sq = f64::from(v) * f64::from(v);
                sums[neuron(i, j)] += sq;
                before += sq;
            }
        }
        let means = &mut second[at..at + n];
        for (m, sum) in means.iter_mut().zip(&sums) {
            *m = beta2 * *m + (1.0 - beta2) * (sum / per as f64) as f32;
        }
        let roots: Vec<f32> = means.iter().map(|&m| m.max(NORMUON_FLOOR).sqrt()).collect();
        let mut after = 0.0f64;
        for i in 0..rows {
            for (j, v) in u[cells(i)].iter_mut().enumerate() {
                *v /= roots[neuron(i, j)];
                after += f64::from(*v) * f64::from(*v);
            }
        }
        let scale = (before.sqrt() / after.sqrt().max(f64::from(NORMUON_FLOOR))) as f32;
        for i in 0..rows {
            u[cells(i)].iter_mut().for_each(|v| *v *= scale);
        }
        first += width;
        at += n;
    }
}

/// `out = a · b` (or `+=`), its rows cut into shares of [`ROWS_PER_SHARE`] run in parallel.
fn product(out: &mut [f32], a: Mat, b: Mat, accumulate: bool) {
    let n = b.cols;
    out.par_chunks_mut(ROWS_PER_SHARE * n)
        .enumerate()
        .for_each(|(i, out)| {
            let r = i * ROWS_PER_SHARE..i * ROWS_PER_SHARE + out.len() / n;
            matmul(out, a.rows(r), b, accumulate);
        });
}
