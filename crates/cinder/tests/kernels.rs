//! The hand-written kernels against Burn's autodiff: the same loss, the same gradients, the same
//! training run, on tiny models.

mod common;

use std::sync::atomic::AtomicBool;

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use cinder::checkpoint;
use cinder::config::TrainConfig;
use cinder::data::batch_tensors;
use cinder::kernels::{Engine, KernelStep};
use cinder::loss::cross_entropy;
use cinder::train::{Observer, StepReport, TrainError, Trainer};
use cinder_data::{Batcher, Split};
use cinder_model::Gpt;
use common::{serial, tiny_config};

fn trainer(
    config: TrainConfig,
    dir: &std::path::Path,
    engine: Engine,
) -> Result<Trainer, TrainError> {
    common::new_trainer(config, dir, "run")?.with_engine(engine)
}

/// Every parameter's gradient in `grads`, in `model`'s visiting order, flattened.
fn flat(model: &Gpt, grads: &GradientsParams) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    struct Collect<'a>(&'a GradientsParams, Vec<(String, Vec<usize>, Vec<f32>)>);
    impl ModuleVisitor for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            let g = self
                .0
                .get::<D>(p.id)
                .expect("every parameter has a gradient");
            let dims = g.dims().to_vec();
            let name = format!("parameter {} {:?}", self.1.len(), dims);
            self.1
                .push((name, dims, g.into_data().try_to_vec::<f32>().unwrap()));
        }
    }
    let mut c = Collect(grads, Vec::new());
    model.visit(&mut c);
    c.1
}

/// Loss and gradients of one batch from both engines agree, for a model whose biases and
/// LayerNorm parameters are no longer at their initial values.
fn check_gradients(config: TrainConfig) {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let mut t = trainer(
        TrainConfig {
            learning_rate: 1e-2,
            warmup_iters: 0,
            ..config.clone()
        },
        dir.path(),
        Engine::Burn,
    )
    .unwrap();
    for _ in 0..3 {
        t.step();
    }
    let model = t.model().clone();
    let device = t.backend.device.clone();
    let batch = Batcher::new(7, config.batch_size, config.block_size).batch(
        t.splits.get(Split::Train),
        Split::Train,
        0,
        99,
    );

    let (x, y) = batch_tensors(&batch, &device.clone().autodiff());
    let loss = cross_entropy(model.forward(x), y);
    let burn_loss = loss.clone().into_scalar::<f32>();
    let burn = flat(
        &model,
        &GradientsParams::from_grads(loss.backward(), &model),
    );

    let mut step = KernelStep::new(&model, &t.optim, &config).unwrap();
    let (kernel_loss, grads) = step.gradients(&model, std::slice::from_ref(&batch), &device);
    let ours = flat(&model, &grads);

    assert!(
        (kernel_loss - burn_loss).abs() < 1e-5,
        "loss: kernels {kernel_loss}, burn {burn_loss}"
    );
    assert_eq!(ours.len(), burn.len());
    for ((name, dims, a), (_, _, b)) in ours.iter().zip(&burn) {
        // Column by column (a column of a linear weight is one output unit: the query, key and
        // value parts of c_attn are judged apart), relative to the column's size.
        let cols = if dims.len() == 2 { dims[1] } else { 1 };
        for j in 0..cols {
            let col = |v: &[f32]| v.iter().skip(j).step_by(cols).copied().collect::<Vec<_>>();
            let (x, y) = (col(a), col(b));
            let norm = |v: &[f32]| v.iter().map(|e| e * e).sum::<f32>().sqrt();
            let diff: Vec<f32> = x.iter().zip(&y).map(|(p, q)| p - q).collect();
            assert!(
                norm(&diff) <= 1e-8 + 1e-3 * norm(&y),
                "{name}, column {j}: difference {} for a gradient of size {}",
                norm(&diff),
                norm(&y)
            );
        }
    }
}

#[test]
fn loss_and_gradients_match_burn_autodiff() {
    check_gradients(tiny_config());
}

#[test]
fn loss_and_gradients_match_burn_autodiff_without_biases() {
    check_gradients(TrainConfig {
        bias: false,
        n_head: 4,
        ..tiny_config()
    });
}

#[test]
fn loss_and_gradients_match_burn_autodiff_on_sequences_shorter_than_the_context() {
    // block_size is the model's; the kernels' tape is sized for the batch actually drawn.
    check_gradients(TrainConfig {
        block_size: 5,
        batch_size: 3,
        ..tiny_config()
    });
}

#[test]
fn loss_and_gradients_match_burn_autodiff_over_several_attention_blocks() {
    // The kernels compute attention in blocks of 64 queries against the keys they may see.
    check_gradients(TrainConfig {
        block_size: 150,
        batch_size: 2,
        n_layer: 1,
        ..tiny_config()
    });
}

/// Every step's loss, and every evaluation's (train, val) losses.
#[derive(Default)]
struct Losses(Vec<f32>, Vec<(f32, f32)>);
impl Observer for Losses {
    fn step(&mut self, s: &StepReport, eval: Option<&cinder::train::EvalReport>) {
        self.0.push(s.loss);
        self.1.extend(eval.map(|e| (e.train_loss, e.val_loss)));
    }
}

#[test]
fn a_run_on_the_kernels_follows_the_same_path_as_on_burn() {
    // Gradient accumulation and clipping included; the optimizer is Burn's in both.
    let config = TrainConfig {
        max_iters: 12,
        gradient_accumulation_steps: 2,
        grad_clip: 0.5,
        eval_interval: 100,
        checkpoint_interval: 100,
        ..tiny_config()
    };
    let _serial = serial();
    let stop = AtomicBool::new(false);
    let run = |engine| {
        let dir = tempfile::tempdir().unwrap();
        let mut t = trainer(config.clone(), dir.path(), engine).unwrap();
        let mut losses = Losses::default();
        t.run(&mut losses, &stop).unwrap();
        (t.engine_name(), losses)
    };
    let (burn_name, burn) = run(Engine::Burn);
    let (kernel_name, kernels) = run(Engine::Kernels);
    assert_eq!((burn_name, kernel_name), ("burn", "kernels"));
    assert_eq!(burn.0.len(), 12);
    for (i, (a, b)) in kernels.0.iter().zip(&burn.0).enumerate() {
        assert!((a - b).abs() < 1e-4, "iteration {i}: kernels {a}, burn {b}");
    }
    assert!(burn.0[11] < burn.0[0] - 0.3, "the run learns: {:?}", burn.0);
    // The final evaluation, which the kernels also compute themselves.
    assert_eq!((kernels.1.len(), burn.1.len()), (1, 1));
    let ((kt, kv), (bt, bv)) = (kernels.1[0], burn.1[0]);
    assert!(
        (kt - bt).abs() < 1e-4 && (kv - bv).abs() < 1e-4,
        "eval: kernels {:?}, burn {:?}",
        kernels.1,
        burn.1
    );
}

/// `first` trains to iteration 6 and writes its checkpoint; `second` resumes it to 12. Their
/// losses against a straight 12-iteration run on the kernels.
fn switch_engines(first: Engine, second: Engine) -> (Vec<f32>, Vec<f32>) {
    let config = TrainConfig {
        max_iters: 12,
        eval_interval: 100,
        checkpoint_interval: 100,
        ..tiny_config()
    };
    let stop = AtomicBool::new(false);
    let dir = tempfile::tempdir().unwrap();
    let mut straight = Losses::default();
    trainer(config.clone(), dir.path(), Engine::Kernels)
        .unwrap()
        .run(&mut straight, &stop)
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let mut halves = Losses::default();
    let half = TrainConfig {
        max_iters: 6,
        ..config.clone()
    };
    let mut t = trainer(half, dir.path(), first).unwrap();
    t.run(&mut halves, &stop).unwrap();
    let ckpt = dir.path().join("run").join(cinder::train::LATEST);
    let meta = checkpoint::load_meta(&ckpt).unwrap();
    let data = common::training_data(&meta.data_path, &config);
    let mut t = Trainer::resume(
        &ckpt,
        &meta,
        config.clone(),
        common::backend(),
        data,
        dir.path().join("run"),
    )
    .unwrap()
    .with_engine(second)
    .unwrap();
    assert_eq!(t.iter, 6);
    t.run(&mut halves, &stop).unwrap();
    (straight.0, halves.0)
}

#[test]
fn a_checkpoint_written_by_either_engine_resumes_on_the_other() {
    let _serial = serial();
    for (first, second) in [
        (Engine::Kernels, Engine::Burn),
        (Engine::Burn, Engine::Kernels),
    ] {
        let (straight, halves) = switch_engines(first, second);
        assert_eq!(halves.len(), 12);
        for (i, (a, b)) in halves.iter().zip(&straight).enumerate() {
            // AdamW's state carried over: a fresh optimizer would be far off from iteration 6.
            assert!(
                (a - b).abs() < 1e-4,
                "{first:?} then {second:?}, iteration {i}: {a} against {b}"
            );
        }
    }
}

#[test]
fn auto_uses_the_kernels_without_dropout_and_burn_with_it() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let t = trainer(tiny_config(), dir.path(), Engine::Auto).unwrap();
    assert_eq!(t.engine_name(), "kernels");
    let with_dropout = TrainConfig {
        dropout: 0.1,
        ..tiny_config()
    };
    let t = trainer(with_dropout.clone(), dir.path(), Engine::Auto).unwrap();
    assert_eq!(t.engine_name(), "burn");
    let err = trainer(with_dropout, dir.path(), Engine::Kernels)
        .err()
        .unwrap();
    let msg = err.to_string();
    assert!(
        msg.contains("dropout") && msg.contains("--engine burn"),
        "{msg}"
    );
}

#[test]
fn text_loss_on_the_kernels_matches_burn() {
    let _serial = serial();
    let device = common::backend().device;
    device.seed(11);
    let model = cinder_model::GptConfig::new(20, 16)
        .with_n_layer(2)
        .with_n_head(2)
        .with_n_embd(32)
        .init(&device)
        .unwrap();
    // 7 windows of 16 in batches of 3: the last batch is partial.
    let ids: Vec<u32> = (0..7 * 16 + 5).map(|i| (i * 7 % 20) as u32).collect();
    let burn = cinder::eval::text_loss(&model, &ids, 3, &device, |_, _| {});
    let ours = cinder::kernels::text_loss(&model, &ids, 3, |_, _| {});
    assert_eq!(ours.predicted, burn.predicted);
    assert!(
        (ours.loss - burn.loss).abs() < 1e-5,
        "kernels {}, burn {}",
        ours.loss,
        burn.loss
    );
}
