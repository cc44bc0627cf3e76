//! The layers of cinder's GPT on the CPU, forward beside backward, as pure functions over
//! slices (in the style of Karpathy's llm.c), on gemm's matrix kernels, threaded with rayon.
//!
//! `cinder-model` wraps them as Burn operations with their own backward passes; this crate knows
//! nothing of Burn, training or checkpoints. Every function gives the same result on any number
//! of threads: work is cut at fixed sizes and sums are taken in a fixed order.
//!
//! - one module per layer kind: [`embedding`], [`layernorm`], [`rmsnorm`], [`linear`],
//!   [`rotary`] (QK-norm and RoPE), [`attention`], [`activation`] (GELU and ReLU²), [`dropout`], [`loss`] (the head,
//!   its soft-cap and the cross-entropy)
//! - [`QkvLayout`]: where attention's queries, keys and values sit in its fused projection
//! - [`adamw`]: the optimizer's update of one tensor, and clipping's sums of squares
//! - [`muon`]: Muon's orthogonalisation of an update (Newton-Schulz iterations)
//! - [`matmul`]: row-major products with transposes as strides; [`rows`]: passes over rows in
//!   fixed blocks; [`simd`]: vector dispatch, `exp`

pub mod activation;
pub mod adamw;
pub mod attention;
pub mod dropout;
pub mod embedding;
pub mod layernorm;
mod layout;
pub mod linear;
pub mod loss;
pub mod matmul;
pub mod muon;
pub mod rmsnorm;
pub mod rotary;
pub mod rows;
pub mod simd;

pub use layout::QkvLayout;

/// The first position of sequence `b` of a pass whose sequences start at `starts`: one position
/// per sequence (texts decoded together from a key/value cache, each at its own length), or
/// none when every sequence starts at 0 (training, evaluation, a first window).
pub fn start_of(starts: &[usize], b: usize) -> usize {
    if starts.is_empty() { 0 } else { starts[b] }
}

/// The first positions of the distinct rows of positions a pass over `starts` needs: each
/// sequence's, or one row starting at 0 that serves every sequence when none are given.
pub fn position_rows(starts: &[usize]) -> Vec<usize> {
    if starts.is_empty() {
        vec![0]
    } else {
        starts.to_vec()
    }
}
