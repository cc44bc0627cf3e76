//! The training step on `cinder-kernels`: the Burn model's weights are read into vectors, the
//! hand-written forward and backward passes run over them, and the gradients go back into
//! Burn's optimizer as [`GradientsParams`]. The optimizer, the checkpoints and everything else
//! stay Burn's, so a run is the same run whichever path computed its gradients.

use burn::module::Param;
use burn::nn::{LayerNorm, Linear};
use burn::optim::GradientsParams;
use burn::prelude::*;
use cinder_data::Batch;
use cinder_kernels::{self as k, Dims, Params, Step};
use cinder_model::Gpt;

use crate::config::TrainConfig;

/// Which code computes the training step's gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Engine {
    /// The hand-written kernels where they apply (a CPU backend, no dropout), else Burn.
    #[default]
    Auto,
    /// Burn's autodiff, always.
    Burn,
    /// The hand-written kernels; an error where they do not apply.
    Kernels,
}

/// Why the kernels cannot run a configuration, if they cannot.
pub fn unsupported(config: &TrainConfig, backend_name: &str) -> Option<String> {
    if config.dropout > 0.0 {
        Some(format!(
            "the hand-written kernels have no dropout (this config has dropout {})",
            config.dropout
        ))
    } else if !matches!(backend_name, "flex" | "ndarray") {
        Some(format!(
            "the hand-written kernels run on the CPU, not on {backend_name}"
        ))
    } else {
        None
    }
}

/// Buffers of the hand-written step, allocated once per run.
pub struct KernelStep {
    params: Params,
    step: Step,
}

impl KernelStep {
    /// Buffers for batches of `batch_size` sequences of `block_size` tokens, shared out among
    /// rayon's threads.
    pub fn new(model: &Gpt, batch_size: usize, block_size: usize) -> Self {
        crate::keep_freed_memory();
        let params = params_of(model);
        let threads = rayon::current_num_threads();
        Self {
            step: Step::new(&params, batch_size, block_size, threads),
            params,
        }
    }

    /// Mean loss over `batches` (micro-batches of one step) and the gradient of that mean, as
    /// Burn's autodiff would give them for `model`, on `device`.
    pub fn run(
        &mut self,
        model: &Gpt,
        batches: &[Batch],
        device: &Device,
    ) -> (f32, GradientsParams) {
        copy_params(model, &mut self.params);
        self.step.zero_grad();
        let scale = 1.0 / batches.len() as f32;
        let mut loss = 0.0;
        for b in batches {
            loss += self
                .step
                .accumulate(&self.params, &b.inputs, &b.targets, scale)
                * scale;
        }
        (loss, gradients(model, self.step.gradients(), device))
    }
}

/// The model's shape.
pub fn dims_of(model: &Gpt) -> Dims {
    let [vocab_size, n_embd] = model.wte.weight.dims();
    Dims {
        vocab_size,
        block_size: model.block_size(),
        n_layer: model.n_layer(),
        n_head: model.blocks.first().map_or(1, |b| b.attn.n_head),
        n_embd,
        bias: model.ln_f.beta.is_some(),
    }
}

/// The model's weights as vectors.
pub fn params_of(model: &Gpt) -> Params {
    let mut p = Params::zeros(dims_of(model));
    copy_params(model, &mut p);
    p
}

/// Pairs each Burn parameter with its vector in `p`, in one place for both directions.
fn zip_params(model: &Gpt, p: &mut Params, f: &mut dyn FnMut(Tensor1or2, &mut Vec<f32>)) {
    f(Tensor1or2::Two(&model.wte.weight), &mut p.wte);
    f(Tensor1or2::Two(&model.wpe.weight), &mut p.wpe);
    let norm = |n: &LayerNorm, v: &mut k::Norm, f: &mut dyn FnMut(Tensor1or2, &mut Vec<f32>)| {
        f(Tensor1or2::One(&n.gamma), &mut v.gamma);
        if let (Some(b), Some(vb)) = (&n.beta, &mut v.beta) {
            f(Tensor1or2::One(b), vb);
        }
    };
    let linear = |l: &Linear, v: &mut k::Linear, f: &mut dyn FnMut(Tensor1or2, &mut Vec<f32>)| {
        f(Tensor1or2::Two(&l.weight), &mut v.weight);
        if let (Some(b), Some(vb)) = (&l.bias, &mut v.bias) {
            f(Tensor1or2::One(b), vb);
        }
    };
    for (b, v) in model.blocks.iter().zip(&mut p.blocks) {
        norm(&b.ln_1, &mut v.ln_1, f);
        linear(&b.attn.c_attn, &mut v.c_attn, f);
        linear(&b.attn.c_proj, &mut v.attn_proj, f);
        norm(&b.ln_2, &mut v.ln_2, f);
        linear(&b.mlp.c_fc, &mut v.c_fc, f);
        linear(&b.mlp.c_proj, &mut v.mlp_proj, f);
    }
    norm(&model.ln_f, &mut p.ln_f, f);
}

/// A parameter of rank 1 or 2.
enum Tensor1or2<'a> {
    One(&'a Param<Tensor<1>>),
    Two(&'a Param<Tensor<2>>),
}

fn copy_params(model: &Gpt, p: &mut Params) {
    zip_params(model, p, &mut |t, v| {
        let data = match t {
            Tensor1or2::One(t) => t.val().into_data(),
            Tensor1or2::Two(t) => t.val().into_data(),
        };
        let src = data.as_slice::<f32>().expect("cinder's parameters are f32");
        v.copy_from_slice(src);
    });
}

/// `grads` as Burn gradients of `model`'s parameters, on `device`.
fn gradients(model: &Gpt, grads: &Params, device: &Device) -> GradientsParams {
    let mut out = GradientsParams::new();
    let mut grads = grads.clone();
    zip_params(model, &mut grads, &mut |t, v| {
        let values = std::mem::take(v);
        match t {
            Tensor1or2::One(p) => {
                let g = Tensor::<1>::from_data(TensorData::new(values, p.val().dims()), device);
                out.register(p.id, g);
            }
            Tensor1or2::Two(p) => {
                let g = Tensor::<2>::from_data(TensorData::new(values, p.val().dims()), device);
                out.register(p.id, g);
            }
        }
    });
    out
}
