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

impl Mask {
    /// The factor element `i` is multiplied by: 0 if dropped, `1 / (1 - p)` if kept.
    #[inline(always)]
    pub fn factor(&self, i: u64) -> f32 {
        // 24 random bits against the threshold: a uniform draw in [0, 1) with f32's precision.
        let u = (mix(self.seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15)) >> 40) as f32
            * (1.0 / (1u64 << 24) as f32);
        if u < self.p {
            0.0
        } else {
            1.0 / (1.0 - self.p)
        }
    }
}

multiversion! {
    /// `out[k] = x[k] * factor(first + k)` for one chunk.
    fn apply_chunk(x: &[f32], out: &mut [f32], mask: Mask, first: u64) {
        for (k, (o, v)) in out.iter_mut().zip(x).enumerate() {
            *o = v * mask.factor(first + k as u64);
        }
    }
}

/// `out = x ⊙ mask`; also the backward pass (`dx = dy ⊙ mask`), since the mask is linear.
///
/// # Shapes
/// - x, out: any, the same length
pub fn apply(x: &[f32], mask: Mask, out: &mut [f32]) {
    assert_eq!(x.len(), out.len());
    out.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .enumerate()
        .for_each(|(i, (o, x))| apply_chunk(x, o, mask, (i * CHUNK) as u64));
}
