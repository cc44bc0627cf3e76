//! A run's optimizer, as one Burn optimizer over the model, with clipping of the global
//! gradient norm folded into its updates:
//! - `adamw`: AdamW as nanoGPT configures it, weight decay on matrices only;
//! - `muon`: Muon on the matrices inside the blocks (attention's q/k/v weight as three), AdamW
//!   with betas (0.8, 0.95) and no weight decay on the rest at their own peak rates (the
//!   embeddings at `embedding_lr`, an untied head at `head_lr`, gains and biases at
//!   `learning_rate`).
//!
//! Each parameter tensor is updated by the model's [`TensorAdamW`] (a single fused pass on the
//! Flex backend, Burn's AdamW elsewhere) or [`TensorMuon`]. Muon's matrices pass twice, so that
//! their updates are orthogonalised together ([`MuonBatch`]: the same bits, in less time:
//! BENCHMARKS.md, section 28).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use burn::module::{ModuleVisitor, Param, ParamGroup, ParamId};
use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::prelude::*;
use cinder_model::Gpt;
use cinder_model::ops::adamw::{TensorAdamW, sum_squares};
use cinder_model::ops::muon::{MuonBatch, TensorMuon};

use crate::config::{OptimizerKind, TrainConfig};

/// Burn's epsilon for AdamW is 1e-5; nanoGPT (PyTorch) uses 1e-8.
const EPSILON: f32 = 1e-8;

/// AdamW's settings beside Muon (torch_recipe.py's, after the nanoGPT speedrun): betas,
/// epsilon; no weight decay.
const MUON_ADAMW: (f32, f32, f32) = (0.8, 0.95, 1e-10);

/// A run's optimizer ([`OptimizerKind`]), with global-norm clipping folded into its update.
#[derive(Clone)]
pub struct Optim {
    /// Burn's per-parameter optimizer, holding the state that checkpoints save.
    pub module: ModuleOptimizer,
    /// The factor the gradients of the current step are multiplied by (clipping), shared with
    /// the per-tensor updates. f32 bits.
    grad_scale: Arc<AtomicU32>,
    /// With `muon`: its matrices, and the batch in which their updates are orthogonalised
    /// together ([`MuonBatch`]).
    muon: Option<(Vec<ParamId>, Arc<Mutex<MuonBatch>>)>,
}

impl Optim {
    /// The optimizer of a run with the settings of `c`, for `model`'s parameters.
    pub fn new(c: &TrainConfig, model: &Gpt) -> Self {
        let grad_scale = Arc::new(AtomicU32::new(1.0f32.to_bits()));
        let mut muon_batch = None;
        let module = match c.optimizer {
            OptimizerKind::Adamw => {
                let betas = (c.beta1 as f32, c.beta2 as f32, EPSILON);
                let adamw = |decay: f32| TensorAdamW::new(betas, decay, grad_scale.clone());
                ModuleOptimizer::from(adamw(c.weight_decay as f32)).with_group(
                    ParamGroup::from_ids(vector_params(model)),
                    adamw(0.0),
                    None,
                )
            }
            OptimizerKind::Muon => {
                let adamw = |peak: f64| {
                    TensorAdamW::new(MUON_ADAMW, 0.0, grad_scale.clone())
                        .with_lr_scale(peak / c.learning_rate)
                };
                let batch = MuonBatch::shared();
                let muon = |widths: Vec<usize>| TensorMuon {
                    momentum: c.muon_momentum as f32,
                    weight_decay: c.weight_decay as f32,
                    lr_scale: c.muon_lr / c.learning_rate,
                    widths,
                    grad_scale: grad_scale.clone(),
                    beta2: c.muon_beta2 as f32,
                    batch: batch.clone(),
                };
                let (qkv, matrices) = muon_params(model);
                muon_batch = Some(([qkv.as_slice(), &matrices].concat(), batch.clone()));
                // Attention's q/k/v weight is three matrices side by side.
                let qkv_widths = model.config.qkv_layout().widths().to_vec();
                let head = model.lm_head.iter().map(|w| w.id).collect();
                // Gains and biases at learning_rate; later groups take precedence.
                ModuleOptimizer::from(adamw(c.learning_rate))
                    .with_group(
                        ParamGroup::from_ids(embedding_params(model)),
                        adamw(c.embedding_lr),
                        None,
                    )
                    .with_group(ParamGroup::from_ids(head), adamw(c.head_lr), None)
                    .with_group(ParamGroup::from_ids(matrices), muon(Vec::new()), None)
                    .with_group(ParamGroup::from_ids(qkv), muon(qkv_widths), None)
            }
        };
        Self {
            module,
            grad_scale,
            muon: muon_batch,
        }
    }

    /// One step with learning rate `lr` (the run's base rate; groups with peaks of their own
    /// scale it): the gradients are first scaled so that their global L2 norm is at most
    /// `max_norm` (when positive), as PyTorch's `clip_grad_norm_` does.
    pub fn step(&mut self, lr: f64, model: Gpt, grads: GradientsParams, max_norm: f64) -> Gpt {
        let scale = if max_norm > 0.0 {
            let norm = global_norm(&model, &grads);
            (max_norm / (norm + 1e-6)).min(1.0) as f32
        } else {
            1.0
        };
        self.grad_scale.store(scale.to_bits(), Ordering::Relaxed);
        let model = match &self.muon {
            // Muon's matrices first pass with their gradients alone, queueing their updates
            // (the weights left as they are), which are then orthogonalised together.
            Some((ids, batch)) => {
                let mut theirs = GradientsParams::new();
                for &id in ids {
                    if let Some(g) = grads.get::<2>(id) {
                        theirs.register(id, g);
                    }
                }
                let matrices = theirs.len();
                batch
                    .lock()
                    .expect("Muon's batch is not poisoned")
                    .collect();
                let model = self.module.step(lr, model, theirs);
                let queued = batch
                    .lock()
                    .expect("Muon's batch is not poisoned")
                    .orthogonalise();
                // Every matrix queued (none stepped in the first pass by an optimizer outside
                // the batch).
                assert_eq!(queued, matrices, "Muon's matrices were not all queued");
                model
            }
            None => model,
        };
        self.module.step(lr, model, grads)
    }
}

/// The ids of Muon's matrices: attention's q/k/v weights (three matrices each:
/// `cinder_kernels::QkvLayout`), and every other linear weight inside the blocks.
pub fn muon_params(model: &Gpt) -> (Vec<ParamId>, Vec<ParamId>) {
    let (mut qkv, mut matrices) = (Vec::new(), Vec::new());
    for block in &model.blocks {
        qkv.push(block.attn.c_attn.weight.id);
        matrices
            .extend([&block.attn.c_proj, &block.mlp.c_fc, &block.mlp.c_proj].map(|l| l.weight.id));
    }
    (qkv, matrices)
}

/// The ids of the embeddings' weights (token, and learned positions).
fn embedding_params(model: &Gpt) -> Vec<ParamId> {
    let wpe = model.wpe.iter().map(|e| e.weight.id);
    std::iter::once(model.wte.weight.id).chain(wpe).collect()
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

/// The L2 norm of all gradients together, summed in f64 tensor by tensor in the model's order.
pub fn global_norm(model: &Gpt, grads: &GradientsParams) -> f64 {
    struct Squares<'a> {
        grads: &'a GradientsParams,
        sum: f64,
    }
    impl ModuleVisitor for Squares<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            if let Some(g) = self.grads.get::<D>(p.id) {
                self.sum += sum_squares(g);
            }
        }
    }
    let mut sq = Squares { grads, sum: 0.0 };
    model.visit(&mut sq);
    sq.sum.sqrt()
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use burn::module::Module;
    use burn::optim::AdamWConfig;
    use cinder_model::GptConfig;

    use super::*;

    /// The weights of `model`, flattened in visiting order.
    fn weights(model: &Gpt) -> Vec<f32> {
        struct Collect(Vec<f32>);
        impl ModuleVisitor for Collect {
            fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
                self.0
                    .extend(p.val().into_data().try_to_vec::<f32>().unwrap());
            }
        }
        let mut c = Collect(Vec::new());
        model.visit(&mut c);
        c.0
    }

    /// A one-block model of 11 tokens, context 8, width 16.
    fn one_block(device: &Device) -> Gpt {
        GptConfig::new(11, 8)
            .with_n_layer(1)
            .with_n_head(2)
            .with_n_embd(16)
            .init(device)
            .unwrap()
    }

    /// Two rows of 8 token ids, shifted by `seed`.
    fn ids(seed: i64, device: &Device) -> Tensor<2, Int> {
        let v: Vec<i64> = (0..16).map(|i| (i * 7 + seed) % 11).collect();
        Tensor::<2, Int>::from_data(TensorData::new(v, [2, 8]), device)
    }

    /// Burn's AdamW on gradients clipped with Burn's tensor operations: the reference.
    fn reference_step(
        optim: &mut ModuleOptimizer,
        lr: f64,
        model: Gpt,
        grads: GradientsParams,
        max_norm: f64,
    ) -> Gpt {
        struct Scale(GradientsParams, f32);
        impl ModuleVisitor for Scale {
            fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
                if let Some(g) = self.0.remove::<D>(p.id) {
                    self.0.register::<D>(p.id, g * self.1);
                }
            }
        }
        struct Squares<'a>(&'a GradientsParams, f64);
        impl ModuleVisitor for Squares<'_> {
            fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
                let g = self.0.get::<D>(p.id).unwrap();
                self.1 += g.square().sum().into_scalar::<f64>();
            }
        }
        let mut sq = Squares(&grads, 0.0);
        model.visit(&mut sq);
        let coef = if max_norm > 0.0 {
            (max_norm / (sq.1.sqrt() + 1e-6)).min(1.0) as f32
        } else {
            1.0
        };
        let mut scale = Scale(grads, coef);
        model.visit(&mut scale);
        optim.step(lr, model, scale.0)
    }

    #[test]
    fn fused_adamw_with_clipping_follows_burns_adamw() {
        let device = Device::flex().autodiff();
        device.seed(5);
        let c = TrainConfig {
            weight_decay: 0.1,
            ..TrainConfig::default()
        };
        let model = one_block(&device);
        let mut fused = Optim::new(&c, &model);
        let decayed = AdamWConfig::new()
            .with_beta_1(c.beta1 as f32)
            .with_beta_2(c.beta2 as f32)
            .with_epsilon(EPSILON)
            .with_weight_decay(c.weight_decay as f32);
        let mut burn = decayed.init().with_group(
            ParamGroup::from_ids(vector_params(&model)),
            decayed.clone().with_weight_decay(0.0).build(),
            None,
        );
        let (mut a, mut b) = (model.clone(), model);
        let ids = |seed| ids(seed, &device);
        // A small max_norm: the first steps are clipped, and the check would see a lost scale.
        for (step, max_norm) in [(0, 0.05), (1, 0.05), (2, 0.0), (3, 100.0)] {
            let grads = |m: &Gpt| {
                let loss = m.loss(ids(step), ids(step + 1), None);
                GradientsParams::from_grads(loss.backward(), m)
            };
            let (ga, gb) = (grads(&a), grads(&b));
            a = fused.step(1e-2, a, ga, max_norm);
            b = reference_step(&mut burn, 1e-2, b, gb, max_norm);
            let (wa, wb) = (weights(&a), weights(&b));
            let diff = cinder_testing::max_diff(&wa, &wb);
            assert!(diff < 1e-4, "step {step}: weights differ by {diff}");
        }
    }

    #[test]
    fn muon_takes_every_matrix_inside_the_blocks_and_nothing_else() {
        let device = Device::flex().autodiff();
        let model = GptConfig::new(11, 8)
            .with_n_layer(2)
            .with_n_head(2)
            .with_n_embd(16)
            .init(&device)
            .unwrap();
        struct Matrices(Vec<ParamId>);
        impl ModuleVisitor for Matrices {
            fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
                if D == 2 {
                    self.0.push(p.id);
                }
            }
        }
        let mut inside = Matrices(Vec::new());
        for block in &model.blocks {
            block.visit(&mut inside);
        }
        let (qkv, matrices) = muon_params(&model);
        let mut muon: Vec<ParamId> = qkv.iter().chain(&matrices).copied().collect();
        let (mut expected, count) = (inside.0, muon.len());
        muon.sort();
        expected.sort();
        assert_eq!(muon, expected);
        assert_eq!(count, 8, "4 matrices per block");
        // q/k/v: [C, 3C], the weight Muon sees as three matrices.
        for (id, block) in qkv.iter().zip(&model.blocks) {
            assert_eq!(*id, block.attn.c_attn.weight.id);
            assert_eq!(block.attn.c_attn.weight.val().dims(), [16, 48]);
        }
    }

    #[test]
    fn each_muon_group_takes_its_own_rate_and_update() {
        let device = Device::flex().autodiff();
        device.seed(3);
        let c = TrainConfig {
            optimizer: OptimizerKind::Muon,
            learning_rate: 1e-3,
            embedding_lr: 0.01,
            muon_lr: 0.02,
            muon_momentum: 0.95,
            weight_decay: 0.1,
            head_lr: 0.004,
            ..TrainConfig::default()
        };
        // With an untied head, of random weights.
        let model = one_block(&device).config.with_tie_embeddings(false);
        let model = model.init(&device).unwrap();
        let ids = |seed| ids(seed, &device);
        let grads = |m: &Gpt| {
            let loss = m.loss(ids(0), ids(1), None);
            GradientsParams::from_grads(loss.backward(), m)
        };
        let vals = |t: Tensor<2>| t.into_data().try_to_vec::<f32>().unwrap();
        let qkv = model.blocks[0].attn.c_attn.weight.clone();
        let qkv_grad = grads(&model).get::<2>(qkv.id).unwrap();
        let k = 0.5; // the schedule's factor at this step
        let after =
            Optim::new(&c, &model).step(c.learning_rate * k, model.clone(), grads(&model), 0.0);
        let largest_change =
            |before: Vec<f32>, after: Vec<f32>| cinder_testing::max_diff(&before, &after);
        // AdamW's first step moves each entry by its group's rate (Adam's m / sqrt(v) is ±1).
        let wte = largest_change(vals(model.wte.weight.val()), vals(after.wte.weight.val()));
        assert!((wte - 0.01 * 0.5).abs() < 1e-6, "embeddings moved {wte}");
        let head = |m: &Gpt| vals(m.lm_head.as_ref().unwrap().val());
        let head = largest_change(head(&model), head(&after));
        assert!(
            (head - 0.004 * 0.5).abs() < 1e-6,
            "the untied head moved {head}"
        );
        let gain = |m: &Gpt| {
            let t = m.blocks[0].ln_1.as_ref().unwrap().gamma.val();
            t.into_data().try_to_vec::<f32>().unwrap()
        };
        let gains = largest_change(gain(&model), gain(&after));
        assert!((gains - 1e-3 * 0.5).abs() < 1e-7, "gains moved {gains}");
        // q/k/v: decayed, then Muon's update of three matrices at muon_lr.
        let lr = (0.02 * 0.5) as f32;
        let widths = model.config.qkv_layout().widths();
        let u = cinder_model::ops::muon::orthogonalised(qkv_grad * (1.0 - 0.95 * 0.95), &widths);
        let expected: Vec<f32> = vals(qkv.val())
            .iter()
            .zip(vals(u))
            .map(|(p, u)| p * (1.0 - lr * 0.1) - lr * u)
            .collect();
        let got = vals(after.blocks[0].attn.c_attn.weight.val());
        let d = largest_change(expected, got);
        assert!(d < 1e-6, "q/k/v differ from Muon's update by {d}");
    }
}
