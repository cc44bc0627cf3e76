//! The training loop: optimizer steps on random batches, periodic evaluation, and checkpoints.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::prelude::*;
use cinder_data::{Batcher, Split, Splits, TextIdentity, Tokenizer};
use cinder_model::{DropoutKey, Gpt, Ops};

use crate::config::TrainConfig;
use crate::data::{TrainingData, batch_tensors};
use crate::device::Backend;
use crate::faults;
use crate::run::eval;
use crate::run::optim::Optim;
use crate::run::pool::in_pool;
use crate::run::report::{EvalReport, Observer, Phases, StepReport};
use crate::run::schedule::learning_rate;
use crate::sampling;
use crate::storage::checkpoint::{self, CheckpointError, Meta, ValTrend};
use crate::storage::names::{BEST, LATEST};

/// Why training stopped early.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(
        "the training loss became {loss} at iteration {iter}: training stopped. The last good \
         checkpoint is kept; try a lower --learning-rate or a --grad-clip of 1.0"
    )]
    NonFinite { iter: u64, loss: f32 },
    #[error("invalid model configuration: {0}")]
    Model(#[from] cinder_model::ConfigError),
}

/// How a call to [`Trainer::run`] ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Reached `max_iters`.
    Finished,
    /// Stopped by the stop flag (Ctrl-C, SIGTERM) after this many iterations.
    Interrupted { iter: u64 },
    /// Stopped after `early_stop` evaluations in a row without a new best, at this iteration.
    EarlyStopped { iter: u64 },
}

/// A training run in progress: the model, its optimizer, its data, and where it writes.
pub struct Trainer {
    config: TrainConfig,
    backend: Backend,
    tokenizer: Tokenizer,
    splits: Splits,
    /// The model on the autodiff device.
    model: Gpt,
    /// The optimizer and its state.
    optim: Optim,
    /// Iterations completed.
    iter: u64,
    best_val_loss: Option<f32>,
    /// How validation has gone: what early stopping counts.
    trend: ValTrend,
    /// The training data's paths, recorded in checkpoints so a resume finds them.
    data_paths: Vec<PathBuf>,
    /// The training text's size and checksum, recorded in checkpoints so a resume can tell
    /// that the text changed.
    data_identity: TextIdentity,
    /// The run folder: `latest/` and `best/` go inside.
    out_dir: PathBuf,
}

impl Trainer {
    /// A new run: the model initialised from the config's seed.
    pub fn new(
        config: TrainConfig,
        backend: Backend,
        data: TrainingData,
        out_dir: PathBuf,
    ) -> Result<Self, TrainError> {
        let device = backend.device.clone().autodiff();
        device.seed(config.seed);
        let model = config.model(data.tokenizer.vocab_size()).init(&device)?;
        Self::starting_from(model, config, backend, data, out_dir)
    }

    /// A new run that starts from the weights of the checkpoint `dir` (fine-tuning): a fresh
    /// optimizer, the schedule from iteration 0. `config` must have the checkpoint's
    /// architecture (but may have a shorter context: the model is cropped to it), and `data`
    /// its vocabulary; its other settings are the new run's.
    pub fn fine_tune(
        dir: &Path,
        meta: &Meta,
        config: TrainConfig,
        backend: Backend,
        data: TrainingData,
        out_dir: PathBuf,
    ) -> Result<Self, TrainError> {
        let device = backend.device.clone().autodiff();
        device.seed(config.seed);
        // The checkpoint's context, cropped to the run's when that is shorter.
        let stored = TrainConfig {
            block_size: meta.config.block_size,
            ..config.clone()
        };
        let model_config = stored.model(data.tokenizer.vocab_size());
        let model = checkpoint::load_weights(dir, meta, &model_config, &device)?
            .crop_block_size(config.block_size);
        Self::starting_from(model, config, backend, data, out_dir)
    }

    fn starting_from(
        model: Gpt,
        config: TrainConfig,
        backend: Backend,
        data: TrainingData,
        out_dir: PathBuf,
    ) -> Result<Self, TrainError> {
        let optim = Optim::new(&config, &model);
        let state = (model, optim, 0, None, ValTrend::default());
        Self::assemble(config, backend, data, state, out_dir)
    }

    /// A run continued from the checkpoint `dir`, whose metadata is `meta`; `config` is the
    /// checkpoint's configuration with the changes allowed on resume already applied, and `data`
    /// the run's text (the caller checks that it is the same text: [`Meta::data_identity`]).
    pub fn resume(
        dir: &Path,
        meta: &Meta,
        config: TrainConfig,
        backend: Backend,
        data: TrainingData,
        out_dir: PathBuf,
    ) -> Result<Self, TrainError> {
        let device = backend.device.clone().autodiff();
        let model = checkpoint::load_model(dir, meta, &device)?;
        let mut optim = Optim::new(&config, &model);
        optim.module = checkpoint::load_optimizer(dir, meta, optim.module)?;
        let state = (model, optim, meta.iter, meta.best_val_loss, meta.val_trend);
        Self::assemble(config, backend, data, state, out_dir)
    }

    /// The trainer of `data` from `state`: the model, its optimizer, the iterations completed,
    /// the best validation loss so far and the validation trend.
    fn assemble(
        config: TrainConfig,
        backend: Backend,
        data: TrainingData,
        (model, optim, iter, best_val_loss, trend): (Gpt, Optim, u64, Option<f32>, ValTrend),
        out_dir: PathBuf,
    ) -> Result<Self, TrainError> {
        crate::keep_freed_memory();
        Ok(Self {
            config,
            backend,
            tokenizer: data.tokenizer,
            splits: data.splits,
            model,
            optim,
            iter,
            best_val_loss,
            trend,
            data_paths: data.paths,
            data_identity: data.identity,
            out_dir,
        })
    }

    /// This run with the layers of `ops`: the fused ones (the default) or, for comparisons and
    /// tests, the composite ones. Both give the same results up to float rounding (tested).
    pub fn with_ops(mut self, ops: Ops) -> Self {
        self.model = self.model.with_ops(ops);
        self
    }

    /// Which layers run: the fused ones (on a backend that has them) or the composite ones.
    pub fn ops(&self) -> Ops {
        self.model.ops.on(&self.backend.device)
    }

    /// The model with the latest weights.
    pub fn model(&self) -> &Gpt {
        &self.model
    }

    /// The run's configuration.
    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    /// The backend the run trains on.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The run's tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The training and validation token ids.
    pub fn splits(&self) -> &Splits {
        &self.splits
    }

    /// Starts the optimizer afresh (moments and step counts at zero), keeping the weights and
    /// the iteration.
    pub fn restart_optimizer(&mut self) {
        self.optim = Optim::new(&self.config, &self.model);
    }

    /// Iterations completed.
    pub fn iter(&self) -> u64 {
        self.iter
    }

    /// Passes over the training split so far: the tokens of the iterations completed over the
    /// split's tokens.
    pub fn epochs(&self) -> f64 {
        let seen = self.iter as f64 * self.config.tokens_per_iter() as f64;
        seen / self.splits.get(Split::Train).len().max(1) as f64
    }

    /// The best validation loss so far, if any evaluation ran.
    pub fn best_val_loss(&self) -> Option<f32> {
        self.best_val_loss
    }

    /// The run folder.
    pub fn out_dir(&self) -> &Path {
        &self.out_dir
    }

    /// Trains until `max_iters` or until `stop` is set, evaluating every `eval_interval`
    /// iterations and at the end, and writing `latest/` every `checkpoint_interval`
    /// iterations, at the end and when stopped, and `best/` when the validation loss improves.
    /// With `early_stop`, it stops after that many evaluations in a row without a new best.
    pub fn run(
        &mut self,
        observer: &mut dyn Observer,
        stop: &AtomicBool,
    ) -> Result<Outcome, TrainError> {
        let c = self.config.clone();
        let past_patience = |trend: &ValTrend| c.early_stop > 0 && trend.since_best >= c.early_stop;
        if past_patience(&self.trend) && self.iter < c.max_iters {
            // A run resumed after it stopped early (or with a smaller early_stop): nothing new.
            return Ok(Outcome::EarlyStopped { iter: self.iter });
        }
        while self.iter < c.max_iters {
            if stop.load(Ordering::SeqCst) {
                self.save(LATEST, None, observer)?;
                return Ok(Outcome::Interrupted { iter: self.iter });
            }
            let report = self.step();
            if !report.loss.is_finite() {
                return Err(TrainError::NonFinite {
                    iter: report.iter,
                    loss: report.loss,
                });
            }
            let done = self.iter;
            let last = done == c.max_iters;
            let eval = if done.is_multiple_of(c.eval_interval) || last {
                let Some(mut e) = self.evaluate(observer, stop) else {
                    // Interrupted while evaluating: keep the step, skip the evaluation.
                    observer.step(&report, None);
                    self.save(LATEST, None, observer)?;
                    return Ok(Outcome::Interrupted { iter: self.iter });
                };
                self.trend.record(e.val_loss, e.improved);
                e.trend = self.trend;
                Some(e)
            } else {
                None
            };
            observer.step(&report, eval.as_ref());
            // Decided at an evaluation only, when latest/ is written with its count.
            let stops_early = eval.is_some() && past_patience(&self.trend);
            let mut saved_latest = false;
            if let Some(e) = eval {
                if e.improved {
                    self.best_val_loss = Some(e.val_loss);
                    self.save(BEST, Some(e.val_loss), observer)?;
                }
                if last || stops_early {
                    self.save(LATEST, Some(e.val_loss), observer)?;
                    saved_latest = true;
                }
            }
            if stops_early && !last {
                return Ok(Outcome::EarlyStopped { iter: done });
            }
            if done.is_multiple_of(c.checkpoint_interval) && !saved_latest {
                self.save(LATEST, None, observer)?;
            }
        }
        Ok(Outcome::Finished)
    }

    /// One optimiser step (iteration `self.iter`), over `gradient_accumulation_steps`
    /// micro-batches. Its batches and dropout masks depend only on (seed, iteration).
    /// The whole step runs in the pool ([`in_pool`]): its kernels' loops start without a
    /// hand-off.
    pub fn step(&mut self) -> StepReport {
        in_pool(|| self.step_in_pool())
    }

    fn step_in_pool(&mut self) -> StepReport {
        let start = Instant::now();
        let mut phases = Phases::default();
        let mut lap = Instant::now();
        let mut mark = |phase: &mut f64| {
            *phase += lap.elapsed().as_secs_f64();
            lap = Instant::now();
        };
        let c = &self.config;
        let it = self.iter;
        let device = self.backend.device.clone().autodiff();
        device.seed(c.seed ^ it.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let batcher = Batcher::new(c.seed, c.batch_size, c.block_size);
        let accum = c.gradient_accumulation_steps;
        let tokens = self.splits.get(Split::Train);

        let lr = learning_rate(c, it);
        faults::reached("step");
        let mut loss_sum = 0.0f32;
        let mut grads = GradientsAccumulator::new();
        for micro in 0..accum as u64 {
            let draw = it * accum as u64 + micro;
            let batch = batcher.batch(tokens, Split::Train, 0, draw);
            let (x, y) = batch_tensors(&batch, &device);
            mark(&mut phases.batch);
            let key = DropoutKey { seed: c.seed, draw };
            let loss = self.model.loss(x, y, Some(key));
            let loss = if accum == 1 {
                loss
            } else {
                loss / accum as f64
            };
            loss_sum += loss.clone().into_scalar::<f32>();
            mark(&mut phases.forward_loss);
            grads.accumulate(
                &self.model,
                GradientsParams::from_grads(loss.backward(), &self.model),
            );
            mark(&mut phases.backward);
        }
        self.model = self
            .optim
            .step(lr, self.model.clone(), grads.grads(), c.grad_clip);
        mark(&mut phases.clip_adamw);
        self.iter += 1;
        StepReport {
            iter: it,
            loss: loss_sum,
            lr,
            seconds: start.elapsed().as_secs_f64(),
            tokens: c.tokens_per_iter(),
            epochs: self.epochs(),
            phases,
        }
    }

    /// Mean loss on both splits over `eval_iters` batches, in inference mode, and a sample of
    /// the model's text ([`sampling::sample`]); `None` if `stop` was set meanwhile.
    pub fn evaluate(&self, observer: &mut dyn Observer, stop: &AtomicBool) -> Option<EvalReport> {
        let c = self.config.clone();
        let batcher = Batcher::new(c.seed, c.batch_size, c.block_size);
        let n = c.eval_iters;
        let mut keep_going = |split, done| {
            faults::reached("eval");
            observer.eval_progress(split, done, n);
            !stop.load(Ordering::SeqCst)
        };
        let splits = &self.splits;
        let model = self.model.valid();
        let mut loss = |split| {
            eval::mean_loss(
                &model,
                splits,
                split,
                &batcher,
                n,
                &self.backend.device,
                |done| keep_going(split, done),
            )
        };
        let train_loss = loss(Split::Train)?;
        let val_loss = loss(Split::Val)?;
        let sample = self.sample();
        Some(EvalReport {
            iter: self.iter,
            train_loss,
            val_loss,
            improved: self.best_val_loss.is_none_or(|best| val_loss < best),
            trend: self.trend,
            sample,
        })
    }

    /// What the model writes now: `sample_tokens` of it from generate's default prompt, with
    /// the run's seed ([`sampling::sample`]); `None` when `sample_tokens` is 0.
    pub fn sample(&self) -> Option<String> {
        let c = &self.config;
        (c.sample_tokens > 0).then(|| {
            sampling::sample(
                &self.model.valid(),
                &self.tokenizer,
                c.sample_tokens,
                c.seed,
                &self.backend.device,
            )
        })
    }

    /// Writes the checkpoint `name` of the run folder (what measuring a shape times).
    pub fn save_checkpoint(&self, name: &str) -> Result<(), TrainError> {
        self.save(name, None, &mut ())
    }

    /// Writes the checkpoint `name` of the run folder.
    fn save(
        &self,
        name: &str,
        val_loss: Option<f32>,
        observer: &mut dyn Observer,
    ) -> Result<(), TrainError> {
        let dir = self.out_dir.join(name);
        let mut meta = Meta::new(&self.config, &self.tokenizer, self.backend.name, self.iter);
        meta.data_path = self.data_paths.first().cloned().unwrap_or_default();
        meta.data_paths = self.data_paths.clone();
        meta.data_identity = Some(self.data_identity);
        meta.best_val_loss = self.best_val_loss;
        meta.val_loss = val_loss;
        meta.val_trend = self.trend;
        checkpoint::save(
            &dir,
            &meta,
            &self.tokenizer,
            &self.model,
            Some(&self.optim.module),
        )?;
        observer.checkpoint(name, &dir, self.iter);
        Ok(())
    }
}
