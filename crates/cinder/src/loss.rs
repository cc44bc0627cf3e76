//! The training objective: mean cross-entropy of the next character.

use burn::prelude::*;
use burn::tensor::activation::log_softmax;

/// Mean negative log-likelihood of `targets` under `logits`.
///
/// # Shapes
/// - logits: `[B, T, V]`, targets: `[B, T]` -> `[1]`
pub fn cross_entropy(logits: Tensor<3>, targets: Tensor<2, Int>) -> Tensor<1> {
    let [b, t, v] = logits.dims();
    let logp = log_softmax(logits.reshape([b * t, v]), 1); // (B*T, V)
    let picked = logp.gather(1, targets.reshape([b * t, 1])); // (B*T, 1)
    picked.mean().neg()
}
