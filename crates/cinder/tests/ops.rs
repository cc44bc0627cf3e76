//! The fused layers against the composite ones in whole training runs: the same loss, the same
//! gradients, the same path; results that do not depend on the thread count; dropout on the
//! fused path; and checkpoints written before the fused layers existed.

mod common;

use std::path::Path;
use std::sync::atomic::AtomicBool;

use burn::module::{ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use cinder::config::{OptimizerKind, TrainConfig};
use cinder::data::batch_tensors;
use cinder::run::report::{EvalReport, Observer, StepReport};
use cinder::run::trainer::Trainer;
use cinder::storage::checkpoint;
use cinder_data::{Batcher, Split};
use cinder_model::{DropoutKey, Gpt, Ops, Position};
use common::{serial, tiny_config};

fn trainer(config: TrainConfig, dir: &Path, ops: Ops) -> Trainer {
    common::new_trainer(config, dir, "run")
        .unwrap()
        .with_ops(ops)
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

/// Loss and gradients of one batch with the fused and the composite layers agree, for a model
/// whose biases and LayerNorm parameters are no longer at their initial values.
fn check_gradients(config: TrainConfig) {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let config = TrainConfig {
        learning_rate: 1e-2,
        warmup_iters: 0,
        ..config
    };
    let mut t = trainer(config.clone(), dir.path(), Ops::Composite);
    for _ in 0..3 {
        t.step();
    }
    let model = t.model().clone();
    let device = t.backend().device.clone().autodiff();
    let batch = Batcher::new(7, config.batch_size, config.block_size).batch(
        t.splits().get(Split::Train),
        Split::Train,
        0,
        99,
    );
    let grads = |ops| {
        let model = model.clone().with_ops(ops);
        let (x, y) = batch_tensors(&batch, &device);
        let loss = model.loss(x, y, None);
        let value = loss.clone().into_scalar::<f32>();
        (
            value,
            flat(
                &model,
                &GradientsParams::from_grads(loss.backward(), &model),
            ),
        )
    };
    let (fused_loss, fused) = grads(Ops::Fused);
    let (composite_loss, composite) = grads(Ops::Composite);
    assert!(
        (fused_loss - composite_loss).abs() < 1e-5,
        "loss: fused {fused_loss}, composite {composite_loss}"
    );
    assert_eq!(fused.len(), composite.len());
    for ((name, dims, a), (_, _, b)) in fused.iter().zip(&composite) {
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
fn loss_and_gradients_match_the_composite_layers() {
    check_gradients(tiny_config());
}

#[test]
fn loss_and_gradients_match_the_composite_layers_without_biases() {
    check_gradients(TrainConfig {
        bias: false,
        n_head: 4,
        ..tiny_config()
    });
}

#[test]
fn loss_and_gradients_match_on_sequences_shorter_than_the_context() {
    check_gradients(TrainConfig {
        block_size: 5,
        batch_size: 3,
        ..tiny_config()
    });
}

#[test]
fn loss_and_gradients_match_with_grouped_query_attention() {
    // Two query heads per key/value head, and one key/value head for all four (multi-query),
    // with the speedrun's rotary positions and QK-norm on both; over several attention blocks.
    for (n_kv_head, block_size) in [(2, 16), (1, 70)] {
        check_gradients(TrainConfig {
            n_head: 4,
            n_kv_head,
            block_size,
            batch_size: 2,
            position: Position::Rope,
            qk_norm: true,
            ..tiny_config()
        });
    }
}

#[test]
fn loss_and_gradients_match_over_several_attention_blocks() {
    // The fused attention works in blocks of 64 queries against the keys they may see.
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
    fn step(&mut self, s: &StepReport, eval: Option<&EvalReport>) {
        self.0.push(s.loss);
        self.1.extend(eval.map(|e| (e.train_loss, e.val_loss)));
    }
}

fn run(config: &TrainConfig, ops: Ops) -> (Losses, Vec<Vec<f32>>) {
    let dir = tempfile::tempdir().unwrap();
    let mut t = trainer(config.clone(), dir.path(), ops);
    let mut losses = Losses::default();
    t.run(&mut losses, &AtomicBool::new(false)).unwrap();
    (losses, common::weights(t.model()))
}

#[test]
fn a_fused_run_follows_the_composite_run_at_dropout_0() {
    // Gradient accumulation and clipping included.
    let config = TrainConfig {
        max_iters: 12,
        gradient_accumulation_steps: 2,
        grad_clip: 0.5,
        eval_interval: 100,
        checkpoint_interval: 100,
        ..tiny_config()
    };
    let _serial = serial();
    let (composite, _) = run(&config, Ops::Composite);
    let (fused, _) = run(&config, Ops::Fused);
    assert_eq!(composite.0.len(), 12);
    // Tolerance: float rounding differs between the two, and grows over 12 steps.
    for (i, (a, b)) in fused.0.iter().zip(&composite.0).enumerate() {
        assert!(
            (a - b).abs() < 1e-4,
            "iteration {i}: fused {a}, composite {b}"
        );
    }
    assert!(
        composite.0[11] < composite.0[0] - 0.3,
        "the run learns: {:?}",
        composite.0
    );
    assert_eq!((fused.1.len(), composite.1.len()), (1, 1));
    let ((ft, fv), (ct, cv)) = (fused.1[0], composite.1[0]);
    assert!(
        (ft - ct).abs() < 1e-4 && (fv - cv).abs() < 1e-4,
        "eval: fused {:?}, composite {:?}",
        fused.1,
        composite.1
    );
}

#[test]
fn results_do_not_depend_on_the_number_of_threads() {
    let _serial = serial();
    // Dropout included: its masks must not depend on the threads either. Muon's matrix
    // products too, and NorMuon's sums.
    let optimizers = [
        (OptimizerKind::Adamw, 0.0),
        (OptimizerKind::Muon, 0.0),
        (OptimizerKind::Muon, 0.9),
    ];
    for (optimizer, muon_beta2) in optimizers {
        let config = TrainConfig {
            max_iters: 6,
            dropout: 0.1,
            gradient_accumulation_steps: 2,
            eval_interval: 3,
            optimizer,
            muon_beta2,
            ..tiny_config()
        };
        let on = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| run(&config, Ops::Fused))
        };
        let (one, w1) = on(1);
        let (two, w2) = on(2);
        let (three, w3) = on(3);
        assert_eq!(
            one.0, two.0,
            "{optimizer}: training losses, 1 and 2 threads"
        );
        assert_eq!(
            one.0, three.0,
            "{optimizer}: training losses, 1 and 3 threads"
        );
        assert_eq!(one.1, two.1, "{optimizer}: evaluations, 1 and 2 threads");
        assert!(
            w1 == w2 && w1 == w3,
            "{optimizer}: the weights differ between thread counts"
        );
    }
}

#[test]
fn dropout_runs_on_the_fused_layers_and_depends_only_on_the_seed() {
    let _serial = serial();
    let config = |dropout, seed| TrainConfig {
        max_iters: 4,
        dropout,
        seed,
        eval_interval: 100,
        checkpoint_interval: 100,
        ..tiny_config()
    };
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        trainer(config(0.2, 1), dir.path(), Ops::Fused).ops().name(),
        "fused"
    );
    let (a, _) = run(&config(0.2, 1), Ops::Fused);
    let (b, _) = run(&config(0.2, 1), Ops::Fused);
    let (none, _) = run(&config(0.0, 1), Ops::Fused);
    assert_eq!(a.0, b.0, "the same seed gives the same masks");
    // At step 0 the weights are the seed's either way: only the masks differ from no dropout.
    assert_ne!(a.0[0], none.0[0], "dropout changes the loss");
    // The composite layers train with dropout too, with Burn's masks.
    let (c, _) = run(&config(0.2, 1), Ops::Composite);
    assert!(c.0.iter().all(|l| l.is_finite()) && c.0[0] != none.0[0]);

    // The masks alone: one model and one batch, and only the dropout key changed (another run
    // seed would change the weights and the batches too). The fused masks do not come from the
    // device's generator: reseeding it changes nothing.
    let c = config(0.2, 1);
    let t = trainer(c.clone(), dir.path(), Ops::Fused);
    let device = t.backend().device.clone().autodiff();
    let tokens = t.splits().get(Split::Train);
    let batch = Batcher::new(c.seed, c.batch_size, c.block_size).batch(tokens, Split::Train, 0, 0);
    let loss = |seed, draw| {
        let (x, y) = batch_tensors(&batch, &device);
        let key = DropoutKey { seed, draw };
        t.model().loss(x, y, Some(key)).into_scalar::<f32>()
    };
    let key_1 = loss(1, 0);
    device.seed(99);
    assert_eq!(loss(1, 0), key_1, "the same key, the same masks");
    assert_ne!(loss(2, 0), key_1, "another seed, other masks");
    assert_ne!(loss(1, 1), key_1, "another draw, other masks");
}

/// `first` trains to iteration 6 and writes its checkpoint; `second` resumes it to 12. Their
/// losses against a straight 12-iteration run with the fused layers.
fn switch_ops(first: Ops, second: Ops) -> (Vec<f32>, Vec<f32>) {
    let config = TrainConfig {
        max_iters: 12,
        eval_interval: 100,
        checkpoint_interval: 100,
        ..tiny_config()
    };
    let stop = AtomicBool::new(false);
    let (straight, _) = run(&config, Ops::Fused);
    let dir = tempfile::tempdir().unwrap();
    let mut halves = Losses::default();
    let half = TrainConfig {
        max_iters: 6,
        ..config.clone()
    };
    trainer(half, dir.path(), first)
        .run(&mut halves, &stop)
        .unwrap();
    let ckpt = dir.path().join("run").join(cinder::storage::names::LATEST);
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
    .with_ops(second);
    assert_eq!(t.iter(), 6);
    t.run(&mut halves, &stop).unwrap();
    (straight.0, halves.0)
}

#[test]
fn a_checkpoint_written_with_either_layers_resumes_on_the_other() {
    let _serial = serial();
    for (first, second) in [(Ops::Fused, Ops::Composite), (Ops::Composite, Ops::Fused)] {
        let (straight, halves) = switch_ops(first, second);
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
fn text_loss_with_the_fused_layers_matches_the_composite_ones() {
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
    let loss = |ops| {
        cinder::run::eval::text_loss(&model.clone().with_ops(ops), &ids, 3, &device, |_, _| {})
    };
    let (fused, composite) = (loss(Ops::Fused), loss(Ops::Composite));
    assert_eq!(fused.predicted, composite.predicted);
    assert!(
        (fused.loss - composite.loss).abs() < 1e-5,
        "fused {}, composite {}",
        fused.loss,
        composite.loss
    );
}

/// The metrics file's training losses by iteration.
fn losses_in(metrics: &Path) -> Vec<(u64, f32)> {
    std::fs::read_to_string(metrics)
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| {
            let mut f = l.split(',');
            (
                f.next().unwrap().parse().unwrap(),
                f.next().unwrap().parse().unwrap(),
            )
        })
        .collect()
}

/// Resumes the run of the fixture folder `name` (see its README) from its checkpoint to
/// iteration 8, and compares each training loss this run produced with the fixture's run
/// trained straight through, to `tolerance`.
fn resumes_on_the_same_path(name: &str, tolerance: f32) {
    let _serial = serial();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    std::fs::create_dir_all(run.join("latest")).unwrap();
    for f in [
        "config.toml",
        "metrics.csv",
        "latest/meta.json",
        "latest/model.bpk",
        "latest/optimizer.bpk",
    ] {
        std::fs::copy(fixture.join("run").join(f), run.join(f)).unwrap();
    }
    std::fs::copy(fixture.join("text.txt"), dir.path().join("text.txt")).unwrap();
    assert_cmd::Command::cargo_bin("train")
        .unwrap()
        .current_dir(dir.path())
        .args([
            "--resume",
            "run",
            "--data",
            "text.txt",
            "--max-iters",
            "8",
            "--quiet",
        ])
        .assert()
        .success();
    // Rows up to the checkpoint's iteration are the fixture's own, copied: compare only the
    // rows this run produced.
    let from = checkpoint::load_meta(&fixture.join("run/latest"))
        .unwrap()
        .iter;
    let resumed = losses_in(&run.join("metrics.csv"));
    let straight = losses_in(&fixture.join("straight_metrics.csv"));
    assert_eq!(resumed.len(), 8, "{name}: {resumed:?}");
    let produced: Vec<_> = resumed.iter().filter(|(i, _)| *i > from).collect();
    assert_eq!(produced.len(), 4, "{name}: {resumed:?}");
    for (i, a) in produced {
        let (j, b) = straight[*i as usize - 1];
        assert_eq!(*i, j);
        assert!(
            (a - b).abs() <= tolerance,
            "{name}, iteration {i}: resumed {a}, straight {b}"
        );
    }
}

/// Iterations 5 to 8 run on the fused layers after loading weights and AdamW state written
/// by the old engine (format 1); a lost optimizer state or a misread weight would be far off.
#[test]
fn a_checkpoint_from_before_the_fused_layers_resumes_on_the_same_path() {
    resumes_on_the_same_path("before_fused", 1e-4);
}

/// A format-3 checkpoint names none of the model options: it must load as the model it was
/// (learned positions, LayerNorm, GELU, a tied head, AdamW) and continue bit for bit, whatever
/// the default recipe has become.
#[test]
fn a_format_3_checkpoint_resumes_bit_for_bit_as_the_model_it_was() {
    resumes_on_the_same_path("format3", 0.0);
}
