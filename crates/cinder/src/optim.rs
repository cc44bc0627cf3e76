//! AdamW as nanoGPT configures it, and clipping of the global gradient norm.

use burn::module::{ModuleVisitor, Param, ParamGroup, ParamId};
use burn::optim::{AdamWConfig, GradientsParams, ModuleOptimizer};
use burn::prelude::*;

use crate::config::TrainConfig;
use cinder_model::Gpt;

/// AdamW (eps 1e-8) with weight decay on matrices only: embeddings and linear weights decay;
/// biases and LayerNorm parameters (rank < 2) do not.
pub fn adamw(c: &TrainConfig, model: &Gpt) -> ModuleOptimizer {
    let decayed = AdamWConfig::new()
        .with_beta_1(c.beta1 as f32)
        .with_beta_2(c.beta2 as f32)
        .with_epsilon(1e-8)
        .with_weight_decay(c.weight_decay as f32);
    let not_decayed = decayed.clone().with_weight_decay(0.0).build();
    decayed.init().with_group(
        ParamGroup::from_ids(vector_params(model)),
        not_decayed,
        None,
    )
}

/// Ids of the parameters of rank below 2 (biases, LayerNorm gains and shifts).
pub fn vector_params(model: &Gpt) -> Vec<ParamId> {
    struct Vectors(Vec<ParamId>);
    impl ModuleVisitor for Vectors {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            if D < 2 {
                self.0.push(p.id);
            }
        }
    }
    let mut v = Vectors(Vec::new());
    model.visit(&mut v);
    v.0
}

/// Scales all gradients together so that their global L2 norm is at most `max_norm`
/// (PyTorch's `clip_grad_norm_`). Stays on the device: no host round trip.
pub fn clip_global_norm(model: &Gpt, grads: &mut GradientsParams, max_norm: f64) {
    struct SquaredSum<'a> {
        grads: &'a GradientsParams,
        sum: Option<Tensor<1>>,
    }
    impl ModuleVisitor for SquaredSum<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            if let Some(g) = self.grads.get::<D>(p.id) {
                let s = g.square().sum();
                self.sum = Some(match self.sum.take() {
                    Some(acc) => acc + s,
                    None => s,
                });
            }
        }
    }
    struct Scale<'a> {
        grads: &'a mut GradientsParams,
        coef: Tensor<1>,
    }
    impl ModuleVisitor for Scale<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            if let Some(g) = self.grads.remove::<D>(p.id) {
                let coef: Tensor<D> = self.coef.clone().reshape([1; D]);
                self.grads.register::<D>(p.id, g * coef);
            }
        }
    }
    let mut sq = SquaredSum { grads, sum: None };
    model.visit(&mut sq);
    let Some(sum) = sq.sum else { return };
    let coef = sum
        .sqrt()
        .add_scalar(1e-6)
        .recip()
        .mul_scalar(max_norm)
        .clamp_max(1.0);
    model.visit(&mut Scale { grads, coef });
}
