//! The training loop, checkpoints and resume, through the library on a tiny model.

mod common;

use std::path::Path;
use std::sync::atomic::AtomicBool;

use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::Distribution;
use cinder::config::{LrSchedule, OptimizerKind, TrainConfig};
use cinder::data::batch_tensors;
use cinder::run::optim::Optim;
use cinder::run::report::{Observer, StepReport};
use cinder::run::trainer::{Outcome, Trainer};
use cinder::storage::checkpoint::{self, CheckpointError};
use cinder::storage::names::LATEST;
use cinder_data::{Batcher, Split};
use cinder_model::Ops;
use common::{serial, tiny_config, weights};

/// Collects every step's loss.
#[derive(Default)]
struct Losses(Vec<(u64, f32)>);
impl Observer for Losses {
    fn step(&mut self, s: &StepReport, _eval: Option<&cinder::run::report::EvalReport>) {
        self.0.push((s.iter, s.loss));
    }
}

fn trainer(config: TrainConfig, dir: &Path, out: &str) -> Trainer {
    common::new_trainer(config, dir, out).unwrap()
}

fn resumed(
    config_changes: impl FnOnce(&mut TrainConfig),
    dir: &Path,
    from: &Path,
    out: &str,
) -> Trainer {
    let meta = checkpoint::load_meta(from).unwrap();
    let mut config = meta.config.clone();
    config_changes(&mut config);
    let data = common::training_data(&meta.data_path, &config);
    Trainer::resume(from, &meta, config, common::backend(), data, dir.join(out)).unwrap()
}

#[test]
fn tiny_model_overfits_one_batch() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let config = TrainConfig {
        learning_rate: 3e-3,
        ..tiny_config()
    };
    let t = trainer(config.clone(), dir.path(), "run");
    let device = t.backend().device.clone().autodiff();
    let batch = Batcher::new(1, 4, 16).batch(t.splits().get(Split::Train), Split::Train, 0, 0);
    let (x, y) = batch_tensors(&batch, &device);
    let mut model = t.model().clone();
    let mut optim = Optim::new(&config, &model);
    let mut loss = f32::INFINITY;
    for _ in 0..300 {
        let l = model.loss(x.clone(), y.clone(), None);
        loss = l.clone().into_scalar::<f32>();
        let grads = GradientsParams::from_grads(l.backward(), &model);
        model = optim.step(config.learning_rate, model, grads, config.grad_clip);
    }
    assert!(loss < 0.05, "loss after 300 steps on one batch: {loss}");
}

#[test]
fn resume_is_bit_identical_to_a_straight_run() {
    // Dropout on, so that the dropout masks must also be reproduced.
    check_exact_resume(
        TrainConfig {
            dropout: 0.1,
            gradient_accumulation_steps: 2,
            ..tiny_config()
        },
        Ops::Fused,
    );
}

#[test]
fn resume_is_bit_identical_to_a_straight_run_on_the_composite_layers() {
    check_exact_resume(
        TrainConfig {
            dropout: 0.1,
            ..tiny_config()
        },
        Ops::Composite,
    );
}

#[test]
fn resume_is_bit_identical_with_muon_and_the_trapezoid() {
    check_exact_resume(
        TrainConfig {
            optimizer: OptimizerKind::Muon,
            lr_schedule: LrSchedule::Trapezoid,
            gradient_accumulation_steps: 2,
            ..tiny_config()
        },
        Ops::Fused,
    );
}

#[test]
fn resume_is_bit_identical_with_normuon() {
    // NorMuon's running means are optimizer state: a resume that lost them would differ.
    check_exact_resume(
        TrainConfig {
            optimizer: OptimizerKind::Muon,
            muon_beta2: 0.9,
            lr_schedule: LrSchedule::Trapezoid,
            ..tiny_config()
        },
        Ops::Fused,
    );
}

/// 16 iterations straight, and 8 then 8 more resumed from the checkpoint, give the same losses
/// bit for bit and the same weights, with the layers of `ops`.
fn check_exact_resume(config: TrainConfig, ops: Ops) {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let config = TrainConfig {
        max_iters: 16,
        ..config
    };
    let stop = AtomicBool::new(false);

    let mut straight = trainer(config.clone(), dir.path(), "straight").with_ops(ops);
    let mut straight_losses = Losses::default();
    assert_eq!(
        straight.run(&mut straight_losses, &stop).unwrap(),
        Outcome::Finished
    );

    let mut first = trainer(
        TrainConfig {
            max_iters: 8,
            ..config.clone()
        },
        dir.path(),
        "halves",
    )
    .with_ops(ops);
    let mut losses = Losses::default();
    first.run(&mut losses, &stop).unwrap();
    drop(first);
    let mut second = resumed(
        |c| c.max_iters = 16,
        dir.path(),
        &dir.path().join("halves").join(LATEST),
        "halves",
    )
    .with_ops(ops);
    assert_eq!(second.iter(), 8);
    second.run(&mut losses, &stop).unwrap();

    assert_eq!(losses.0.len(), 16);
    assert_eq!(
        losses.0, straight_losses.0,
        "every logged loss is bit-identical"
    );
    assert_eq!(
        weights(second.model()),
        weights(straight.model()),
        "final weights are identical"
    );
}

#[test]
fn stop_flag_saves_latest_and_reports_the_iteration() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let mut t = trainer(tiny_config(), dir.path(), "run");
    t.step();
    t.step();
    let stop = AtomicBool::new(true);
    assert_eq!(
        t.run(&mut (), &stop).unwrap(),
        Outcome::Interrupted { iter: 2 }
    );
    let meta = checkpoint::load_meta(&dir.path().join("run").join(LATEST)).unwrap();
    assert_eq!(meta.iter, 2);
}

#[test]
fn checkpoint_round_trip_keeps_weights_and_optimizer_state() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let mut t = trainer(tiny_config(), dir.path(), "run");
    for _ in 0..3 {
        t.step();
    }
    t.run(&mut (), &AtomicBool::new(true)).unwrap(); // saves latest/ at iteration 3
    let ckpt = dir.path().join("run").join(LATEST);
    let mut loaded = resumed(|_| {}, dir.path(), &ckpt, "run");
    assert_eq!(weights(loaded.model()), weights(t.model()));
    // Same optimizer state (moments and step counts): the next step gives the same weights.
    let (a, b) = (t.step(), loaded.step());
    assert_eq!(a.loss, b.loss);
    assert_eq!(weights(loaded.model()), weights(t.model()));
    // A fresh optimizer would not: AdamW's first step differs from its fourth.
    let mut fresh = resumed(|_| {}, dir.path(), &ckpt, "run");
    fresh.restart_optimizer();
    fresh.step();
    assert_ne!(weights(fresh.model()), weights(t.model()));
}

fn saved_checkpoint(dir: &Path) -> std::path::PathBuf {
    let mut t = trainer(tiny_config(), dir, "run");
    t.step();
    t.run(&mut (), &AtomicBool::new(true)).unwrap();
    dir.join("run").join(LATEST)
}

fn load_error(ckpt: &Path) -> CheckpointError {
    let device = common::backend().device.autodiff();
    match checkpoint::load_meta(ckpt) {
        Err(e) => e,
        Ok(meta) => {
            let model = checkpoint::load_model(ckpt, &meta, &device);
            match model {
                Err(e) => e,
                Ok(model) => {
                    checkpoint::load_optimizer(ckpt, &meta, Optim::new(&meta.config, &model).module)
                        .err()
                        .expect("a damaged checkpoint must not load")
                }
            }
        }
    }
}

#[test]
fn damaged_checkpoints_are_refused_naming_the_file() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = saved_checkpoint(dir.path());
    let pristine: Vec<(String, Vec<u8>)> = ["model.bpk", "optimizer.bpk", "meta.json"]
        .iter()
        .map(|n| (n.to_string(), std::fs::read(ckpt.join(n)).unwrap()))
        .collect();
    let restore = || {
        for (n, b) in &pristine {
            std::fs::write(ckpt.join(n), b).unwrap();
        }
    };
    for name in ["model.bpk", "optimizer.bpk"] {
        let bytes = std::fs::read(ckpt.join(name)).unwrap();
        let damages: [(&str, Vec<u8>); 3] = [
            ("truncated", bytes[..bytes.len() / 2].to_vec()),
            ("zero-length", Vec::new()),
            ("corrupted", {
                let mut b = bytes.clone();
                let mid = b.len() / 2;
                b[mid] ^= 0xff;
                b
            }),
        ];
        for (how, damaged) in damages {
            std::fs::write(ckpt.join(name), damaged).unwrap();
            let err = load_error(&ckpt).to_string();
            assert!(err.contains(name), "{how} {name}: {err}");
            restore();
        }
        std::fs::remove_file(ckpt.join(name)).unwrap();
        let err = load_error(&ckpt).to_string();
        assert!(err.contains(name) && err.contains("missing"), "{err}");
        restore();
    }
    std::fs::write(ckpt.join("meta.json"), b"{ not json").unwrap();
    assert!(load_error(&ckpt).to_string().contains("meta.json"));
    std::fs::remove_file(ckpt.join("meta.json")).unwrap();
    let err = checkpoint::resolve(&ckpt, &["best", "latest"])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("not a checkpoint") && err.contains("meta.json"),
        "{err}"
    );
}

#[test]
fn newer_format_is_refused_naming_both_versions() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = saved_checkpoint(dir.path());
    let meta = std::fs::read_to_string(ckpt.join("meta.json")).unwrap();
    std::fs::write(
        ckpt.join("meta.json"),
        meta.replace(
            &format!("\"format_version\": {}", checkpoint::FORMAT_VERSION),
            "\"format_version\": 99",
        ),
    )
    .unwrap();
    let err = checkpoint::load_meta(&ckpt).unwrap_err().to_string();
    assert!(
        err.contains("99") && err.contains(&checkpoint::FORMAT_VERSION.to_string()),
        "{err}"
    );
}

#[test]
fn leftovers_of_a_crashed_write_break_neither_load_nor_save() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = saved_checkpoint(dir.path());
    let run = dir.path().join("run");
    // A crash while writing: a half-written temporary folder beside latest/.
    std::fs::create_dir_all(run.join(".latest.tmp")).unwrap();
    std::fs::write(run.join(".latest.tmp").join("model.bpk"), b"half").unwrap();
    assert_eq!(checkpoint::resolve(&run, &[LATEST]).unwrap(), ckpt);
    let meta = checkpoint::load_meta(&ckpt).unwrap();
    assert_eq!(meta.iter, 1);
    // A crash between the renames: latest/ gone, the previous one kept as .latest.old.
    std::fs::rename(&ckpt, run.join(".latest.old")).unwrap();
    let found = checkpoint::resolve(&run, &[LATEST]).unwrap();
    assert_eq!(found, run.join(".latest.old"));
    assert_eq!(checkpoint::load_meta(&found).unwrap().iter, 1);
    // The next save cleans up and lands in place.
    let mut t = resumed(|_| {}, dir.path(), &found, "run");
    t.step();
    t.run(&mut (), &AtomicBool::new(true)).unwrap();
    assert_eq!(checkpoint::load_meta(&ckpt).unwrap().iter, 2);
    assert!(!run.join(".latest.tmp").exists() && !run.join(".latest.old").exists());
}

#[test]
fn a_failed_write_is_reported_and_keeps_the_last_good_checkpoint() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = saved_checkpoint(dir.path()); // latest/ at iteration 1
    let mut t = resumed(|_| {}, dir.path(), &ckpt, "run");
    t.step();
    // Something that can't be replaced stands where the next checkpoint is written.
    std::fs::write(dir.path().join("run/.latest.tmp"), b"in the way").unwrap();
    let err = t
        .run(&mut (), &AtomicBool::new(true))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cannot write checkpoint") && err.contains("latest"),
        "{err}"
    );
    assert_eq!(
        checkpoint::load_meta(&ckpt).unwrap().iter,
        1,
        "the last good checkpoint is intact"
    );
}

#[test]
fn a_stop_during_evaluation_does_not_wait_for_it() {
    let _serial = serial();
    /// Asks to stop as soon as an evaluation starts.
    struct StopInEval<'a>(&'a AtomicBool, usize);
    impl Observer for StopInEval<'_> {
        fn eval_progress(&mut self, _split: Split, _done: usize, _total: usize) {
            self.1 += 1;
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let config = TrainConfig {
        eval_interval: 3,
        eval_iters: 50,
        ..tiny_config()
    };
    let mut t = trainer(config, dir.path(), "run");
    let stop = AtomicBool::new(false);
    let mut observer = StopInEval(&stop, 0);
    assert_eq!(
        t.run(&mut observer, &stop).unwrap(),
        Outcome::Interrupted { iter: 3 }
    );
    assert_eq!(observer.1, 1, "one evaluation batch, not 2 x 50");
    assert_eq!(
        checkpoint::load_meta(&dir.path().join("run").join(LATEST))
            .unwrap()
            .iter,
        3
    );
}

/// A new run's weights are drawn when its trainer builds the model, from the run's seed. What
/// uses the device's generator before they are first read (another run's step reseeds it), and
/// which layers read them first (the fused embedding reads the position table before the token
/// table), cannot change them: Burn alone would draw each weight lazily, at its first read.
#[test]
fn a_new_runs_weights_do_not_depend_on_what_runs_before_they_are_read() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_config();
    let new = |out: &str, ops| trainer(config.clone(), dir.path(), out).with_ops(ops);
    let device = common::backend().device;
    let disturb = |seed| {
        device.seed(seed);
        let _ = Tensor::<1>::random([1000], Distribution::Default, &device).into_data();
    };

    // Read as soon as built.
    let mut reference = new("reference", Ops::Fused);
    let want = weights(reference.model());
    let first_loss = reference.step().loss;

    let mut fused = new("fused", Ops::Fused);
    let mut composite = new("composite", Ops::Composite);
    disturb(1);
    // Read first by a composite step.
    let composite_loss = composite.step().loss;
    disturb(2);
    assert!(
        weights(fused.model()) == want,
        "weights read after the generator moved on differ"
    );
    assert_eq!(fused.step().loss, first_loss);
    assert!(
        (composite_loss - first_loss).abs() < 1e-5,
        "composite {composite_loss}, fused {first_loss}"
    );
}

/// A run that learns nothing (every learning rate 0): each evaluation's validation loss equals
/// the first, which stays the best, so `early_stop` evaluations later the run stops.
fn frozen(early_stop: u64) -> TrainConfig {
    TrainConfig {
        learning_rate: 0.0,
        min_lr: 0.0,
        muon_lr: 0.0,
        embedding_lr: 0.0,
        head_lr: 0.0,
        max_iters: 100,
        eval_interval: 2,
        checkpoint_interval: 100,
        early_stop,
        ..tiny_config()
    }
}

/// Sets `stop` after the step of iteration `at`: the run is interrupted there, as by Ctrl-C.
struct StopAfter<'a>(u64, &'a AtomicBool);
impl Observer for StopAfter<'_> {
    fn step(&mut self, s: &StepReport, _eval: Option<&cinder::run::report::EvalReport>) {
        if s.iter == self.0 {
            self.1.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

#[test]
fn early_stop_stops_after_evaluations_without_a_new_best_and_keeps_best() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let stop = AtomicBool::new(false);
    // Evaluations at 2 (the best), 4, 6 and 8: the third without a new best stops it.
    let mut run = trainer(frozen(3), dir.path(), "run");
    assert_eq!(
        run.run(&mut (), &stop).unwrap(),
        Outcome::EarlyStopped { iter: 8 }
    );
    let folder = dir.path().join("run");
    let best = checkpoint::load_meta(&folder.join(cinder::storage::names::BEST)).unwrap();
    let latest = checkpoint::load_meta(&folder.join(LATEST)).unwrap();
    assert_eq!((best.iter, latest.iter), (2, 8));
    assert_eq!(latest.val_trend.since_best, 3);
    // Off (0), the same run goes to max_iters.
    let mut run = trainer(frozen(0), dir.path(), "off");
    assert_eq!(run.run(&mut (), &stop).unwrap(), Outcome::Finished);
    assert_eq!(run.iter(), 100);
}

/// Interrupted at iteration 5 (after the evaluations at 2 and 4) and resumed, the run stops
/// where the uninterrupted one does: the count of evaluations without a best is in latest/.
#[test]
fn early_stop_counts_across_a_resume() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let stop = AtomicBool::new(false);
    let mut first = trainer(frozen(3), dir.path(), "run");
    assert_eq!(
        first.run(&mut StopAfter(4, &stop), &stop).unwrap(),
        Outcome::Interrupted { iter: 5 }
    );
    drop(first);
    let stop = AtomicBool::new(false);
    let latest = dir.path().join("run").join(LATEST);
    let mut second = resumed(|_| {}, dir.path(), &latest, "run");
    assert_eq!(
        second.run(&mut (), &stop).unwrap(),
        Outcome::EarlyStopped { iter: 8 }
    );
    drop(second);
    // Resumed again, it stops at once, without a step; with a larger early_stop it goes on to
    // its next evaluation.
    let mut again = resumed(|_| {}, dir.path(), &latest, "run");
    let mut losses = Losses::default();
    assert_eq!(
        again.run(&mut losses, &stop).unwrap(),
        Outcome::EarlyStopped { iter: 8 }
    );
    assert!(losses.0.is_empty());
    drop(again);
    let mut longer = resumed(|c| c.early_stop = 4, dir.path(), &latest, "run");
    assert_eq!(
        longer.run(&mut (), &stop).unwrap(),
        Outcome::EarlyStopped { iter: 10 }
    );
}
