//! Row-major matrix products on gemm's kernels, with transposes expressed as strides (no copies).

use rayon::prelude::*;

use crate::simd::add_assign;

/// A matrix operand: `rows x cols` logically, element (i, j) at `data[i * row_stride + j *
/// col_stride]`. A transpose is the same data with the strides swapped.
#[derive(Clone, Copy)]
pub struct Mat<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
    pub col_stride: usize,
}

impl<'a> Mat<'a> {
    /// `data` as a row-major `rows x cols` matrix.
    pub fn new(data: &'a [f32], rows: usize, cols: usize) -> Self {
        assert_eq!(
            data.len(),
            rows * cols,
            "matrix data does not match its shape"
        );
        Self::strided(data, rows, cols, cols, 1)
    }

    /// A `rows x cols` matrix whose rows are `row_stride` apart in `data` (one head's columns of
    /// a wider matrix, say).
    pub fn strided(
        data: &'a [f32],
        rows: usize,
        cols: usize,
        row_stride: usize,
        col_stride: usize,
    ) -> Self {
        if rows > 0 && cols > 0 {
            let last = (rows - 1) * row_stride + (cols - 1) * col_stride;
            assert!(last < data.len(), "matrix view runs past its data");
        }
        Self {
            data,
            rows,
            cols,
            row_stride,
            col_stride,
        }
    }

    /// Rows `r` of this matrix, as a view.
    pub fn rows(self, r: std::ops::Range<usize>) -> Self {
        assert!(r.start <= r.end && r.end <= self.rows, "rows out of range");
        let data = if r.is_empty() {
            &self.data[..0]
        } else {
            &self.data[r.start * self.row_stride..]
        };
        Self {
            data,
            rows: r.len(),
            ..self
        }
    }

    /// Columns `r` of this matrix, as a view.
    pub fn cols(self, r: std::ops::Range<usize>) -> Self {
        self.t().rows(r).t()
    }

    /// The transpose, as a view.
    pub fn t(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            data: self.data,
        }
    }

    fn strides(&self) -> (isize, isize) {
        (self.row_stride as isize, self.col_stride as isize)
    }
}

/// Below this many multiply-adds a product runs on the calling thread: splitting it costs more
/// than it saves (gemm's own threshold in Burn's flex backend is the same order).
const PARALLEL_WORK: usize = 96 * 96 * 96;

/// Rows (of the output, or of the inner dimension) per share of a large product, about: big
/// enough for gemm's single-threaded kernels to run near their peak, and for each share's
/// packing of the other operand to be paid over many rows.
const SHARE: usize = 512;

/// Rows up to which a product sums each row as that row alone is summed, for a second operand
/// laid out by rows (a layer's weight) and an inner dimension of up to `MOST_SHARES * ONE_PASS`
/// (tested to 3,072). A product of more rows is cut into blocks of rows, each summed over the
/// whole inner dimension by gemm, where fewer rows are summed in blocks of it
/// ([`inner_blocks`]): a pass that must give each text the bits it gets alone runs at most this
/// many rows at once (`cinder_model::Gpt`).
pub const ROWS_ALIKE: usize = SHARE;

/// Rows from which a product that no dimension cuts into shares is cut into two halves of rows
/// when it runs in a pool of several threads (a batched decoding step: 32 texts by the model's
/// width), so that it runs on two of them. Each row's values are computed as in the whole
/// product (the same bits, tested), so the result still does not depend on the threads
/// (BENCHMARKS.md, section 33).
const HALVED_ROWS: usize = 16;

/// The most shares a dimension is cut into.
const MOST_SHARES: usize = 16;

/// The longest inner dimension gemm (gemm-common 0.19) sums in one pass whatever the rows: its
/// block of the inner dimension (`kc`) is `k.min(512)` for small products and at least 512
/// otherwise (more on some caches). Its vector path for one row sums in the same order as such a
/// pass, so up to this length a row gets the same bits alone as among others (tested).
const ONE_PASS: usize = 512;

/// Shares of a dimension of `len`: a power of two (so that they spread evenly over 2, 4, 8...
/// threads), about `len / SHARE`, and at most [`MOST_SHARES`].
fn shares(len: usize) -> usize {
    let ideal = len.div_ceil(SHARE);
    if ideal < 2 {
        1
    } else {
        (1usize << ideal.ilog2()).clamp(2, MOST_SHARES)
    }
}

/// Blocks of the inner dimension that a product of at most [`ROWS_ALIKE`] rows sums apart
/// ([`matmul`]): for an `a` laid out by rows (activations, as in every decoding pass), a power of
/// two of blocks of at most [`ONE_PASS`], so that a row's sum does not depend on how many rows
/// there are (where the second operand is laid out by rows; BENCHMARKS.md section 41); for a
/// transposed `a` (a weight's gradient, `xᵀ dy`, summed over the batch), [`shares`].
fn inner_blocks(a: Mat) -> usize {
    let k = a.cols;
    if a.col_stride == 1 && k > ONE_PASS && k <= MOST_SHARES * ONE_PASS {
        k.div_ceil(ONE_PASS).next_power_of_two() // spread evenly over 2, 4, 8... threads
    } else {
        shares(k)
    }
}

/// `out = a · b`, or `out += a · b` when `accumulate`; `out` is `a.rows x b.cols`, row-major.
///
/// A large product is cut into shares, each computed on one thread by gemm: blocks of rows of
/// `out` when it has many rows; otherwise, when the inner dimension is long, partial products
/// over blocks of it ([`inner_blocks`]), added in order, however small the product; otherwise
/// blocks of columns of `out`; otherwise, with at least [`HALVED_ROWS`] rows and several
/// threads, two blocks of rows, which give the same bits as one. The other shares depend only on
/// the shapes, so the result does not depend on the number of threads.
/// (gemm's own threading was measured slower on the model's products, which are small for it.)
pub fn matmul(out: &mut [f32], a: Mat, b: Mat, accumulate: bool) {
    assert_eq!(
        out.len(),
        a.rows * b.cols,
        "output does not match the product's shape"
    );
    // SAFETY: `out` holds the product's m x n values, initialised, and is borrowed mutably.
    unsafe { matmul_raw(out.as_mut_ptr(), a, b, accumulate) }
}

/// `a · b` in a new buffer that nothing zeroes first: each value is written once, by the
/// product. (Zeroing every output before a kernel wrote it was 8% of the default run's time:
/// BENCHMARKS.md, section 29.)
pub fn product(a: Mat, b: Mat) -> Vec<f32> {
    let len = a.rows * b.cols;
    let mut out = Vec::with_capacity(len);
    // SAFETY: `out` has room for the m x n values, and no other reference to it exists. With
    // `accumulate` false, matmul_raw writes every value before anything reads it: gemm with
    // `read_dst` false stores its first pass over the inner dimension and adds later passes to
    // what it stored, and partial products are summed into values first set to zero. So all
    // `len` values are initialised when the length is set. (For a one-row product gemm's
    // matrix-vector path makes a `&mut [f32]` of the output before writing it, which Rust has
    // not yet said is allowed for memory not yet written; it only writes through it.)
    unsafe {
        matmul_raw(out.as_mut_ptr(), a, b, false);
        out.set_len(len);
    }
    out
}

/// [`matmul`] into `out` given as a pointer.
///
/// # Safety
/// `out` must be valid for writes of `a.rows * b.cols` values, initialised when `accumulate`,
/// and no other thread may touch them during the call.
unsafe fn matmul_raw(out: *mut f32, a: Mat, b: Mat, accumulate: bool) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(b.rows, k, "inner dimensions differ");
    let (row_shares, inner_shares, col_shares) = (shares(m), inner_blocks(a), shares(n));
    let uncut = row_shares < 2 && inner_shares < 2 && col_shares < 2;
    let row_shares = if uncut && m >= HALVED_ROWS && rayon::current_num_threads() > 1 {
        2
    } else {
        row_shares
    };
    // A long inner dimension is summed in partial products however small the product, so that
    // a row's sum does not depend on how many rows share it (one text decoded alone or beside
    // others: the test below).
    let by_inner = row_shares < 2 && inner_shares >= 2;
    if (m * n * k < PARALLEL_WORK && !by_inner) || (uncut && row_shares < 2) {
        // SAFETY: the whole output, as this function's caller promises.
        unsafe { strided_matmul(out, (n as isize, 1), a, b, accumulate) };
    } else if row_shares >= 2 {
        let rows = m.div_ceil(row_shares);
        let ptr = SharedMut(out);
        (0..row_shares).into_par_iter().for_each(|i| {
            let r = i * rows..((i + 1) * rows).min(m);
            // SAFETY: rows r of `out` belong to this share alone.
            unsafe {
                strided_matmul(
                    ptr.at(r.start * n),
                    (n as isize, 1),
                    a.rows(r),
                    b,
                    accumulate,
                )
            };
        });
    } else if inner_shares < 2 {
        let cols = n.div_ceil(col_shares);
        let ptr = SharedMut(out);
        (0..col_shares).into_par_iter().for_each(|j| {
            let c = j * cols..((j + 1) * cols).min(n);
            // SAFETY: columns c of `out` belong to this share alone.
            unsafe { strided_matmul(ptr.at(c.start), (n as isize, 1), a, b.cols(c), accumulate) };
        });
    } else {
        let inner = k.div_ceil(inner_shares);
        let partials: Vec<Vec<f32>> = (0..inner_shares)
            .into_par_iter()
            .map(|i| {
                let r = i * inner..((i + 1) * inner).min(k);
                let mut part = vec![0.0f32; m * n];
                let (a, b) = (a.cols(r.clone()), b.rows(r));
                // SAFETY: `part` holds the m x n values, and is this task's own.
                unsafe { strided_matmul(part.as_mut_ptr(), (n as isize, 1), a, b, false) };
                part
            })
            .collect();
        // Added share by share, in order.
        let ptr = SharedMut(out);
        (0..(m * n).div_ceil(SUM_CHUNK))
            .into_par_iter()
            .for_each(|c| {
                let at = c * SUM_CHUNK;
                let len = SUM_CHUNK.min(m * n - at);
                let first = ptr.at(at);
                if !accumulate {
                    // SAFETY: these values belong to this task alone, within the output.
                    (0..len).for_each(|i| unsafe { first.add(i).write(0.0) });
                }
                // SAFETY: the same values, initialised (by the caller, or just above).
                let out = unsafe { std::slice::from_raw_parts_mut(first, len) };
                for p in &partials {
                    add_assign(out, &p[at..at + len]);
                }
            });
    }
}

/// Elements per task when adding partial products.
const SUM_CHUNK: usize = 16 * 1024;

/// An output's pointer that rayon tasks may share, each writing only its own block of elements
/// (see the call sites: [`matmul`]'s shares, attention's heads).
#[derive(Clone, Copy)]
pub(crate) struct SharedMut(pub(crate) *mut f32);
// SAFETY: used only to write disjoint elements from different tasks (see the call sites).
unsafe impl Send for SharedMut {}
unsafe impl Sync for SharedMut {}

impl SharedMut {
    /// The element `offset` places on (a method, so closures capture the wrapper, not the field).
    pub(crate) fn at(&self, offset: usize) -> *mut f32 {
        self.0.wrapping_add(offset)
    }
}

/// `out = a · b` (or `+=`) into a matrix with arbitrary strides (row, column), on one thread:
/// used where `out` is one head's slice of a wider matrix.
///
/// # Safety
/// `out` must be valid for writes at every `i * stride.0 + j * stride.1` for `i < a.rows`,
/// `j < b.cols`, and no other thread may touch those elements during the call.
pub unsafe fn matmul_into_strided(
    out: *mut f32,
    stride: (usize, usize),
    a: Mat,
    b: Mat,
    accumulate: bool,
) {
    assert_eq!(b.rows, a.cols, "inner dimensions differ");
    let stride = (stride.0 as isize, stride.1 as isize);
    // SAFETY: as this function's caller promises.
    unsafe { strided_matmul(out, stride, a, b, accumulate) };
}

/// `out = a · b` (or `+=`) on this thread, by gemm (a one-row `+=` may share its product's
/// blocks among threads). gemm adds a product of one row into `out` term by term (its
/// vector-times-matrix path), and of several rows whole, so one row's product is made first and
/// added whole: the bits of the same row among others, where gemm sums the inner dimension in
/// one pass (up to [`ONE_PASS`]; [`inner_blocks`]; BENCHMARKS.md sections 36 and 41).
///
/// # Safety
/// `out` must be valid for writes at every `i * out_rs + j * out_cs` for `i < a.rows`,
/// `j < b.cols`, those values initialised when `accumulate`, and no other thread may touch
/// them during the call.
unsafe fn strided_matmul(
    out: *mut f32,
    (out_rs, out_cs): (isize, isize),
    a: Mat,
    b: Mat,
    accumulate: bool,
) {
    if accumulate && a.rows == 1 {
        let row = product(a, b); // [1, n]
        for (j, v) in row.into_iter().enumerate() {
            // SAFETY: j < b.cols, within the row the caller promises.
            unsafe { *out.offset(j as isize * out_cs) += v };
        }
        return;
    }
    let (a_rs, a_cs) = a.strides();
    let (b_rs, b_cs) = b.strides();
    // SAFETY: a and b are within their slices (checked by Mat), the output as the caller
    // promises; gemm reads a and b within those bounds and writes out within its m x n block.
    unsafe {
        gemm::gemm(
            a.rows,
            b.cols,
            a.cols,
            out,
            out_cs,
            out_rs,
            accumulate,
            a.data.as_ptr(),
            a_cs,
            a_rs,
            b.data.as_ptr(),
            b_cs,
            b_rs,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: Mat, b: Mat) -> Vec<f32> {
        let at = |i: usize, j: usize| a.data[i * a.row_stride + j * a.col_stride];
        let bt = |i: usize, j: usize| b.data[i * b.row_stride + j * b.col_stride];
        let mut out = vec![0.0; a.rows * b.cols];
        for i in 0..a.rows {
            for j in 0..b.cols {
                out[i * b.cols + j] = (0..a.cols).map(|p| at(i, p) * bt(p, j)).sum();
            }
        }
        out
    }

    #[test]
    fn a_row_of_a_product_does_not_depend_on_the_rows_beside_it() {
        // A linear layer's output starts as its bias and the product is added (`accumulate`):
        // each row alone (gemm's vector path) and among others must give the same bits, on one
        // thread and on two, up to ROWS_ALIKE rows (a batched decoding step; a prompt's pass).
        // An inner dimension over 512 (the MLP's output layer from a width of 160, GPT-2's
        // layers) is summed in blocks, however small the product; 1,024 and 2,048 make blocks
        // of exactly 512. (Where gemm would sum longer blocks in one pass, on some caches, the
        // order the blocks guard against may not arise: BENCHMARKS.md section 41.)
        let two = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let shapes = [
            (128, 384),
            (640, 160),
            (768, 768),
            (1024, 256),
            (1536, 384),
            (2048, 64),
            (3072, 96),
        ];
        for (k, n) in shapes {
            let w: Vec<f32> = (0..k * n)
                .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-4)
                .collect();
            let x: Vec<f32> = (0..ROWS_ALIKE * k)
                .map(|i| (i * 104_729 % 997) as f32 / 997.0 - 0.5)
                .collect();
            let bias: Vec<f32> = (0..n).map(|j| (j as f32 * 0.37).sin()).collect();
            let run = |rows: std::ops::Range<usize>, accumulate: bool| {
                let m = rows.len();
                let mut out = match accumulate {
                    true => bias.repeat(m),
                    false => vec![0.0; m * n],
                };
                let a = Mat::new(&x[rows.start * k..rows.end * k], m, k);
                matmul(&mut out, a, Mat::new(&w, k, n), accumulate);
                out
            };
            for accumulate in [false, true] {
                let alone: Vec<f32> = (0..ROWS_ALIKE)
                    .flat_map(|r| run(r..r + 1, accumulate))
                    .collect();
                for m in [2, 3, 9, 17, 64, 200, ROWS_ALIKE] {
                    for threads in [1, 2] {
                        let many = match threads {
                            1 => run(0..m, accumulate),
                            _ => two.install(|| run(0..m, accumulate)),
                        };
                        assert_eq!(
                            bits(&alone[..m * n]),
                            bits(&many),
                            "{k}x{n}, accumulate {accumulate}, {m} rows, {threads} threads"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn products_cut_into_shares_match_a_naive_product() {
        // Many rows: blocks of rows; few rows and a long inner dimension: partial products;
        // many columns: blocks of columns; a small product: one share.
        for (m, k, n, ta) in [
            (1000, 40, 30, false),
            (30, 1000, 40, true),
            (40, 30, 1100, false),
            (45, 800, 7, false),
            (1, 300, 50, false),
            (6, 0, 9, false),
        ] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 13) as f32 - 6.0).collect();
            let am = if ta {
                Mat::new(&a, k, m).t()
            } else {
                Mat::new(&a, m, k)
            };
            let bm = Mat::new(&b, k, n);
            let want = naive(am, bm);
            assert_eq!(product(am, bm), want, "a new buffer, {m}x{k}x{n}");
            let mut out = vec![1.0; m * n];
            matmul(&mut out, am, bm, false);
            assert_eq!(out, want, "{m}x{k}x{n}");
            matmul(&mut out, am, bm, true);
            let twice: Vec<f32> = want.iter().map(|x| 2.0 * x).collect();
            assert_eq!(out, twice, "accumulate, {m}x{k}x{n}");
        }
    }

    #[test]
    fn a_product_halved_by_rows_gives_the_bits_of_the_whole() {
        // Shapes of a batched decoding step (rows: texts; the default model's widths) and of
        // Muon's shares (64 rows, a transposed operand, added to what is there), where no
        // dimension is long enough for the other cuts; an odd number of rows; floats that round.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (m, k, n, tb, accumulate) in [
            (16, 128, 512, false, false),
            (32, 128, 384, false, false),
            (32, 512, 128, false, false),
            (33, 512, 384, false, false),
            (64, 384, 128, true, true),
        ] {
            let a: Vec<f32> = (0..m * k)
                .map(|i| ((i * 7919) % 1013) as f32 / 977.0 - 0.5)
                .collect();
            let b: Vec<f32> = (0..k * n)
                .map(|i| ((i * 104_729) % 1009) as f32 / 991.0 - 0.5)
                .collect();
            let am = Mat::new(&a, m, k);
            let bm = if tb {
                Mat::new(&b, n, k).t()
            } else {
                Mat::new(&b, k, n)
            };
            let first: Vec<f32> = (0..m * n).map(|i| (i % 7) as f32 / 3.0).collect();
            let mut whole = first.clone();
            // SAFETY: `whole` holds the m x n values, initialised, and is borrowed mutably.
            unsafe { strided_matmul(whole.as_mut_ptr(), (n as isize, 1), am, bm, accumulate) };
            let mut halves = first.clone();
            pool.install(|| matmul(&mut halves, am, bm, accumulate));
            assert_eq!(bits(&halves), bits(&whole), "{m}x{k}x{n}");
            if !accumulate {
                let new = pool.install(|| product(am, bm));
                assert_eq!(bits(&new), bits(&whole), "a new buffer, {m}x{k}x{n}");
            }
        }
    }

    #[test]
    fn every_transpose_combination_matches_a_naive_product() {
        let (m, k, n) = (37, 53, 29);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 13) as f32 - 6.0).collect();
        for ta in [false, true] {
            for tb in [false, true] {
                let am = if ta {
                    Mat::new(&a, k, m).t()
                } else {
                    Mat::new(&a, m, k)
                };
                let bm = if tb {
                    Mat::new(&b, n, k).t()
                } else {
                    Mat::new(&b, k, n)
                };
                let want = naive(am, bm);
                let mut out = vec![1.0; m * n];
                matmul(&mut out, am, bm, false);
                assert_eq!(out, want, "ta={ta} tb={tb}");
                matmul(&mut out, am, bm, true);
                let twice: Vec<f32> = want.iter().map(|x| 2.0 * x).collect();
                assert_eq!(out, twice, "accumulate, ta={ta} tb={tb}");
            }
        }
    }
}
