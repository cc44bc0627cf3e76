//! Dropout masks from a counter-based hash: whether element `i` of a site is kept depends only
//! on the site's seed and `i`, never on the order or the thread that asks. A run's masks are
//! therefore a function of (seed, iteration, layer, site), which keeps resume exact and results
//! the same on any number of threads; the backward pass recomputes the mask instead of storing it.

use rayon::prelude::*;

use crate::simd::multiversion;

/// Elements per rayon task.
const CHUNK: usize = 32 * 1024;

/// SplitMix64's finaliser: a bijection of u64 that mixes every input bit into every output bit.
#[inline(always)]
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The seed of one site from a base seed and the site's coordinates (iteration, layer, ...).
pub fn site_seed(base: u64, coordinates: &[u64]) -> u64 {
    coordinates.iter().fold(mix(base), |h, &c| {
        mix(h ^ c.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    })
}

/// A dropout site: drop probability `p` and the seed of its masks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mask {
    pub p: f32,
    pub seed: u64,
}

/// MurmurHash3's 32-bit finaliser: a bijection of u32 that mixes every bit into every bit, in
/// operations that vectorise (32-bit multiplies).
#[inline(always)]
fn fmix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85EB_CA6B);
    h ^= h >> 13;
    h = h.wrapping_mul(0xC2B2_AE35);
    h ^ (h >> 16)
}

impl Mask {
    /// The factor element `i` is multiplied by: 0 if dropped, `1 / (1 - p)` if kept. Elements
    /// are numbered within a site (at most 2^32 of them).
    #[inline(always)]
    pub fn factor(&self, i: u64) -> f32 {
        let h = fmix32(fmix32(i as u32 ^ self.seed as u32).wrapping_add((self.seed >> 32) as u32));
        // A uniform draw in [0, 2^32) against p * 2^32.
        if h < self.threshold() {
            0.0
        } else {
            1.0 / (1.0 - self.p)
        }
    }

    #[inline(always)]
    fn threshold(&self) -> u32 {
        (f64::from(self.p) * 4_294_967_296.0).min(u32::MAX as f64) as u32
    }
}

multiversion! {
    /// `out[k] = x[k] * factor(first + k)` for one chunk, plus `residual[k]` if given.
    fn apply_chunk(x: &[f32], residual: Option<&[f32]>, out: &mut [f32], mask: Mask, first: u64) {
        match residual {
            Some(r) => {
                for (k, ((o, v), r)) in out.iter_mut().zip(x).zip(r).enumerate() {
                    *o = r + v * mask.factor(first + k as u64);
                }
            }
            None => {
                for (k, (o, v)) in out.iter_mut().zip(x).enumerate() {
                    *o = v * mask.factor(first + k as u64);
                }
            }
        }
    }
}

/// `out = residual + x ⊙ mask` (no residual: `x ⊙ mask`). Without a residual it is also the
/// backward pass, `dx = dy ⊙ mask`, since the mask is linear.
///
/// # Shapes
/// - x, residual, out: any, the same length
pub fn apply(x: &[f32], residual: Option<&[f32]>, mask: Mask, out: &mut [f32]) {
    assert_eq!(x.len(), out.len());
    if let Some(r) = residual {
        assert_eq!(r.len(), out.len());
    }
    out.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .enumerate()
        .for_each(|(i, (o, x))| {
            let r = residual.map(|r| &r[i * CHUNK..i * CHUNK + o.len()]);
            apply_chunk(x, r, o, mask, (i * CHUNK) as u64)
        });
}
