//! cinder: train a character-level GPT on a text file, sample from it, resume exactly.
//!
//! The model lives in `cinder-model`, the data pipeline in `cinder-data`; this crate holds the
//! program: configuration, backend choice, the training loop, checkpoints and sampling. The
//! binaries (`train`, `generate`) only parse arguments and report.

pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod data;
pub mod device;
pub mod eval;
pub mod faults;
pub mod generate;
pub mod gpt2;
pub mod inspect;
pub mod metrics;
pub mod optim;
pub mod plot;
pub mod progress;
pub mod run_folder;
pub mod sampling;
pub mod schedule;
pub mod train;

/// Burn allocates and frees a buffer for every tensor operation. glibc's allocator hands large
/// freed buffers back to the kernel and takes page faults to get them again; mimalloc keeps them
/// for reuse. Measured in BENCHMARKS.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Tells the allocator to keep freed memory instead of handing it back to the kernel after
/// 10 ms. A training step frees and reallocates the same large buffers (Burn's optimizer makes
/// new parameter and moment tensors every step); handing them back made the kernel zero fresh
/// pages on every step, 12% of the 6-layer step's time (BENCHMARKS.md). Peak memory is the
/// same order: the buffers are reused, not accumulated.
pub fn keep_freed_memory() {
    // mimalloc v3's `mi_option_purge_delay` (mimalloc.h); -1: never purge.
    const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    // SAFETY: setting an option is allowed at any time; it only changes when memory is purged.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
}
