//! Nothing lost, nothing mixed up: one trainer per run folder, no run replaced by accident, a
//! resumed run on its own text, and fine-tuning into a new run folder.

mod common;

use std::path::Path;

use assert_cmd::Command;
use cinder::storage::checkpoint;
use common::{fails_with, snapshot, tiny_flags_with, trained_run};

fn train(dir: &Path) -> Command {
    let mut cmd = Command::cargo_bin("train").unwrap();
    cmd.current_dir(dir);
    cmd
}

#[test]
fn a_new_run_over_an_old_one_is_refused_unless_overwrite_moves_it_aside() {
    let dir = tempfile::tempdir().unwrap();
    let run = trained_run(dir.path());
    let before = snapshot(&run);
    let again = || {
        let mut cmd = train(dir.path());
        cmd.arg("--data")
            .arg(dir.path().join("corpus.txt"))
            .args(tiny_flags_with(&[("--max-iters", "3")]))
            .arg("--out")
            .arg(&run);
        cmd
    };
    fails_with(
        &mut again(),
        &[
            "already holds a run",
            "train --resume",
            "another --out",
            "--overwrite",
            "run.old-1",
        ],
    );
    assert!(snapshot(&run) == before, "a refusal touches nothing");

    let out = common::stdout_of(again().arg("--overwrite"));
    assert!(out.contains("aside into"), "{out}");
    let aside = dir.path().join("run.old-1");
    let old = checkpoint::load_meta(&aside.join("latest")).unwrap();
    assert_eq!(old.iter, 2, "the old run is kept whole");
    assert_eq!(
        std::fs::read(aside.join("metrics.csv")).unwrap(),
        before
            .iter()
            .find(|(p, _)| p.ends_with("metrics.csv"))
            .unwrap()
            .1
    );
    let new = checkpoint::load_meta(&run.join("latest")).unwrap();
    assert_eq!(new.iter, 3);
}

#[test]
fn resume_refuses_a_changed_text_and_follows_a_moved_one() {
    let dir = tempfile::tempdir().unwrap();
    let run = trained_run(dir.path());
    let corpus = dir.path().join("corpus.txt");
    let text = std::fs::read_to_string(&corpus).unwrap();
    let resume = || {
        let mut cmd = train(dir.path());
        cmd.arg("--resume").arg(&run).args(["--max-iters", "3"]);
        cmd
    };

    // The same characters in another order: the vocabulary matches, the text does not.
    let mut chars: Vec<char> = text.chars().collect();
    chars.swap(0, 1000);
    std::fs::write(&corpus, chars.iter().collect::<String>()).unwrap();
    fails_with(
        &mut resume(),
        &[
            "corpus.txt is not the text this run was trained on",
            &format!("{} bytes, checksum", text.len()),
            "--data",
            "--init-from",
        ],
    );

    // The original text, moved: found with --data.
    std::fs::remove_file(&corpus).unwrap();
    let moved = dir.path().join("moved.txt");
    std::fs::write(&moved, &text).unwrap();
    fails_with(&mut resume(), &["corpus.txt", "is gone", "--data"]);
    resume().arg("--data").arg(&moved).assert().success();
    let meta = checkpoint::load_meta(&run.join("latest")).unwrap();
    assert_eq!((meta.iter, meta.data_path), (3, moved));
}

#[test]
fn fine_tuning_starts_a_new_run_from_a_checkpoints_weights() {
    let dir = tempfile::tempdir().unwrap();
    let base = trained_run(dir.path());
    let base_meta = checkpoint::load_meta(&base.join("best")).unwrap();
    // Another text made of characters the base model knows.
    let other = dir.path().join("other.txt");
    std::fs::write(
        &other,
        "to be or not to be, that is the question.\n".repeat(200),
    )
    .unwrap();
    let tuned = dir.path().join("tuned");
    let fine_tune = |extra: &[&str]| {
        let mut cmd = train(dir.path());
        cmd.arg("--init-from")
            .arg(&base)
            .arg("--data")
            .arg(&other)
            .arg("--out")
            .arg(&tuned)
            // Training settings are the new run's; the architecture is the checkpoint's, so
            // the default config's 4 layers and 128 wide do not apply.
            .args([
                "--max-iters",
                "4",
                "--learning-rate",
                "3e-4",
                "--eval-iters",
                "2",
                "--batch-size",
                "4",
            ])
            .args(extra);
        cmd
    };
    fails_with(
        &mut fine_tune(&["--n-layer", "3"]),
        &["--n-layer 3 contradicts the checkpoint", "n_layer = 2"],
    );
    let out = common::stdout_of(fine_tune(&[]));
    assert!(out.contains("starting from the weights of"), "{out}");
    let meta = checkpoint::load_meta(&tuned.join("latest")).unwrap();
    assert_eq!(meta.iter, 4, "the schedule starts from 0");
    assert_eq!(meta.vocab, base_meta.vocab);
    assert_eq!(
        meta.config.with_architecture_of(&base_meta.config),
        meta.config
    );
    assert_eq!(meta.config.learning_rate, 3e-4);
    assert_eq!(meta.config.init_from.as_deref(), Some(base.as_path()));
    assert_eq!(meta.data_path, other);

    // Characters the vocabulary lacks are listed.
    let odd = dir.path().join("odd.txt");
    std::fs::write(&odd, "to be € or not # to be\n".repeat(100)).unwrap();
    fails_with(
        train(dir.path())
            .arg("--init-from")
            .arg(&base)
            .arg("--data")
            .arg(&odd)
            .arg("--out")
            .arg(dir.path().join("odd")),
        &["'€'", "'#'", "vocabulary", "without --init-from"],
    );
}

#[test]
fn fine_tuning_starts_from_exactly_the_checkpoints_weights() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let base = trained_run(dir.path());
    let ckpt = base.join("best");
    let meta = checkpoint::load_meta(&ckpt).unwrap();
    let config = cinder::config::TrainConfig {
        dropout: 0.1,
        learning_rate: 1e-4,
        ..meta.config.clone()
    };
    let tokenizer = checkpoint::load_tokenizer(&ckpt, &meta).unwrap();
    let data = cinder::data::TrainingData::open(
        &[dir.path().join("corpus.txt")],
        &cinder::data::TokenizerChoice::Keep(Box::new(tokenizer.clone())),
        &config,
        None,
        &mut |_, _, _| {},
    )
    .unwrap();
    let t = cinder::run::trainer::Trainer::fine_tune(
        &ckpt,
        &meta,
        config,
        common::backend(),
        data,
        dir.path().join("tuned"),
    )
    .unwrap();
    let base_model =
        checkpoint::load_model(&ckpt, &meta, &burn::prelude::Device::default()).unwrap();
    assert!(common::weights(t.model()) == common::weights(&base_model));
    assert_eq!((t.iter(), t.best_val_loss()), (0, None));
}

#[test]
fn a_checkpoint_from_before_text_checksums_still_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let run = trained_run(dir.path());
    common::make_format_1(&run.join("latest"));
    let out = common::stdout_of(
        train(dir.path())
            .arg("--resume")
            .arg(&run)
            .args(["--max-iters", "3"]),
    );
    assert!(out.contains("predates text checksums"), "{out}");
    let meta = checkpoint::load_meta(&run.join("latest")).unwrap();
    assert_eq!(meta.iter, 3);
    assert_eq!(meta.format_version, checkpoint::FORMAT_VERSION);
    assert!(meta.data_identity.is_some());
}

/// A run resumed into another folder carries its settings and its history there: config.toml
/// (with what the resume changed), and metrics.csv and samples.jsonl from the start.
#[test]
fn a_run_resumed_elsewhere_carries_its_config_and_history() {
    let dir = tempfile::tempdir().unwrap();
    let run = trained_run(dir.path());
    let moved = dir.path().join("moved");
    train(dir.path())
        .arg("--resume")
        .arg(&run)
        .args(["--max-iters", "4", "--out"])
        .arg(&moved)
        .assert()
        .success();
    let config = std::fs::read_to_string(moved.join("config.toml")).unwrap();
    assert!(config.contains("max_iters = 4"), "{config}");
    let rows = |folder: &Path| cinder::run::metrics::read(&folder.join("metrics.csv")).unwrap();
    let (before, after) = (rows(&run), rows(&moved));
    assert_eq!(after.first().map(|r| r.iter), Some(1), "{after:?}");
    assert_eq!(after.last().map(|r| r.iter), Some(4), "{after:?}");
    assert_eq!(after[..before.len()], before[..], "the history as it was");
    let samples = |folder: &Path| std::fs::read_to_string(folder.join("samples.jsonl")).unwrap();
    assert!(samples(&moved).starts_with(&samples(&run)));
    // The run it came from is as it was.
    assert_eq!(rows(&run), before);
}
