//! Random training windows, reproducible from a seed.
//!
//! Every batch is a pure function of (seed, stream, index): the trainer asks for the batch of
//! iteration `i` and gets the same windows whether the run went straight through or was resumed
//! from a checkpoint; nothing about the random stream needs saving.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::split::{Ids, Split};

/// `batch_size` windows of `block_size` inputs, each with its targets: the next token at every
/// position. Stored row-major, `[batch_size, block_size]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub inputs: Vec<u32>,
    pub targets: Vec<u32>,
    pub batch_size: usize,
    pub block_size: usize,
}

/// Draws batches of random windows.
#[derive(Debug, Clone, Copy)]
pub struct Batcher {
    pub seed: u64,
    pub batch_size: usize,
    pub block_size: usize,
}

impl Batcher {
    pub fn new(seed: u64, batch_size: usize, block_size: usize) -> Self {
        Self {
            seed,
            batch_size,
            block_size,
        }
    }

    /// Batch number `index` of the random stream `stream` over `tokens` (one split).
    /// Different `(split, stream, index)` give independent batches.
    ///
    /// `tokens` must hold at least `block_size + 1` ids (see [`crate::Splits::new`]).
    pub fn batch<'a>(
        &self,
        tokens: impl Into<Ids<'a>>,
        split: Split,
        stream: u64,
        index: u64,
    ) -> Batch {
        let tokens = tokens.into();
        let window = self.block_size + 1;
        assert!(tokens.len() >= window, "split shorter than one window");
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        // One ChaCha stream per (split, stream), positioned at this batch's words.
        rng.set_stream(mix(split as u64, stream));
        rng.set_word_pos(u128::from(index) * 64 * self.batch_size as u128);
        let mut inputs = Vec::with_capacity(self.batch_size * self.block_size);
        let mut targets = Vec::with_capacity(self.batch_size * self.block_size);
        for _ in 0..self.batch_size {
            let start = rng.random_range(0..=tokens.len() - window);
            tokens.extend_into(start..start + self.block_size, &mut inputs);
            tokens.extend_into(start + 1..start + window, &mut targets);
        }
        Batch {
            inputs,
            targets,
            batch_size: self.batch_size,
            block_size: self.block_size,
        }
    }
}

/// Combines two numbers into one well-spread 64-bit value (SplitMix64 finaliser).
fn mix(a: u64, b: u64) -> u64 {
    let mut z = a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> Vec<u32> {
        (0..1000).collect()
    }

    #[test]
    fn targets_are_inputs_shifted_by_one() {
        let b = Batcher::new(1, 8, 16).batch(&tokens(), Split::Train, 0, 3);
        assert_eq!(b.inputs.len(), 8 * 16);
        for row in 0..8 {
            let x = &b.inputs[row * 16..(row + 1) * 16];
            let y = &b.targets[row * 16..(row + 1) * 16];
            // The ids are positions in the text, so each target is the next position.
            assert!(x.iter().zip(y).all(|(a, b)| a + 1 == *b));
            assert!(x.windows(2).all(|w| w[0] + 1 == w[1]));
        }
    }

    #[test]
    fn same_seed_same_batches_other_seed_others() {
        let t = tokens();
        let a = Batcher::new(7, 4, 8);
        assert_eq!(
            a.batch(&t, Split::Train, 0, 5),
            a.batch(&t, Split::Train, 0, 5)
        );
        assert_ne!(
            a.batch(&t, Split::Train, 0, 5),
            a.batch(&t, Split::Train, 0, 6)
        );
        assert_ne!(
            a.batch(&t, Split::Train, 0, 5),
            a.batch(&t, Split::Train, 1, 5)
        );
        assert_ne!(
            a.batch(&t, Split::Train, 0, 5),
            a.batch(&t, Split::Val, 0, 5)
        );
        let b = Batcher::new(8, 4, 8);
        assert_ne!(
            a.batch(&t, Split::Train, 0, 5),
            b.batch(&t, Split::Train, 0, 5)
        );
    }

    #[test]
    fn windows_reach_both_ends_and_stay_inside() {
        let t: Vec<u32> = (0..20).collect();
        let b = Batcher::new(3, 1, 4);
        let starts: std::collections::BTreeSet<u32> = (0..2000)
            .map(|i| b.batch(&t, Split::Train, 0, i).inputs[0])
            .collect();
        assert_eq!(starts, (0..=15).collect());
    }
}
