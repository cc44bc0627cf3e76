//! The cinder GPT: a decoder-only transformer in the shape of nanoGPT's `model.py`.
//!
//! - [`GptConfig`]: the architecture, validated before anything is built.
//! - [`CausalSelfAttention`]: masked multi-head self-attention (one fused q/k/v projection).
//! - [`Mlp`]: the 4x GELU feed-forward network.
//! - [`Block`]: a pre-LayerNorm residual block of the two.
//! - [`Gpt`]: embeddings, blocks, final LayerNorm and the head tied to the token embedding.
//! - [`KvCache`]: keys and values of tokens already seen, for fast sampling.
//! - [`ops`]: the layers as operations: composite Burn versions, and fused kernels on Flex.

mod attention;
mod block;
mod cache;
mod config;
mod gpt;
mod init;
mod mlp;
pub mod ops;

pub use attention::CausalSelfAttention;
pub use block::Block;
pub use cache::KvCache;
pub use cinder_kernels::QkvLayout;
pub use cinder_kernels::rotary::ROPE_BASE;
pub use config::{Activation, ConfigError, GptConfig, LAYER_NORM_EPSILON, Norm, Position};
pub use gpt::{Gpt, sampling};
pub use mlp::Mlp;
pub use ops::{DropoutKey, Ops, cross_entropy};
