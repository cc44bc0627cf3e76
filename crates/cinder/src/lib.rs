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
pub mod generate;
pub mod inspect;
pub mod kernels;
pub mod loss;
pub mod metrics;
pub mod optim;
pub mod plot;
pub mod progress;
pub mod sampling;
pub mod schedule;
pub mod train;

/// Burn allocates and frees a buffer for every tensor operation. glibc's allocator hands large
/// freed buffers back to the kernel and takes page faults to get them again; mimalloc keeps them
/// for reuse. Measured in BENCHMARKS.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
