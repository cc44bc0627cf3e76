//! AdamW's update of one parameter tensor as a Burn [`Optimizer`]: a single fused pass on the
//! Flex (CPU) backend (`cinder_kernels::adamw`, through [`super::fused`]), Burn's own AdamW
//! arithmetic elsewhere. Its state is Burn's `AdamWState`, so checkpoints written with Burn's
//! AdamW load unchanged. A run's optimizer (parameter groups, clipping) is built from it in the
//! program crate.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

#[cfg(feature = "flex")]
use burn::optim::AdaptiveMomentumState;
use burn::optim::{AdamWConfig, AdamWState, LearningRate, Optimizer};
use burn::prelude::*;
pub use cinder_kernels::adamw::Update;

#[cfg(feature = "flex")]
use super::fused;
use super::{fused_or, has_fused};

/// AdamW's update of one tensor, with the gradients multiplied by a factor shared by all the
/// tensors of a step (global-norm clipping).
#[derive(Clone)]
#[cfg_attr(not(feature = "flex"), allow(dead_code))] // betas, weight_decay: the fused pass's
pub struct TensorAdamW {
    /// beta 1, beta 2, epsilon
    betas: (f32, f32, f32),
    weight_decay: f32,
    composite: burn::optim::AdamW,
    /// This group's learning rate over the one the step is given (the run's base rate).
    lr_scale: f64,
    /// The factor the gradients of the current step are multiplied by, as f32 bits.
    grad_scale: Arc<AtomicU32>,
}

impl TensorAdamW {
    /// AdamW with `(beta1, beta2, epsilon)` and decoupled `weight_decay`, its gradients scaled
    /// by the value in `grad_scale` (f32 bits) at each step.
    pub fn new(
        (beta1, beta2, epsilon): (f32, f32, f32),
        weight_decay: f32,
        grad_scale: Arc<AtomicU32>,
    ) -> Self {
        let composite = AdamWConfig::new()
            .with_beta_1(beta1)
            .with_beta_2(beta2)
            .with_epsilon(epsilon)
            .with_weight_decay(weight_decay)
            .build();
        Self {
            betas: (beta1, beta2, epsilon),
            weight_decay,
            composite,
            lr_scale: 1.0,
            grad_scale,
        }
    }

    /// The same with its learning rate `lr_scale` times the one each step is given (a
    /// parameter group with a peak rate of its own).
    pub fn with_lr_scale(self, lr_scale: f64) -> Self {
        Self { lr_scale, ..self }
    }
}

impl Optimizer for TensorAdamW {
    type State<const D: usize> = AdamWState<D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<D>,
        grad: Tensor<D>,
        state: Option<AdamWState<D>>,
    ) -> (Tensor<D>, Option<AdamWState<D>>) {
        let scale = f32::from_bits(self.grad_scale.load(Ordering::Relaxed));
        let lr = lr * self.lr_scale;
        fused_or!(has_fused(&tensor.device()),
            fused => {
                let (time, m, v) = match state {
                    Some(s) => (s.momentum.time, s.momentum.moment_1, s.momentum.moment_2),
                    None => (0, grad.zeros_like(), grad.zeros_like()),
                };
                let time = time + 1;
                let u = Update::new(self.betas, self.weight_decay, lr, time, scale);
                let (p, m, v) = fused::adamw(tensor, grad, m, v, u);
                let momentum = AdaptiveMomentumState::new(time, m, v);
                (p, Some(AdamWState::new(momentum)))
            },
            composite => {
                let grad = if scale == 1.0 { grad } else { grad * scale };
                self.composite.step(lr, tensor, grad, state)
            },
        )
    }

    fn to_device<const D: usize>(state: AdamWState<D>, device: &Device) -> AdamWState<D> {
        <burn::optim::AdamW as Optimizer>::to_device(state, device)
    }
}

/// `Σ x²` of a tensor (summed in f64 on the fused path, and returned through f32 as before).
pub fn sum_squares<const D: usize>(x: Tensor<D>) -> f64 {
    fused_or!(has_fused(&x.device()),
        fused => fused::sum_squares(x),
        composite => x.square().sum().into_scalar::<f64>(),
    )
}
