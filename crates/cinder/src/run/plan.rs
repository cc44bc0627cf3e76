//! `train --time`: the run this machine can make from this text in the time given.
//!
//! A new run with a [`TimeBudget`] has its shape and schedule chosen once, as it starts, after
//! its text is read and tokenized (a BPE's training included):
//! 1. [`measure`]: a few steps of each shape of the [`LADDER`], smallest first, then steps of
//!    each in turn, within [`MEASURE_SHARE`] of the budget: seconds per step, per evaluation
//!    batch and per checkpoint;
//! 2. [`choose`]: the rule below, a pure function of the text's tokens, the seconds left and
//!    the measured speeds; where it gives dropout, the shape chosen is timed with and without
//!    it in turn ([`dropout_cost`], within [`DROPOUT_SHARE`]: dropout's masks slow a step) and
//!    its steps fitted to that;
//! 3. [`Plan::apply`] writes the choice into the config, which the run folder keeps. The
//!    iterations are then fixed: a resumed run goes on as the uninterrupted one would have,
//!    never reading a clock.
//!
//! # The rule
//! Each measured shape gets the steps that fit in the time left after its evaluations and
//! checkpoints. Of the shapes that get at least [`STEPS_WANTED`] (or, where none does,
//! [`MIN_STEPS`]), the one chosen is the one whose tokens per parameter are nearest the target
//! for its compute ([`target_tokens_per_param`]: more compute, fewer tokens per weight), on a
//! log scale, counting repeated epochs at a discount ([`effective_tokens`]), and no larger than
//! the text can use ([`MAX_WEIGHTS_PER_TOKEN`]). A larger text, a longer budget or a faster
//! machine so moves the choice up the ladder, a smaller text down it.
//! Where the run is expected to overfit ([`overfits`]: many epochs of a text small beside the
//! model) it gets dropout and is watched more closely ([`WATCHED`], else [`LIGHT`]); and since
//! there the text, not the time, limits the model, the largest shape within the cap that gets
//! its steps is chosen (on a 0.23 MB text 3 x 96 beat 2 x 96 by 0.04 at two minutes, and every
//! larger shape at ten). The
//! constants are fitted to the measured runs of BENCHMARKS.md (sections 24 and 26 to 30), where
//! the tables and the fit are.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use cinder_data::Split;
use cinder_model::Ops;

use crate::config::{Overrides, TrainConfig};
use crate::data::TrainingData;
use crate::device::Backend;
use crate::run::trainer::{TrainError, Trainer};

/// The shape fields a plan chooses (unless a flag fixes them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub block_size: usize,
    pub batch_size: usize,
}

/// The shapes a plan chooses from, smallest first: each about 1.5-3x the compute per step of
/// the one before. The third has a context of 128 in batches of 8 (the same tokens a step as
/// 64 in 16), which was better on three texts of four at two minutes (BENCHMARKS.md, section
/// 27). The fifth is the default run's (`configs/tiny_cpu.toml`), the seventh the
/// ten-minute recipe's (`configs/shakespeare_10min.toml`).
pub const LADDER: &[Shape] = &[
    shape(2, 64, 2, 64, 16),
    shape(2, 96, 3, 64, 16),
    shape(3, 96, 3, 128, 8),
    shape(3, 128, 4, 64, 16),
    shape(4, 128, 4, 64, 24),
    shape(4, 192, 6, 128, 16),
    shape(6, 256, 4, 128, 32),
    shape(8, 384, 6, 256, 24),
    shape(10, 512, 8, 256, 32),
    shape(12, 768, 12, 512, 32),
];

const fn shape(
    n_layer: usize,
    n_embd: usize,
    n_head: usize,
    block_size: usize,
    batch_size: usize,
) -> Shape {
    Shape {
        n_layer,
        n_embd,
        n_head,
        block_size,
        batch_size,
    }
}

/// The target of the rule: training tokens (repeats discounted) per weight in the blocks, for a
/// run of [`REFERENCE_COMPUTE`] (tokens times weights), falling as the compute grows
/// ([`target_tokens_per_param`]). At two minutes on one core (about 1e12) the best shapes of
/// four texts had 5 to 20 (BENCHMARKS.md, section 27); at ten minutes (about 5.5e12) the best
/// on the two larger texts was 4 x 192 with about 1,550 steps, at 1.9 (section 27's grids).
pub const TOKENS_PER_PARAM: f64 = 8.0;
/// The compute, in training tokens times weights in the blocks, at which the target is
/// [`TOKENS_PER_PARAM`].
pub const REFERENCE_COMPUTE: f64 = 1e12;
/// How fast the target falls with compute: `target ∝ compute^-TARGET_SLOPE`, fitted to the two
/// budgets (8 at 1e12, 2 at 5.5e12). More compute goes mostly into a larger model here, where
/// Chinchilla's models (10^18 and more) held the ratio near 20.
pub const TARGET_SLOPE: f64 = 0.8;
/// The least the target falls to: the least measured to be best (at ten minutes), held beyond.
pub const LEAST_TARGET: f64 = 2.0;

/// The fewest optimiser steps a plan gives a model: fewer, and warm-up and cool-down are most
/// of the run.
pub const MIN_STEPS: u64 = 300;
/// The steps a plan gives a model where some shape gets them: a model given fewer in the same
/// time learnt less than a smaller one given more (BENCHMARKS.md, section 24: at two minutes,
/// 3 x 96 with 800-860 steps against 2 x 96 with 1,600).
pub const STEPS_WANTED: u64 = 1000;
/// Repeated epochs count less, in the form of Muennighoff et al. (2023), "Scaling
/// Data-Constrained Language Models": after the first epoch, each repeat is worth `exp(-r / R*)`
/// of a new one. Their `R*` of 15 made a 0.23 MB text choose 2 x 96 at 18 epochs (val 1.819)
/// where 3 x 96 at 11 epochs reached 1.777 and 4 x 128 at 7.5 1.771 (BENCHMARKS.md, section 27):
/// with dropout, repeats here kept more of their worth.
pub const REPEAT_DECAY: f64 = 40.0;
/// The most weights in the blocks a plan gives each token of its text: past it, a model
/// learns a small text by heart faster than its repeats are worth, whatever its compute. On a
/// 0.23 MB text at ten minutes (BENCHMARKS.md, sections 27-29), 3 x 96 at 1.6 weights per token
/// reached 1.767-1.779 in six runs, where 3 x 128 at 2.9, 4 x 128 at 3.8 and 4 x 192 at 8.6
/// (which the falling target alone chose) ended at 1.790-1.824. Not measured against it: the
/// 6 x 256 of `configs/shakespeare_10min.toml` (4.7 on Tiny Shakespeare, 20 minutes on two
/// cores), our best Shakespeare run, which a budget would now not choose.
pub const MAX_WEIGHTS_PER_TOKEN: f64 = 2.0;

/// Whether `shape` is too large for a text of `text_tokens` ([`MAX_WEIGHTS_PER_TOKEN`]).
fn too_large(shape: &Shape, text_tokens: usize) -> bool {
    shape.params() > MAX_WEIGHTS_PER_TOKEN * text_tokens as f64
}

/// How closely a run is watched: its evaluations (the last at its end), and the share of the
/// time left that they may take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Watch {
    pub evaluations: u64,
    pub share: f64,
}
/// A run expected to overfit ([`overfits`]): enough evaluations for early stopping to see the
/// turn.
pub const WATCHED: Watch = Watch {
    evaluations: 8,
    share: 0.08,
};
/// A run that reads its text too few times to overfit: its best val is at its end (the
/// cool-down's), so half the evaluations, each of as many batches, give its steps back.
pub const LIGHT: Watch = Watch {
    evaluations: 4,
    share: 0.04,
};
/// Evaluations in a row without a new best after which a planned run stops.
pub const EARLY_STOP: u64 = 3;
/// The share of the budget that measuring the ladder may take.
pub const MEASURE_SHARE: f64 = 0.03;
/// The share of the budget that timing dropout's cost may take, for a run given dropout.
pub const DROPOUT_SHARE: f64 = 0.01;
/// Kept back for what follows the last step (the summary, the loss plot) and for steps slower
/// than measured: this share of the budget and half a second. (With 2% and a second, three
/// 2-minute runs of four ended at 94-95% of their budget: BENCHMARKS.md, section 27.)
pub const RESERVE: (f64, f64) = (0.01, 0.5);
/// Warm-up steps, as a share of the steps (the default run's 100 of 880 when the rule was fitted).
pub const WARMUP_SHARE: f64 = 100.0 / 880.0;

impl Shape {
    /// Weights in the transformer blocks (attention 4 d², MLP 8 d² per layer): what the rule
    /// counts, leaving out the embedding and the head, whose size is the vocabulary's.
    pub fn params(&self) -> f64 {
        12.0 * (self.n_layer * self.n_embd * self.n_embd) as f64
    }

    /// Tokens per optimiser step.
    pub fn tokens_per_step(&self) -> usize {
        self.batch_size * self.block_size
    }

    /// This shape with the fields that `fixed` (the flags) sets.
    fn with_fixed(&self, fixed: &Overrides) -> Shape {
        let n_embd = fixed.n_embd.unwrap_or(self.n_embd);
        let n_head = fixed.n_head.unwrap_or(if fixed.n_embd.is_some() {
            heads_for(n_embd)
        } else {
            self.n_head
        });
        Shape {
            n_layer: fixed.n_layer.unwrap_or(self.n_layer),
            n_embd,
            n_head,
            block_size: fixed.block_size.unwrap_or(self.block_size),
            batch_size: fixed.batch_size.unwrap_or(self.batch_size),
        }
    }

    /// `c` with this shape.
    pub fn apply(&self, c: &mut TrainConfig) {
        c.n_layer = self.n_layer;
        c.n_embd = self.n_embd;
        c.n_head = self.n_head;
        c.block_size = self.block_size;
        c.batch_size = self.batch_size;
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} x {} ({} heads), context {}",
            self.n_layer, self.n_embd, self.n_head, self.block_size
        )
    }
}

/// Heads for a width that a flag sets: of 32 up to a width of 128, of 64 above, or one head
/// if those do not divide `n_embd`.
fn heads_for(n_embd: usize) -> usize {
    let head = if n_embd > 128 { 64 } else { 32 };
    if n_embd.is_multiple_of(head) {
        n_embd / head
    } else {
        1
    }
}

/// What measuring found for one shape, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Speed {
    /// One optimiser step.
    pub step: f64,
    /// One batch of an evaluation (forward only).
    pub eval_batch: f64,
    /// Writing one checkpoint.
    pub save: f64,
    /// The sample written at each evaluation (`sample_tokens`; 0 when none is).
    #[serde(default)]
    pub sample: f64,
}

/// A shape and its measured speed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    pub shape: Shape,
    pub speed: Speed,
}

/// What a plan decided: the config's fields, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub shape: Shape,
    pub speed: Speed,
    pub steps: u64,
    pub warmup: u64,
    pub eval_interval: u64,
    pub eval_iters: usize,
    pub checkpoint_interval: u64,
    pub early_stop: u64,
    /// Whether the run is expected to overfit ([`overfits`]): with dropout, [`WATCHED`].
    pub overfit: bool,
    pub dropout: f64,
    /// Epochs of the training split the steps read.
    pub epochs: f64,
    /// Training tokens (repeats discounted) per weight in the blocks.
    pub tokens_per_param: f64,
    /// The rule's target for them at this plan's compute ([`target_tokens_per_param`]).
    pub target: f64,
    /// Seconds the steps, evaluations and checkpoints are expected to take.
    pub seconds: f64,
}

/// Why a budget cannot be planned.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(
        "a time budget of {budget} is too small for this text on this machine: {} went to \
         reading it and measuring, and the smallest model ({shape}) needs {MIN_STEPS} steps of \
         {} and its evaluations. The least that works here is about --time {}; or train \
         without a time budget",
        seconds(*.spent), seconds(*.step), as_flag(*.least)
    )]
    TooSmall {
        budget: crate::config::TimeBudget,
        /// Seconds spent before planning.
        spent: f64,
        shape: Shape,
        /// Seconds a step of `shape`.
        step: f64,
        /// The least budget that works, in seconds.
        least: f64,
    },
    #[error(
        "--time (time_budget) chooses the shape and the schedule: it cannot go with --{0} \
         (give one or the other)"
    )]
    Contradicts(&'static str),
    #[error(
        "--time (time_budget) chooses a new model's shape: a fine-tuning (--init-from) keeps its checkpoint's, \
         so give it --max-iters instead"
    )]
    FineTuning,
    #[error("no shape of the ladder fits this text: {0}")]
    NoShape(String),
    #[error("the speeds injected for a test are not {{\"spent\": s, \"speeds\": [...]}}: {0}")]
    Injected(String),
    #[error(transparent)]
    Train(#[from] TrainError),
}

/// Whether `config` can be planned with the flags `fixed`: asked before anything is written
/// or moved, and again when planning.
pub fn check(config: &TrainConfig, fixed: &Overrides) -> Result<(), PlanError> {
    check_flags(fixed)?;
    if config.init_from.is_some() {
        return Err(PlanError::FineTuning);
    }
    Ok(())
}

/// The flags that a plan sets and that cannot go with `--time`.
fn check_flags(fixed: &Overrides) -> Result<(), PlanError> {
    if fixed.max_iters.is_some() {
        return Err(PlanError::Contradicts("max-iters"));
    }
    if fixed.lr_decay_iters.is_some() {
        return Err(PlanError::Contradicts("lr-decay-iters"));
    }
    Ok(())
}

/// Training tokens with repeats discounted: the first epoch counts whole, each later one
/// `exp(-r / REPEAT_DECAY)` of a new one (r repeats so far), in Muennighoff et al.'s form.
pub fn effective_tokens(tokens: f64, text_tokens: f64) -> f64 {
    if tokens <= text_tokens || text_tokens <= 0.0 {
        return tokens;
    }
    let repeats = tokens / text_tokens - 1.0;
    text_tokens * (1.0 + REPEAT_DECAY * (1.0 - (-repeats / REPEAT_DECAY).exp()))
}

/// Whether a run that reads its text `epochs` times with a model of `params` weights in its
/// blocks is expected to overfit: a model overfits when it reads a text many times and the text
/// is small beside it, so the test is the epochs times the weights per token of text, against
/// [`DROPOUT_AFTER`]. Such a run gets [`DROPOUT`] and is [`WATCHED`].
pub fn overfits(epochs: f64, params: f64, text_tokens: f64) -> bool {
    epochs * params / text_tokens.max(1.0) > DROPOUT_AFTER
}

/// The epochs times weights per token of text up to which a plan trains without dropout.
/// Measured (BENCHMARKS.md, section 27): dropout 0.1 cost 0.05-0.09 of val against none at
/// 0.2-1.1 (2-4.5 epochs of 1-3.5 MB texts), and at 10 minutes a 3.5 MB text read 7.4 times
/// (0.77) under 0.1 ended with its training loss at its val, above a 2-minute run's without; a
/// 0.23 MB text at 28 (7.5 epochs) lost 0.08 without it.
pub const DROPOUT_AFTER: f64 = 4.0;

/// The dropout of a run expected to overfit ([`overfits`]): 0.2 lost to 0.1 at 17-28
/// (BENCHMARKS.md, section 27).
pub const DROPOUT: f64 = 0.1;

/// The rule's target of tokens per weight for a run of `compute` training tokens times
/// weights in the blocks: [`TOKENS_PER_PARAM`] at [`REFERENCE_COMPUTE`], falling as
/// `compute^-TARGET_SLOPE`, never below [`LEAST_TARGET`].
pub fn target_tokens_per_param(compute: f64) -> f64 {
    (TOKENS_PER_PARAM * (compute / REFERENCE_COMPUTE).powf(-TARGET_SLOPE)).max(LEAST_TARGET)
}

/// What a plan is made for: the text's training tokens, and the fields that the flags (or, for
/// `accumulation`, the config) fix.
#[derive(Debug, Clone, Copy)]
pub struct Fixed<'a> {
    pub train_tokens: usize,
    /// Micro-batches per step (`gradient_accumulation_steps`).
    pub accumulation: usize,
    pub flags: &'a Overrides,
}

/// The plan for `candidates` (measured, smallest first) with `seconds_left` for training,
/// evaluating and checkpointing, by the rule of this module's header. `None` when no
/// candidate gets [`MIN_STEPS`].
pub fn choose(seconds_left: f64, candidates: &[Candidate], fixed: Fixed) -> Option<Plan> {
    let plans: Vec<Plan> = candidates
        .iter()
        .filter_map(|c| plan_for(c, seconds_left, fixed, None))
        .collect();
    // Shapes too large for the text only where none is not; then the smallest.
    let fits = |p: &Plan| !too_large(&p.shape, fixed.train_tokens);
    let plans: Vec<Plan> = if plans.iter().any(fits) {
        plans.into_iter().filter(fits).collect()
    } else {
        plans.into_iter().take(1).collect()
    };
    // Shapes short of STEPS_WANTED only where none gets them.
    let enough = plans.iter().any(|p| p.steps >= STEPS_WANTED);
    let plans: Vec<Plan> = plans
        .into_iter()
        .filter(|p| !enough || p.steps >= STEPS_WANTED)
        .collect();
    let nearest = plans
        .iter()
        .min_by(|a, b| a.distance().total_cmp(&b.distance()))?;
    // Where the text, not the time, limits the model (the run nearest the target would
    // overfit), more steps of a smaller model only read the text again: the largest model
    // that the text can use and that gets STEPS_WANTED (of models of one size, the nearest).
    if !(nearest.overfit && enough) {
        return Some(nearest.clone());
    }
    plans.into_iter().max_by(|a, b| {
        (a.shape.params().total_cmp(&b.shape.params())).then(b.distance().total_cmp(&a.distance()))
    })
}

/// What `steps` steps of a candidate cost with their evaluations and checkpoints.
struct Costs<'a> {
    speed: Speed,
    watch: Watch,
    eval_iters: usize,
    flags: &'a Overrides,
}

impl<'a> Costs<'a> {
    /// The costs of `speed` watched by `watch`, with `seconds_left` in all.
    fn new(speed: Speed, watch: Watch, seconds_left: f64, flags: &'a Overrides) -> Self {
        // Batches each evaluation reads per split: as many as fit in the watch's share of the
        // time, from 10 to 100, unless a flag fixes it.
        let eval_iters = flags.eval_iters.unwrap_or_else(|| {
            let fit =
                watch.share * seconds_left / (watch.evaluations as f64 * 2.0 * speed.eval_batch);
            (fit.floor() as usize).clamp(10, 100)
        });
        Costs {
            speed,
            watch,
            eval_iters,
            flags,
        }
    }

    /// Steps between evaluations: the watch's evaluations in the run, unless a flag fixes it.
    fn eval_interval(&self, steps: u64) -> u64 {
        self.flags
            .eval_interval
            .unwrap_or(steps.div_ceil(self.watch.evaluations))
            .max(1)
    }

    /// Steps between writes of latest/: every other evaluation, unless a flag fixes it.
    fn checkpoint_interval(&self, steps: u64) -> u64 {
        self.flags
            .checkpoint_interval
            .unwrap_or(2 * self.eval_interval(steps))
            .max(1)
    }

    /// Seconds of everything but the steps: each evaluation reads `eval_iters` batches of
    /// both splits, writes a sample and (at most) best/; latest/ is written at its interval
    /// and at the end.
    fn overhead(&self, steps: u64) -> f64 {
        let Speed {
            eval_batch,
            save,
            sample,
            ..
        } = self.speed;
        let evals = steps.div_ceil(self.eval_interval(steps)) as f64;
        let saves = (steps / self.checkpoint_interval(steps) + 1) as f64;
        evals * (2.0 * self.eval_iters as f64 * eval_batch + sample + save) + saves * save
    }

    fn seconds(&self, steps: u64) -> f64 {
        steps as f64 * self.speed.step + self.overhead(steps)
    }

    /// The most steps that fit in `seconds`.
    fn steps_within(&self, seconds: f64) -> u64 {
        let (mut lo, mut hi) = (0, (seconds / self.speed.step).max(0.0) as u64 + 1);
        while lo + 1 < hi {
            let mid = (lo + hi) / 2;
            if self.seconds(mid) <= seconds {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }
}

/// `c`'s plan for `seconds_left`, if it gets [`MIN_STEPS`]. Unless `overfit` says so, the run
/// is expected to overfit where its steps, [`LIGHT`]ly watched, would ([`overfits`]); then it
/// gets [`DROPOUT`] and is [`WATCHED`].
fn plan_for(c: &Candidate, seconds_left: f64, fixed: Fixed, overfit: Option<bool>) -> Option<Plan> {
    let flags = fixed.flags;
    let train_tokens = fixed.train_tokens.max(1) as f64;
    let params = c.shape.params();
    let tokens =
        |steps: u64| (steps as usize * c.shape.tokens_per_step() * fixed.accumulation) as f64;
    let overfit = overfit.unwrap_or_else(|| {
        let light = Costs::new(c.speed, LIGHT, seconds_left, flags).steps_within(seconds_left);
        overfits(tokens(light) / train_tokens, params, train_tokens)
    });
    let watch = if overfit { WATCHED } else { LIGHT };
    let costs = Costs::new(c.speed, watch, seconds_left, flags);
    let steps = costs.steps_within(seconds_left);
    if steps < MIN_STEPS {
        return None;
    }
    Some(Plan {
        shape: c.shape,
        speed: c.speed,
        steps,
        warmup: flags
            .warmup_iters
            .unwrap_or(((steps as f64 * WARMUP_SHARE).round() as u64).max(1)),
        eval_interval: costs.eval_interval(steps),
        eval_iters: costs.eval_iters,
        checkpoint_interval: costs.checkpoint_interval(steps),
        early_stop: flags.early_stop.unwrap_or(EARLY_STOP),
        overfit,
        dropout: flags.dropout.unwrap_or(if overfit { DROPOUT } else { 0.0 }),
        epochs: tokens(steps) / train_tokens,
        tokens_per_param: effective_tokens(tokens(steps), train_tokens) / params,
        target: target_tokens_per_param(tokens(steps) * params),
        seconds: costs.seconds(steps),
    })
}

/// The least time that the smallest candidate needs for [`MIN_STEPS`] and its evaluations,
/// on top of what was spent before planning.
fn least_seconds(smallest: &Candidate, flags: &Overrides) -> f64 {
    let costs = Costs {
        speed: smallest.speed,
        watch: WATCHED,
        eval_iters: flags.eval_iters.unwrap_or(10),
        flags,
    };
    costs.seconds(MIN_STEPS)
}

impl Plan {
    /// How far its tokens per weight are from the rule's target, on a log scale.
    pub fn distance(&self) -> f64 {
        (self.tokens_per_param / self.target).ln().abs()
    }

    /// `c` with this plan's shape and schedule.
    pub fn apply(&self, c: &mut TrainConfig) {
        self.shape.apply(c);
        c.max_iters = self.steps;
        c.lr_decay_iters = self.steps;
        c.warmup_iters = self.warmup;
        c.eval_interval = self.eval_interval;
        c.eval_iters = self.eval_iters;
        c.checkpoint_interval = self.checkpoint_interval;
        c.early_stop = self.early_stop;
        c.dropout = self.dropout;
    }

    /// The choice in a sentence, with its reason.
    pub fn describe(&self, text: &str) -> String {
        format!(
            "{text}: {}, {:.2}M weights in the blocks; {} steps of {} windows ({} a step), \
             dropout {}: about {:.1} epochs, {:.1} tokens per weight (the rule's target at this \
             compute is {:.1}); {} evaluations of {} batches, stopping after {} without a new \
             best; about {} of training",
            self.shape,
            self.shape.params() / 1e6,
            group(self.steps),
            self.shape.batch_size,
            seconds(self.speed.step),
            self.dropout,
            self.epochs,
            self.tokens_per_param,
            self.target,
            self.steps.div_ceil(self.eval_interval),
            self.eval_iters,
            self.early_stop,
            seconds(self.seconds),
        )
    }
}

/// `n` with thousands separated: 12,345.
fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Seconds as people write them: 85 ms, 4.2 s, 1m 52s.
pub fn seconds(s: f64) -> String {
    if s < 1.0 {
        format!("{:.0} ms", s * 1e3)
    } else if s < 60.0 {
        format!("{s:.1} s")
    } else {
        let s = s.round() as u64;
        format!("{}m {:02}s", s / 60, s % 60)
    }
}

/// The shapes of the ladder that `config` and `fixed` allow, smallest first: the flags' fields
/// kept, duplicates and shapes whose context does not fit the splits (`shortest` tokens)
/// left out, each valid as a config.
pub fn candidates(config: &TrainConfig, fixed: &Overrides, shortest: usize) -> Vec<Shape> {
    let mut out: Vec<Shape> = Vec::new();
    for s in LADDER.iter().map(|s| s.with_fixed(fixed)) {
        let mut c = config.clone();
        s.apply(&mut c);
        if out.contains(&s) || s.block_size >= shortest || c.validate().is_err() {
            continue;
        }
        out.push(s);
    }
    out
}

/// Steps of each shape run before timing.
const WARM_STEPS: usize = 2;
/// Steps of each shape timed on the way up the ladder, before they are timed side by side.
const MEASURED_STEPS: usize = 3;

/// A shape being timed: its trainer, kept until the measuring ends, and its steps' seconds.
struct Timing {
    shape: Shape,
    trainer: Trainer,
    steps: Vec<f64>,
}

impl Timing {
    /// A trainer of `shape` with `config`'s other settings, its first steps run (they allocate
    /// and warm the caches), then [`MEASURED_STEPS`] timed.
    fn start(
        config: &TrainConfig,
        shape: Shape,
        data: &TrainingData,
        backend: &Backend,
        ops: Ops,
        scratch: &Path,
    ) -> Result<Self, TrainError> {
        let mut c = TrainConfig {
            eval_iters: 2,
            ..config.clone()
        };
        shape.apply(&mut c);
        let trainer =
            Trainer::new(c, backend.clone(), data.clone(), scratch.to_path_buf())?.with_ops(ops);
        let mut t = Timing {
            shape,
            trainer,
            steps: Vec::new(),
        };
        for _ in 0..WARM_STEPS {
            t.trainer.step();
        }
        for _ in 0..MEASURED_STEPS {
            t.step();
        }
        Ok(t)
    }
}

/// What measuring steps and times: a shape's trainer (in tests, a stand-in).
trait Timed {
    /// One step, timed and kept.
    fn step(&mut self);
    /// The seconds of the steps timed so far.
    fn steps(&self) -> &[f64];
    /// Their median: steps on a shared machine are noisy, and a few slow ones made the mean
    /// 7-14% above a run's own (BENCHMARKS.md, section 28).
    fn step_seconds(&self) -> f64 {
        median(&mut self.steps().to_vec())
    }
}

impl Timed for Timing {
    fn step(&mut self) {
        let one = Instant::now();
        self.trainer.step();
        self.steps.push(one.elapsed().as_secs_f64());
    }

    fn steps(&self) -> &[f64] {
        &self.steps
    }
}

/// Steps of each of `timings` in turn, round after round, until the next round would end past
/// `until` seconds after `started`. A host whose speed drifts while it is measured (by a third
/// within minutes here: BENCHMARKS.md, section 30) so slows every shape alike: their steps keep
/// their ratios, and each is the median over the whole time rather than over its own moment.
fn side_by_side<T: Timed>(timings: &mut [T], started: Instant, until: f64) {
    loop {
        let round: f64 = timings.iter().map(T::step_seconds).sum();
        if started.elapsed().as_secs_f64() + round > until {
            return;
        }
        for t in timings.iter_mut() {
            t.step();
        }
    }
}

/// Measures `shapes` on `data` with `config`'s other settings, in two passes within
/// `allowance` seconds. Up the ladder, each shape in turn: a few steps to warm up, a few timed,
/// an evaluation of two batches per split and one checkpoint (into `scratch`, which is
/// removed), and the sample an evaluation writes. It stops before a shape whose steps would
/// take this pass past half the allowance, that is too large for the text
/// ([`MAX_WEIGHTS_PER_TOKEN`]) or that would get under four fifths of [`STEPS_WANTED`] in
/// `seconds_left` where a smaller one gets them all, or after one too slow to get
/// [`MIN_STEPS`]. The first shape is always measured. Then the shapes measured are stepped
/// [`side_by_side`] for the rest of the allowance, and each one's step is the median of all its
/// steps. `say` reports each.
#[allow(clippy::too_many_arguments)]
pub fn measure(
    config: &TrainConfig,
    shapes: &[Shape],
    data: &TrainingData,
    backend: &Backend,
    ops: Ops,
    scratch: &Path,
    allowance: f64,
    seconds_left: f64,
    say: &dyn Fn(String),
) -> Result<Vec<Candidate>, TrainError> {
    let started = Instant::now();
    let mut timings: Vec<Timing> = Vec::new();
    let mut others = Vec::new();
    let text_tokens = data.tokens(Split::Train);
    let gets_min_steps = |t: &Timing| seconds_left / t.step_seconds() >= MIN_STEPS as f64;
    for &shape in shapes {
        if let Some(last) = timings.last() {
            // Shapes only grow along the ladder: none past this one would be chosen.
            if too_large(&shape, text_tokens) {
                break;
            }
            // The next shape's steps, scaled from the last by compute per step.
            let ratio = (shape.params() * shape.tokens_per_step() as f64)
                / (last.shape.params() * last.shape.tokens_per_step() as f64);
            let next = last.step_seconds() * ratio;
            let predicted = (WARM_STEPS + MEASURED_STEPS) as f64 * next;
            if started.elapsed().as_secs_f64() + predicted > allowance / 2.0 {
                break;
            }
            // A shape short of STEPS_WANTED is not chosen where a smaller one gets them, even
            // with the most evaluations ([`WATCHED`]'s share of the time). Larger shapes run
            // faster per weight than the scaling says: a fifth is given for that.
            let steps_in = |step: f64| seconds_left * (1.0 - WATCHED.share) / step;
            let enough = timings
                .iter()
                .any(|t| steps_in(t.step_seconds()) >= STEPS_WANTED as f64);
            if enough && steps_in(next) < 0.8 * STEPS_WANTED as f64 {
                break;
            }
        }
        let t = Timing::start(config, shape, data, backend, ops, scratch)?;
        // An evaluation writes a sample too: timed on its own.
        let clock = Instant::now();
        let _ = t.trainer.sample();
        let sample = clock.elapsed().as_secs_f64();
        let clock = Instant::now();
        let _ = t.trainer.evaluate(&mut (), &AtomicBool::new(false));
        let eval_batch = (clock.elapsed().as_secs_f64() - sample).max(0.0) / 4.0;
        let clock = Instant::now();
        t.trainer.save_checkpoint(crate::storage::names::LATEST)?;
        let save = clock.elapsed().as_secs_f64();
        let (step, last) = (t.step_seconds(), !gets_min_steps(&t));
        say(format!(
            "  {shape}, batch {}: {} a step, {} an evaluation batch, {} a sample, {} a \
             checkpoint",
            shape.batch_size,
            self::seconds(step),
            self::seconds(eval_batch),
            self::seconds(sample),
            self::seconds(save)
        ));
        timings.push(t);
        others.push((eval_batch, save, sample));
        if last {
            break;
        }
    }
    // Side by side, the shapes that may be chosen (the last may be too slow for MIN_STEPS).
    let choosable = timings
        .iter()
        .take_while(|t| gets_min_steps(t))
        .count()
        .max(1);
    side_by_side(&mut timings[..choosable], started, allowance);
    let _ = std::fs::remove_dir_all(scratch);
    let out: Vec<Candidate> = timings
        .iter()
        .zip(others)
        .map(|(t, (eval_batch, save, sample))| Candidate {
            shape: t.shape,
            speed: Speed {
                step: t.step_seconds(),
                eval_batch,
                save,
                sample,
            },
        })
        .collect();
    if timings.len() > 1
        || timings
            .first()
            .is_some_and(|t| t.steps.len() > MEASURED_STEPS)
    {
        say(format!(
            "  side by side, {} steps of each in {}: {}",
            timings[0].steps.len(),
            self::seconds(started.elapsed().as_secs_f64()),
            out.iter()
                .map(|c| format!(
                    "{} x {} {}",
                    c.shape.n_layer,
                    c.shape.n_embd,
                    self::seconds(c.speed.step)
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(out)
}

/// How many times slower a step of `shape` is with `with`'s dropout than with `without`'s
/// (dropout's masks cost time): the two stepped [`side_by_side`] for `allowance` seconds, the
/// median of the ratios of each round's two steps, which see the same host. Timed alone, the
/// shape's step with dropout moved with the host's speed (BENCHMARKS.md, sections 29 and 30).
#[allow(clippy::too_many_arguments)]
pub fn dropout_cost(
    without: &TrainConfig,
    with: &TrainConfig,
    shape: Shape,
    data: &TrainingData,
    backend: &Backend,
    ops: Ops,
    scratch: &Path,
    allowance: f64,
) -> Result<f64, TrainError> {
    let started = Instant::now();
    let mut pair = [
        Timing::start(without, shape, data, backend, ops, scratch)?,
        Timing::start(with, shape, data, backend, ops, scratch)?,
    ];
    side_by_side(&mut pair, started, allowance);
    let _ = std::fs::remove_dir_all(scratch);
    let [without, with] = &pair;
    let mut ratios: Vec<f64> = with
        .steps
        .iter()
        .zip(&without.steps)
        .map(|(w, o)| w / o)
        .collect();
    Ok(median(&mut ratios))
}

/// The middle of `values` (the mean of the two middle ones for an even count).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    (values[(n - 1) / 2] + values[n / 2]) / 2.0
}

/// Plans `config` for its time budget: measures this machine (or, in tests, takes what
/// `CINDER_TEST_SPEEDS` gives: [`Injected`]),
/// chooses, and applies the plan to `config`. `started` is when the program started: the
/// budget counts from there.
#[allow(clippy::too_many_arguments)]
pub fn fit(
    config: &mut TrainConfig,
    fixed: &Overrides,
    data: &TrainingData,
    started: Instant,
    backend: &Backend,
    ops: Ops,
    out: &Path,
    say: &dyn Fn(String),
) -> Result<Plan, PlanError> {
    let budget = config
        .time_budget
        .seconds()
        .expect("fit is called for a run with a budget");
    check(config, fixed)?;
    let shortest = data.tokens(Split::Train).min(data.tokens(Split::Val));
    let shapes = candidates(config, fixed, shortest);
    if shapes.is_empty() {
        let mut c = config.clone();
        LADDER[0].with_fixed(fixed).apply(&mut c);
        let why = match c.validate() {
            Err(e) => e.to_string(),
            Ok(()) => format!("a split has only {shortest} tokens, fewer than any context"),
        };
        return Err(PlanError::NoShape(why));
    }
    let reserve = RESERVE.0 * budget + RESERVE.1;
    let injected = test_speeds()?;
    // Seconds since the program started (for tests, as injected).
    let spent = || {
        injected
            .as_ref()
            .map_or(started.elapsed().as_secs_f64(), |t| t.spent)
    };
    let left = || budget - spent() - reserve;
    let scratch = out.join(crate::storage::names::MEASURING);
    let candidates: Vec<Candidate> = match &injected {
        Some(t) => shapes
            .iter()
            .zip(&t.speeds)
            .map(|(&shape, &speed)| Candidate { shape, speed })
            .collect(),
        None => {
            say(format!(
                "measuring this machine (at most {} of the {} budget):",
                seconds(MEASURE_SHARE * budget),
                config.time_budget
            ));
            measure(
                config,
                &shapes,
                data,
                backend,
                ops,
                &scratch,
                MEASURE_SHARE * budget,
                left(),
                say,
            )?
        }
    };
    let train_tokens = data.tokens(Split::Train);
    let seconds_left = left();
    let within = Fixed {
        train_tokens,
        accumulation: config.gradient_accumulation_steps,
        flags: fixed,
    };
    // Where nothing fits: the least budget that would, from the smallest shape's speed.
    let too_small = |smallest: &Candidate| {
        let spent = spent();
        let needs = least_seconds(smallest, fixed);
        let least = (spent + needs + RESERVE.1) / (1.0 - RESERVE.0 - MEASURE_SHARE - DROPOUT_SHARE);
        PlanError::TooSmall {
            budget: config.time_budget,
            spent,
            shape: smallest.shape,
            step: smallest.speed.step,
            least,
        }
    };
    let Some(plan) = choose(seconds_left, &candidates, within) else {
        return Err(match candidates.first() {
            Some(smallest) => too_small(smallest),
            None => PlanError::NoShape("no shape was measured".into()),
        });
    };
    // Dropout costs time (its masks), and the shapes were measured without it: the shape
    // chosen is timed with and without it side by side, and its steps fitted to the ratio,
    // with the same dropout and evaluations.
    let plan = if injected.is_none() && plan.dropout != config.dropout {
        let mut with = config.clone();
        with.dropout = plan.dropout;
        let allowance = DROPOUT_SHARE * budget;
        let cost = dropout_cost(
            config, &with, plan.shape, data, backend, ops, &scratch, allowance,
        )?;
        let again = Candidate {
            shape: plan.shape,
            speed: Speed {
                step: plan.speed.step * cost,
                ..plan.speed
            },
        };
        say(format!(
            "  with dropout {}, timed beside it for {}: {:.2} times the step, {}",
            plan.dropout,
            seconds(allowance),
            cost,
            seconds(again.speed.step)
        ));
        plan_for(&again, left(), within, Some(plan.overfit)).ok_or_else(|| too_small(&again))?
    } else {
        plan
    };
    let seconds_left = left();
    plan.apply(config);
    let text = format!(
        "{} tokens of text to train on, {} of the budget left",
        group(train_tokens as u64),
        seconds(seconds_left)
    );
    say(format!("chose {}", plan.describe(&text)));
    Ok(plan)
}

/// `seconds` rounded up as `--time` takes it in one word: 45s, 3m.
fn as_flag(seconds: f64) -> String {
    if seconds <= 120.0 {
        format!("{}s", seconds.ceil() as u64)
    } else {
        format!("{}m", (seconds / 60.0).ceil() as u64)
    }
}

/// What `CINDER_TEST_SPEEDS` gives in tests: the seconds spent before planning, and the speeds
/// of the first shapes that would be measured.
#[derive(serde::Deserialize)]
struct Injected {
    spent: f64,
    speeds: Vec<Speed>,
}

/// The speeds and time spent that `CINDER_TEST_SPEEDS` gives (tests only, with the feature
/// `fault-injection`: [`crate::faults`]): measuring is skipped and the clock ignored, so that a
/// plan is the same on any machine.
fn test_speeds() -> Result<Option<Injected>, PlanError> {
    let Some(text) = crate::faults::injected_speeds() else {
        return Ok(None);
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| PlanError::Injected(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for a trainer whose step sleeps `base` seconds on a host that slows as the
    /// test goes on: three times as slow after 0.5 s.
    struct Drifting {
        base: f64,
        since: Instant,
        steps: Vec<f64>,
    }

    impl Timed for Drifting {
        fn step(&mut self) {
            let slower = 1.0 + 4.0 * self.since.elapsed().as_secs_f64();
            let one = Instant::now();
            std::thread::sleep(std::time::Duration::from_secs_f64(self.base * slower));
            self.steps.push(one.elapsed().as_secs_f64());
        }

        fn steps(&self) -> &[f64] {
            &self.steps
        }
    }

    #[test]
    fn shapes_timed_side_by_side_keep_their_ratio_on_a_drifting_host() {
        let since = Instant::now();
        // Steps of a few milliseconds, so that a late wake-up (a busy machine's tenth of a
        // millisecond or two) moves the ratio little.
        let mut pair = [4e-3, 8e-3].map(|base| Drifting {
            base,
            since,
            steps: Vec::new(),
        });
        for d in &mut pair {
            d.step();
        }
        side_by_side(&mut pair, since, 0.6);
        let ratio = pair[1].step_seconds() / pair[0].step_seconds();
        // Timed one after the other, the second would have been timed on a host about twice
        // as slow: a ratio near 4.
        assert!((1.7..2.3).contains(&ratio), "{ratio}");
        assert!(pair[0].steps.len() > 15, "{}", pair[0].steps.len());
        assert_eq!(pair[0].steps.len(), pair[1].steps.len());
        assert!(since.elapsed().as_secs_f64() < 0.8);
    }

    /// A text of `train_tokens` tokens, without accumulation.
    fn on(train_tokens: usize, flags: &Overrides) -> Fixed<'_> {
        Fixed {
            train_tokens,
            accumulation: 1,
            flags,
        }
    }

    fn speeds(steps: &[f64]) -> Vec<Candidate> {
        LADDER
            .iter()
            .zip(steps)
            .map(|(&shape, &step)| Candidate {
                shape,
                speed: Speed {
                    step,
                    eval_batch: step / 4.0,
                    save: 0.02,
                    sample: 0.05,
                },
            })
            .collect()
    }

    #[test]
    fn the_choice_is_a_function_of_text_budget_and_speed() {
        let c = speeds(&[0.01, 0.03, 0.09, 0.25, 0.8, 2.5]);
        let fixed = Overrides::default();
        // The rule's choice for these speeds, worked out by hand: 2 x 96 gets 3,510 steps of
        // 1,024 tokens (105.3 s, and 4.7 s for 4 evaluations of 73 batches, their samples and
        // 3 checkpoints), 3.59 epochs (no dropout, so lightly watched), 15.9 tokens per weight
        // against a target of 9.6 at its 0.8e12 of compute; 3 x 96 would get 1,170 steps, 3.6
        // against 16.7, further on a log scale.
        let a = choose(110.0, &c, on(1_000_000, &fixed)).unwrap();
        assert_eq!(
            (a.shape, a.steps, a.eval_iters),
            (LADDER[1], 3510, 73),
            "{a:?}"
        );
        assert_eq!(a.dropout, 0.0);
        assert_eq!(a.steps.div_ceil(a.eval_interval), LIGHT.evaluations);
        assert!((a.tokens_per_param - 15.878).abs() < 1e-3, "{a:?}");
        assert!((a.target - 9.61).abs() < 1e-2, "{a:?}");
        // A shape nearer the target that gets under STEPS_WANTED loses to one that gets them:
        // 3 x 96 at 0.12 s a step would get 878 steps (2.7 tokens per weight against 21.1),
        // 2 x 96 at 0.01 s 44.6 against 3.9; at 0.1 s a step 3 x 96 gets 1,052 steps, and is
        // chosen (3.2 against 18.2).
        let b = choose(110.0, &speeds(&[0.01, 0.01, 0.12]), on(1_000_000, &fixed)).unwrap();
        assert_eq!(b.shape, LADDER[1], "{b:?}");
        let b = choose(110.0, &speeds(&[0.01, 0.01, 0.1]), on(1_000_000, &fixed)).unwrap();
        assert_eq!((b.shape, b.steps), (LADDER[2], 1052), "{b:?}");
        // More time, or more text, never chooses a smaller model; a slower machine never a
        // larger one.
        let mut last = 0.0;
        for left in [20.0, 60.0, 110.0, 300.0, 600.0, 3600.0] {
            let p = choose(left, &c, on(1_000_000, &fixed)).unwrap();
            assert!(p.shape.params() >= last, "{left} s: {p:?}");
            assert!(p.seconds <= left, "{left} s: {p:?}");
            last = p.shape.params();
        }
        let small = choose(600.0, &c, on(100_000, &fixed)).unwrap();
        let large = choose(600.0, &c, on(20_000_000, &fixed)).unwrap();
        assert!(small.shape.params() <= large.shape.params());
        assert!(small.dropout >= large.dropout);
        let slow: Vec<Candidate> = c
            .iter()
            .map(|c| Candidate {
                speed: Speed {
                    step: c.speed.step * 4.0,
                    ..c.speed
                },
                ..*c
            })
            .collect();
        let p = choose(600.0, &slow, on(1_000_000, &fixed)).unwrap();
        assert!(
            p.shape.params()
                <= choose(600.0, &c, on(1_000_000, &fixed))
                    .unwrap()
                    .shape
                    .params()
        );
    }

    #[test]
    fn a_plan_fills_its_time_and_sets_the_schedule() {
        let c = speeds(&[0.01, 0.03, 0.09, 0.25]);
        let p = choose(110.0, &c, on(1_000_000, &Overrides::default())).unwrap();
        let mut config = TrainConfig::default_run();
        p.apply(&mut config);
        assert_eq!(config.max_iters, p.steps);
        assert_eq!(config.lr_decay_iters, p.steps);
        assert!(p.steps >= MIN_STEPS);
        assert!(
            p.seconds <= 110.0 && p.seconds > 110.0 - p.speed.step,
            "{p:?}"
        );
        assert_eq!(config.early_stop, EARLY_STOP);
        assert_eq!(p.steps.div_ceil(config.eval_interval), LIGHT.evaluations);
        config.validate().unwrap();
    }

    #[test]
    fn flags_fix_their_fields_and_the_shapes_collapse() {
        let fixed = Overrides {
            n_layer: Some(3),
            n_embd: Some(96),
            block_size: Some(32),
            batch_size: Some(8),
            dropout: Some(0.05),
            ..Default::default()
        };
        let config = TrainConfig::default_run();
        let shapes = candidates(&config, &fixed, 1_000);
        assert_eq!(shapes, vec![shape(3, 96, 3, 32, 8)]);
        let c: Vec<Candidate> = shapes
            .iter()
            .map(|&shape| Candidate {
                shape,
                speed: Speed {
                    step: 0.02,
                    eval_batch: 0.005,
                    save: 0.01,
                    sample: 0.0,
                },
            })
            .collect();
        let p = choose(60.0, &c, on(1_000_000, &fixed)).unwrap();
        assert_eq!((p.shape, p.dropout), (shapes[0], 0.05));
        // A context longer than a split leaves the shape out.
        assert!(candidates(&config, &Overrides::default(), 100).len() < LADDER.len());
        assert!(
            check_flags(&Overrides {
                max_iters: Some(10),
                ..Default::default()
            })
            .is_err()
        );
    }

    #[test]
    fn accumulation_counts_in_the_epochs() {
        let c = speeds(&[0.01]);
        let flags = Overrides::default();
        let one = choose(60.0, &c, on(100_000, &flags)).unwrap();
        let four = choose(
            60.0,
            &c,
            Fixed {
                accumulation: 4,
                ..on(100_000, &flags)
            },
        )
        .unwrap();
        assert_eq!(one.steps, four.steps);
        assert!((four.epochs - 4.0 * one.epochs).abs() < 1e-9, "{four:?}");
    }

    #[test]
    fn fixed_intervals_count_in_the_time() {
        let c = speeds(&[0.01]);
        let every_10 = Overrides {
            eval_interval: Some(10),
            ..Default::default()
        };
        let free = choose(60.0, &c, on(1_000_000, &Overrides::default())).unwrap();
        let often = choose(60.0, &c, on(1_000_000, &every_10)).unwrap();
        assert!(often.steps < free.steps / 2, "{often:?} {free:?}");
        assert!(often.seconds <= 60.0, "{often:?}");
    }

    #[test]
    fn the_target_falls_with_compute_to_its_floor() {
        assert!((target_tokens_per_param(REFERENCE_COMPUTE) - TOKENS_PER_PARAM).abs() < 1e-12);
        // About 2 at 5.5e12 (the ten-minute grids), and no lower beyond.
        assert!((target_tokens_per_param(5.5e12) - 2.0).abs() < 0.05);
        assert_eq!(target_tokens_per_param(1e15), LEAST_TARGET);
        let mut last = f64::INFINITY;
        for compute in [1e10, 1e11, 1e12, 3e12, 1e13, 1e14] {
            let t = target_tokens_per_param(compute);
            assert!(t <= last && t >= LEAST_TARGET, "{compute}: {t}");
            last = t;
        }
    }

    /// ru's speeds as measured on one core (BENCHMARKS.md, section 27: seconds a step, an
    /// evaluation batch, a sample, a checkpoint).
    fn one_core() -> Vec<Candidate> {
        let measured = [
            (0.012, 0.003, 0.006, 0.005),
            (0.026, 0.006, 0.007, 0.008),
            (0.040, 0.009, 0.013, 0.009),
            (0.068, 0.013, 0.023, 0.020),
            (0.118, 0.026, 0.033, 0.016),
            (0.332, 0.071, 0.070, 0.033),
        ];
        LADDER
            .iter()
            .zip(measured)
            .map(|(&shape, (step, eval_batch, sample, save))| Candidate {
                shape,
                speed: Speed {
                    step,
                    eval_batch,
                    save,
                    sample,
                },
            })
            .collect()
    }

    #[test]
    fn a_longer_budget_buys_a_larger_model_with_fewer_tokens_per_weight() {
        // ru's 1,825,659 training characters.
        let c = one_core();
        let flags = Overrides::default();
        // Worked out by hand: in 112 s, 3 x 96 at context 128 gets 2,685 steps, 8.3 tokens per
        // weight against a target of 8.6; in 575 s, 4 x 192 gets 1,662, 1.9 against 2.0.
        let two = choose(112.0, &c, on(1_825_659, &flags)).unwrap();
        let ten = choose(575.0, &c, on(1_825_659, &flags)).unwrap();
        assert_eq!((two.shape, two.steps), (LADDER[2], 2685), "{two:?}");
        assert_eq!((ten.shape, ten.steps), (LADDER[5], 1662), "{ten:?}");
        assert!(ten.tokens_per_param < two.tokens_per_param / 3.0);
        assert_eq!((two.dropout, ten.dropout), (0.0, 0.0));
    }

    #[test]
    fn no_model_is_larger_than_its_text_can_use() {
        let c = one_core();
        let flags = Overrides::default();
        // de_witze's 204,596 training characters: in ten minutes the target alone would choose
        // 4 x 192 (1.77M weights, 8.6 a token of text); the cap keeps 3 x 96 (0.33M, 1.6).
        let ten = choose(575.0, &c, on(204_596, &flags)).unwrap();
        assert_eq!(ten.shape, LADDER[2], "{ten:?}");
        assert!(!too_large(&ten.shape, 204_596));
        assert!(too_large(&LADDER[3], 204_596));
        let uncapped = plan_for(&c[5], 575.0, on(204_596, &flags), None).unwrap();
        assert!(
            uncapped.distance() < ten.distance(),
            "{uncapped:?}\n{ten:?}"
        );
        // A text too small for every shape gets the smallest.
        let tiny = choose(575.0, &c, on(5_000, &flags)).unwrap();
        assert_eq!(tiny.shape, LADDER[0], "{tiny:?}");
    }

    #[test]
    fn a_text_that_limits_the_model_gets_the_largest_shape_it_can_use() {
        // de_witze at two minutes on a slow host (BENCHMARKS.md, section 30): the target is
        // nearest 2 x 96's steps, which overfit; 3 x 96, the largest under the cap (3 x 128
        // is over it), gets its 1,000 steps and is chosen.
        let c = speeds(&[0.019, 0.038, 0.058, 0.1]);
        let flags = Overrides::default();
        let p = choose(114.0, &c, on(204_596, &flags)).unwrap();
        assert_eq!(p.shape, LADDER[2], "{p:?}");
        assert!(p.overfit && p.steps >= STEPS_WANTED, "{p:?}");
        let nearest = plan_for(&c[1], 114.0, on(204_596, &flags), None).unwrap();
        assert!(nearest.distance() < p.distance(), "{nearest:?}\n{p:?}");
        // A larger text, which the same runs would not overfit, keeps the nearest.
        let large = choose(114.0, &c, on(20_000_000, &flags)).unwrap();
        assert!(!large.overfit, "{large:?}");
        assert_eq!(large.shape, LADDER[1], "{large:?}");
    }

    #[test]
    fn a_text_small_beside_the_model_gets_dropout_and_is_watched() {
        let flags = Overrides::default();
        let p = choose(60.0, &speeds(&[0.01]), on(100_000, &flags)).unwrap();
        assert!(p.overfit, "{p:?}");
        assert_eq!(p.dropout, DROPOUT);
        assert_eq!(p.steps.div_ceil(p.eval_interval), WATCHED.evaluations);
        // A flag's dropout stands; the evaluations still follow the text.
        let fixed = Overrides {
            dropout: Some(0.0),
            ..Default::default()
        };
        let q = choose(60.0, &speeds(&[0.01]), on(100_000, &fixed)).unwrap();
        assert_eq!((q.dropout, q.steps), (0.0, p.steps));
        let r = choose(60.0, &speeds(&[0.01]), on(100_000_000, &flags)).unwrap();
        assert_eq!((r.overfit, r.dropout), (false, 0.0));
        assert_eq!(r.steps.div_ceil(r.eval_interval), LIGHT.evaluations);
    }

    #[test]
    fn too_little_time_gets_no_plan() {
        let c = speeds(&[0.01, 0.03]);
        assert!(choose(2.0, &c, on(1_000_000, &Overrides::default())).is_none());
    }

    #[test]
    fn repeats_count_less() {
        assert_eq!(effective_tokens(5e5, 1e6), 5e5);
        let two = effective_tokens(2e6, 1e6);
        assert!(two < 2e6 && two > 1.9e6, "{two}");
        let many = effective_tokens(1e9, 1e6);
        assert!(many < (REPEAT_DECAY + 1.1) * 1e6, "{many}");
    }

    #[test]
    fn budgets_parse_and_print() {
        use crate::config::TimeBudget;
        let b: TimeBudget = "10m".parse().unwrap();
        assert_eq!(b.seconds(), Some(600.0));
        assert_eq!(b.to_string(), "10m");
        assert_eq!("90s".parse::<TimeBudget>().unwrap().seconds(), Some(90.0));
        assert_eq!(
            "1h 30m".parse::<TimeBudget>().unwrap().seconds(),
            Some(5400.0)
        );
        assert_eq!("off".parse::<TimeBudget>().unwrap(), TimeBudget::OFF);
        assert_eq!("0".parse::<TimeBudget>().unwrap(), TimeBudget::OFF);
        let e = "ten minutes".parse::<TimeBudget>().unwrap_err();
        assert!(e.contains("10m"), "{e}");
        // No time is no budget to plan with, not "off" in silence.
        for zero in ["0s", "0m"] {
            let e = zero.parse::<TimeBudget>().unwrap_err();
            assert!(e.contains("no time") && e.contains("off"), "{e}");
        }
        assert_eq!(group(1234567), "1,234,567");
        // In a config file: a duration, or seconds.
        #[derive(serde::Deserialize)]
        struct File {
            time_budget: TimeBudget,
        }
        let read = |text: &str| toml::from_str::<File>(text).map(|f| f.time_budget);
        assert_eq!(read("time_budget = \"2m\"").unwrap().seconds(), Some(120.0));
        assert_eq!(read("time_budget = 90").unwrap().seconds(), Some(90.0));
        assert_eq!(read("time_budget = \"off\"").unwrap(), TimeBudget::OFF);
        assert!(read("time_budget = \"soon\"").is_err());
    }
}
