//! Training on `cinder-kernels`: the hand-written forward and backward passes, AdamW and
//! gradient clipping run over plain vectors, which hold the weights and the optimizer state
//! during training, and evaluate on them. The Burn model is written from them when it is needed
//! (checkpoints, `Trainer::model`), and Burn's optimizer receives their state before every
//! checkpoint, in its own record format: a checkpoint is the same whichever engine wrote it, and
//! either engine can resume it. Sampling and `evaluate` use the same kernels on a copy of a
//! model's weights.

use std::collections::HashMap;

use burn::module::{ModuleMapper, Param, ParamId};
use burn::nn::{LayerNorm, Linear};
use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::prelude::*;
use burn_pack::{Reader, Scalar, Writer};
use cinder_data::Batch;
use cinder_kernels::{AdamState, AdamW, Dims, Params, Step, clip_global_norm};
use cinder_model::Gpt;

use crate::config::TrainConfig;
use crate::device::Backend;

/// Which code computes the training step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Engine {
    /// The hand-written kernels where they apply (a CPU backend, no dropout), else Burn.
    #[default]
    Auto,
    /// Burn's autodiff and optimizer, always.
    Burn,
    /// The hand-written kernels; an error where they do not apply.
    Kernels,
}

/// Why the optimizer state could not be moved between Burn and the kernels.
#[derive(Debug, thiserror::Error)]
#[error("cannot move the optimizer state between Burn and the kernels: {0}")]
pub struct StateError(String);

/// Why the kernels cannot run a configuration, if they cannot.
pub fn unsupported(config: &TrainConfig, backend: &Backend) -> Option<String> {
    if config.dropout > 0.0 {
        Some(format!(
            "the hand-written kernels have no dropout (this config has dropout {})",
            config.dropout
        ))
    } else if !backend.is_cpu() {
        Some(format!(
            "the hand-written kernels run on the CPU, not on {}",
            backend.name
        ))
    } else {
        None
    }
}

/// Whether sampling runs on the kernels: `Auto` and `Kernels` on a CPU backend (dropout plays
/// no part in inference); an error for `Kernels` elsewhere.
pub fn for_inference(engine: Engine, backend: &Backend) -> Result<bool, String> {
    match engine {
        Engine::Burn => Ok(false),
        Engine::Auto => Ok(backend.is_cpu()),
        Engine::Kernels if backend.is_cpu() => Ok(true),
        Engine::Kernels => Err(format!(
            "--engine kernels runs on the CPU, not on {}: use --engine auto or --device cpu",
            backend.name
        )),
    }
}

/// A run's weights, optimizer state and buffers on the kernels.
pub struct KernelStep {
    params: Params,
    adamw: AdamW,
    state: AdamState,
    step: Step,
    /// The Burn parameters, in the order of [`Params::vectors`].
    infos: Vec<ParamInfo>,
}

/// What a record needs to know of one parameter.
struct ParamInfo {
    id: ParamId,
    /// Module path, as Burn records it: `blocks.0.attn.c_attn.weight`.
    path: String,
    dims: Vec<usize>,
}

impl KernelStep {
    /// Takes over `model`'s weights and `optim`'s state (empty before the first step), for
    /// batches of `batch_size` sequences of `block_size` tokens shared out among rayon's threads.
    pub fn new(
        model: &Gpt,
        optim: &ModuleOptimizer,
        config: &TrainConfig,
    ) -> Result<Self, StateError> {
        crate::keep_freed_memory();
        let params = params_of(model);
        let infos = burn_params(model)
            .into_iter()
            .map(|(path, p)| ParamInfo {
                id: p.id(),
                path,
                dims: p.dims(),
            })
            .collect();
        let threads = rayon::current_num_threads();
        let mut this = Self {
            step: Step::new(&params, config.batch_size, config.block_size, threads),
            state: AdamState::new(&params),
            adamw: AdamW {
                beta_1: config.beta1 as f32,
                beta_2: config.beta2 as f32,
                epsilon: 1e-8,
                weight_decay: config.weight_decay as f32,
            },
            params,
            infos,
        };
        this.read_optimizer(optim)?;
        Ok(this)
    }

    /// One optimizer step over `batches` (the micro-batches of one iteration): returns their
    /// mean loss.
    pub fn train_step(&mut self, batches: &[Batch], lr: f64, grad_clip: f64) -> f32 {
        let loss = self.accumulate(batches);
        let grads = self.step.gradients();
        if grad_clip > 0.0 {
            clip_global_norm(grads, grad_clip as f32);
        }
        self.adamw
            .step(lr, &mut self.params, grads, &mut self.state);
        loss
    }

    /// The current weights' mean loss on `batch` (forward passes only).
    pub fn loss(&mut self, batch: &Batch) -> f32 {
        self.step.loss(&self.params, &batch.inputs, &batch.targets)
    }

    /// Mean loss over `batches` for `model`'s weights and its gradient, as Burn's autodiff
    /// would give them (the weights are taken from `model` first).
    pub fn gradients(
        &mut self,
        model: &Gpt,
        batches: &[Batch],
        device: &Device,
    ) -> (f32, GradientsParams) {
        copy_params(model, &mut self.params);
        let loss = self.accumulate(batches);
        let grads = self.step.gradients();
        let mut out = GradientsParams::new();
        for (p, (info, g)) in burn_params(model)
            .into_iter()
            .zip(self.infos.iter().zip(grads.vectors()))
        {
            let data = TensorData::new(g.clone(), info.dims.clone());
            match p.1 {
                ParamRef::One(p) => out.register(p.id, Tensor::<1>::from_data(data, device)),
                ParamRef::Two(p) => out.register(p.id, Tensor::<2>::from_data(data, device)),
            }
        }
        (loss, out)
    }

    fn accumulate(&mut self, batches: &[Batch]) -> f32 {
        self.step.zero_grad();
        let scale = 1.0 / batches.len() as f32;
        let mut loss = 0.0;
        for b in batches {
            loss += self
                .step
                .accumulate(&self.params, &b.inputs, &b.targets, scale)
                * scale;
        }
        loss
    }

    /// `model` with the kernels' weights (same parameter ids).
    pub fn write_model(&self, model: Gpt) -> Gpt {
        struct Write<'a> {
            values: HashMap<ParamId, &'a Vec<f32>>,
        }
        impl ModuleMapper for Write<'_> {
            fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
                let Some(values) = self.values.get(&param.id) else {
                    return param;
                };
                let values = (*values).clone();
                param.map(|t| {
                    let grad = t.is_require_grad();
                    let data = TensorData::new(values, t.dims());
                    let new = Tensor::<D>::from_data(data, &t.device());
                    if grad { new.require_grad() } else { new }
                })
            }
        }
        let values = self
            .infos
            .iter()
            .map(|i| i.id)
            .zip(self.params.vectors())
            .collect();
        model.map(&mut Write { values })
    }

    /// `optim` (a fresh Burn AdamW for the model) loaded with the kernels' optimizer state.
    pub fn write_optimizer(&self, optim: ModuleOptimizer) -> Result<ModuleOptimizer, StateError> {
        let err = |e: &dyn std::fmt::Display| StateError(e.to_string());
        if self.state.time == 0 {
            return Ok(optim);
        }
        let mut tensors = Vec::new();
        let mut writer_scalars = Vec::new();
        let moments = self.state.moment_1.vectors();
        let seconds = self.state.moment_2.vectors();
        for ((info, m), v) in self.infos.iter().zip(moments).zip(seconds) {
            let id = info.id.val();
            for (leaf, values) in [("moment_1", m), ("moment_2", v)] {
                let data = TensorData::new(values.clone(), info.dims.clone());
                let (bytes, shape, dtype) = data.into_parts();
                let name = format!("{id}.momentum.{leaf}");
                tensors.push(burn_pack::Tensor::new(name, dtype, shape, Some(id), bytes));
            }
            writer_scalars.push((format!("{id}.__rank"), info.dims.len() as u64));
            writer_scalars.push((format!("{id}.momentum.time"), self.state.time as u64));
        }
        let mut writer = Writer::new(tensors);
        for (key, value) in &writer_scalars {
            writer = writer.with_scalar(key, Scalar::UInt(*value));
        }
        for info in &self.infos {
            writer = writer.with_metadata(&info.id.val().to_string(), &info.path);
        }
        let bytes = writer.into_bytes().map_err(|e| err(&e))?;
        optim.from_bytes(bytes).map_err(|e| err(&e))
    }

    /// Takes Burn's optimizer state for the model's parameters, if it has any.
    fn read_optimizer(&mut self, optim: &ModuleOptimizer) -> Result<(), StateError> {
        let err = |e: &dyn std::fmt::Display| StateError(e.to_string());
        let bytes = optim.into_bytes().map_err(|e| err(&e))?;
        let reader = Reader::from_bytes(bytes).map_err(|e| err(&e))?;
        let scalars = reader.scalars().clone();
        let mut tensors = HashMap::new();
        for t in reader.into_tensors().map_err(|e| err(&e))? {
            let (name, dtype, shape, _, bytes) = t.into_parts().map_err(|e| err(&e))?;
            let values = TensorData::from_bytes(bytes, shape, dtype)
                .convert::<f32>()
                .try_into_vec::<f32>()
                .map_err(|e| err(&format!("{e:?}")))?;
            tensors.insert(name, values);
        }
        if tensors.is_empty() {
            return Ok(());
        }
        let mut time = None;
        let moments = self.state.moment_1.vectors_mut();
        let seconds = self.state.moment_2.vectors_mut();
        for ((info, m), v) in self.infos.iter().zip(moments).zip(seconds) {
            let id = info.id.val();
            let t = match scalars.get(&format!("{id}.momentum.time")) {
                Some(Scalar::UInt(t)) => *t as usize,
                other => {
                    return Err(StateError(format!(
                        "no step count for {} ({other:?})",
                        info.path
                    )));
                }
            };
            if *time.get_or_insert(t) != t {
                return Err(StateError(format!(
                    "{} has taken {t} steps, others {time:?}",
                    info.path
                )));
            }
            for (leaf, dst) in [("moment_1", m), ("moment_2", v)] {
                let src = tensors
                    .remove(&format!("{id}.momentum.{leaf}"))
                    .ok_or_else(|| StateError(format!("no {leaf} for {}", info.path)))?;
                if src.len() != dst.len() {
                    return Err(StateError(format!(
                        "{leaf} of {} has the wrong size",
                        info.path
                    )));
                }
                *dst = src;
            }
        }
        self.state.time = time.unwrap_or(0);
        Ok(())
    }
}

/// [`crate::eval::text_loss`] on the kernels, with a copy of `model`'s weights.
pub fn text_loss(
    model: &Gpt,
    ids: &[u32],
    batch_size: usize,
    progress: impl FnMut(usize, usize),
) -> crate::eval::TextLoss {
    let params = params_of(model);
    let threads = rayon::current_num_threads();
    let mut steps: HashMap<usize, Step> = HashMap::new();
    crate::eval::text_loss_with(
        model.block_size(),
        ids,
        batch_size,
        progress,
        |x, y, [n, block]| {
            steps
                .entry(n)
                .or_insert_with(|| Step::new(&params, n, block, threads))
                .loss(&params, x, y)
        },
    )
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

fn copy_params(model: &Gpt, p: &mut Params) {
    for ((_, param), v) in burn_params(model).into_iter().zip(p.vectors_mut()) {
        let data = match param {
            ParamRef::One(t) => t.val().into_data(),
            ParamRef::Two(t) => t.val().into_data(),
        };
        v.copy_from_slice(data.as_slice::<f32>().expect("cinder's parameters are f32"));
    }
}

/// A parameter of rank 1 or 2.
enum ParamRef<'a> {
    One(&'a Param<Tensor<1>>),
    Two(&'a Param<Tensor<2>>),
}

impl ParamRef<'_> {
    fn id(&self) -> ParamId {
        match self {
            ParamRef::One(p) => p.id,
            ParamRef::Two(p) => p.id,
        }
    }

    fn dims(&self) -> Vec<usize> {
        match self {
            ParamRef::One(p) => p.val().dims().to_vec(),
            ParamRef::Two(p) => p.val().dims().to_vec(),
        }
    }
}

/// The model's parameters with their module paths, in the order of [`Params::vectors`].
fn burn_params(model: &Gpt) -> Vec<(String, ParamRef<'_>)> {
    let mut out = vec![
        ("wte.weight".to_string(), ParamRef::Two(&model.wte.weight)),
        ("wpe.weight".to_string(), ParamRef::Two(&model.wpe.weight)),
    ];
    fn norm<'a>(out: &mut Vec<(String, ParamRef<'a>)>, path: &str, n: &'a LayerNorm) {
        out.push((format!("{path}.gamma"), ParamRef::One(&n.gamma)));
        if let Some(b) = &n.beta {
            out.push((format!("{path}.beta"), ParamRef::One(b)));
        }
    }
    fn linear<'a>(out: &mut Vec<(String, ParamRef<'a>)>, path: &str, l: &'a Linear) {
        out.push((format!("{path}.weight"), ParamRef::Two(&l.weight)));
        if let Some(b) = &l.bias {
            out.push((format!("{path}.bias"), ParamRef::One(b)));
        }
    }
    for (i, b) in model.blocks.iter().enumerate() {
        let p = format!("blocks.{i}");
        norm(&mut out, &format!("{p}.ln_1"), &b.ln_1);
        linear(&mut out, &format!("{p}.attn.c_attn"), &b.attn.c_attn);
        linear(&mut out, &format!("{p}.attn.c_proj"), &b.attn.c_proj);
        norm(&mut out, &format!("{p}.ln_2"), &b.ln_2);
        linear(&mut out, &format!("{p}.mlp.c_fc"), &b.mlp.c_fc);
        linear(&mut out, &format!("{p}.mlp.c_proj"), &b.mlp.c_proj);
    }
    norm(&mut out, "ln_f", &model.ln_f);
    out
}
