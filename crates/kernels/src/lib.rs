//! cinder's GPT on the CPU without a framework: the forward and backward passes written out by
//! hand (as in Karpathy's llm.c), on gemm's matrix kernels, threaded with rayon.
//!
//! Burn's eager CPU backend spends most of a small model's training step on per-operation
//! overhead (allocation, dispatch, copies); this crate runs the same step as a fixed sequence of
//! large kernels over buffers allocated once. `cinder` uses it for training when the model has
//! no dropout and tests it against the Burn model: the same loss and the same gradients.
//!
//! - [`params`]: the parameters (and gradients) as vectors, in Burn's layouts
//! - [`gpt`]: the model's forward and backward passes over a [`gpt::Tape`] of activations
//! - [`step`]: a training step's passes, data-parallel over threads
//! - [`adamw`]: the optimizer and gradient clipping
//! - [`infer`]: inference with a key/value cache, for sampling
//! - one module per layer kind: [`layernorm`], [`linear`], [`attention`], [`gelu`], [`loss`]
//! - [`matmul`]: row-major products with transposes as strides; [`simd`]: vector dispatch, `exp`

pub mod adamw;
pub mod attention;
pub mod gelu;
pub mod gpt;
pub mod infer;
pub mod layernorm;
pub mod linear;
pub mod loss;
pub mod matmul;
pub mod params;
pub mod simd;
pub mod step;

pub use adamw::{AdamState, AdamW, clip_global_norm};
pub use gpt::{Tape, backward, forward};
pub use params::{BlockParams, Dims, Linear, Norm, Params};
pub use step::Step;
