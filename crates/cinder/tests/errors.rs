//! Every bad input gets a clear message and a non-zero exit status, never a panic.

mod common;

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use cinder::storage::checkpoint;
use common::{corpus_in, fails_with, tiny_flags, tiny_flags_with, trained_run};
use predicates::str::contains;

fn train(dir: &Path) -> Command {
    let mut cmd = Command::cargo_bin("train").unwrap();
    cmd.current_dir(dir);
    cmd
}

fn generate(dir: &Path) -> Command {
    let mut cmd = Command::cargo_bin("generate").unwrap();
    cmd.current_dir(dir);
    cmd
}

fn write(dir: &Path, name: &str, bytes: impl AsRef<[u8]>) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn data_path_missing_folder_or_unreadable() {
    let dir = tempfile::tempdir().unwrap();
    fails_with(
        train(dir.path()).args(["--data", "nope.txt", "--out", "fresh"]),
        &["nope.txt", "does not exist"],
    );
    // The run folder this start made goes with it; one that was there stays, with its files.
    assert!(!dir.path().join("fresh").exists());
    std::fs::create_dir(dir.path().join("mine")).unwrap();
    write(dir.path(), "mine/notes.txt", "keep");
    fails_with(
        train(dir.path()).args(["--data", "nope.txt", "--out", "mine"]),
        &["nope.txt", "does not exist"],
    );
    let notes = std::fs::read_to_string(dir.path().join("mine/notes.txt")).unwrap();
    assert_eq!(notes, "keep");
    // A folder is a set of documents: one without .txt files is refused.
    fails_with(
        train(dir.path()).arg("--data").arg(dir.path()),
        &["has no .txt files"],
    );
    let file = write(dir.path(), "file.txt", "abc");
    fails_with(
        train(dir.path()).arg("--data").arg(file.join("inner.txt")),
        &["cannot read", "inner.txt"],
    );
}

#[test]
fn empty_short_and_non_utf8_texts() {
    let dir = tempfile::tempdir().unwrap();
    let empty = write(dir.path(), "empty.txt", "");
    fails_with(
        train(dir.path()).arg("--data").arg(empty),
        &["empty.txt", "is empty"],
    );
    let short = write(dir.path(), "short.txt", "abcdefghij".repeat(10));
    fails_with(
        train(dir.path())
            .arg("--data")
            .arg(&short)
            .args(tiny_flags()),
        &[
            "val split has 10 tokens",
            "block_size + 1 = 17",
            "--block-size",
        ],
    );
    let latin1 = write(dir.path(), "latin1.txt", b"na\xefve caf\xe9 ".repeat(100));
    fails_with(
        train(dir.path()).arg("--data").arg(latin1),
        &["not valid UTF-8", "offset 2", "iconv"],
    );
}

#[test]
fn windows_line_endings_and_byte_order_mark_train() {
    let dir = tempfile::tempdir().unwrap();
    let text = common::shakespeare(20_000).replace('\n', "\r\n");
    let path = write(dir.path(), "windows.txt", format!("\u{feff}{text}"));
    let out = common::stdout_of(
        train(dir.path())
            .arg("--data")
            .arg(&path)
            .args(tiny_flags_with(&[("--max-iters", "2")]))
            .arg("--out")
            .arg(dir.path().join("run")),
    );
    // Read as plain text: no '\r' or BOM in the vocabulary, so its size matches the LF text.
    let plain: std::collections::BTreeSet<char> = common::shakespeare(20_000).chars().collect();
    assert!(
        out.contains(&format!("vocabulary {}", plain.len())),
        "{out}"
    );
}

#[test]
fn bad_config_files_name_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "syntax.toml",
            "n_layer = 4\nn_head = = 2\n",
            vec!["syntax.toml", "line 2"],
        ),
        (
            "unknown.toml",
            "n_layer = 4\n\nn_layers = 2\n",
            vec!["unknown.toml", "line 3", "n_layers"],
        ),
        (
            "type.toml",
            "batch_size = \"twelve\"\n",
            vec!["type.toml", "line 1", "batch_size"],
        ),
    ];
    for (name, text, needles) in cases {
        let path = write(dir.path(), name, text);
        fails_with(train(dir.path()).arg("--config").arg(path), &needles);
    }
    fails_with(
        train(dir.path()).args(["--config", "missing.toml"]),
        &["missing.toml"],
    );
}

#[test]
fn out_of_range_values_name_field_and_range() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &[&str]); 6] = [
        (&["--batch-size", "0"], &["`batch_size` is 0", "at least 1"]),
        (
            &["--learning-rate=-0.001"],
            &["`learning_rate`", "positive"],
        ),
        (
            &["--n-embd", "100", "--n-head", "3"],
            &["`n_embd` is 100", "multiple of n_head (3)"],
        ),
        (&["--dropout", "1"], &["`dropout` is 1", "[0, 1)"]),
        (&["--block-size", "0"], &["`block_size` is 0"]),
        (&["--max-iters", "0"], &["`max_iters` is 0"]),
    ];
    for (flags, needles) in cases {
        fails_with(train(dir.path()).args(flags), needles);
    }
    let file = write(dir.path(), "bad.toml", "dropout = 1.5\n");
    fails_with(
        train(dir.path()).arg("--config").arg(file),
        &["`dropout` is 1.5"],
    );
}

#[test]
fn unwritable_out_fails_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "a_file", "x");
    let stderr = fails_with(
        train(dir.path())
            .arg("--data")
            .arg(corpus_in(dir.path()))
            .args(tiny_flags())
            .arg("--out")
            .arg(file.join("run")),
        &["cannot write to the run folder", "--out"],
    );
    assert!(!stderr.contains("iter"), "{stderr}");
}

#[test]
fn prompt_with_unknown_characters() {
    let dir = tempfile::tempdir().unwrap();
    let run = trained_run(dir.path());
    fails_with(
        generate(dir.path())
            .arg("--checkpoint")
            .arg(&run)
            .args(["--prompt", "hello ☃ ⚡"]),
        &["'☃'", "'⚡'", "--drop-unknown"],
    );
    let out = generate(dir.path())
        .arg("--checkpoint")
        .arg(&run)
        .args([
            "--prompt",
            "hello ☃",
            "--drop-unknown",
            "--max-new-tokens",
            "5",
        ])
        .assert()
        .success()
        .get_output()
        .clone();
    assert!(
        String::from_utf8(out.stderr)
            .unwrap()
            .contains("dropping prompt characters")
    );
}

#[test]
fn checkpoint_folder_missing_empty_or_not_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    fails_with(
        generate(dir.path()).args(["--checkpoint", "no_such_run"]),
        &["no_such_run", "does not exist"],
    );
    std::fs::create_dir(dir.path().join("empty")).unwrap();
    fails_with(
        generate(dir.path()).args(["--checkpoint", "empty"]),
        &["empty", "not a checkpoint", "meta.json"],
    );
    fails_with(
        train(dir.path()).args(["--resume", "empty"]),
        &["not a checkpoint"],
    );
}

#[test]
fn damaged_weights_and_newer_format() {
    let dir = tempfile::tempdir().unwrap();
    let run = trained_run(dir.path());
    let model = run.join("best/model.bpk");
    let good = std::fs::read(&model).unwrap();
    for damaged in [good[..good.len() / 3].to_vec(), Vec::new(), {
        let mut b = good.clone();
        b[good.len() / 2] ^= 0x55;
        b
    }] {
        std::fs::write(&model, damaged).unwrap();
        fails_with(
            generate(dir.path()).arg("--checkpoint").arg(&run),
            &["model.bpk", "damaged"],
        );
    }
    std::fs::write(&model, good).unwrap();
    let meta = run.join("best/meta.json");
    let text = std::fs::read_to_string(&meta).unwrap();
    std::fs::write(
        &meta,
        text.replace(
            &format!("\"format_version\": {},", checkpoint::FORMAT_VERSION),
            "\"format_version\": 7,",
        ),
    )
    .unwrap();
    fails_with(
        generate(dir.path()).arg("--checkpoint").arg(&run),
        &[
            "format version 7",
            &format!("up to {}", checkpoint::FORMAT_VERSION),
        ],
    );
}

#[test]
fn generate_flags_out_of_range() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &str); 11] = [
        (&["--max-new-tokens", "0"], "--max-new-tokens is 0"),
        (&["--num-samples", "0"], "--num-samples is 0"),
        (&["--temperature", "-1"], "--temperature is -1"),
        (&["--top-k", "0"], "--top-k is 0"),
        (&["--top-p", "0"], "--top-p is 0"),
        (&["--top-p", "1.5"], "--top-p is 1.5"),
        (&["--min-p", "1.5"], "--min-p is 1.5"),
        (&["--presence-penalty", "3"], "--presence-penalty is 3"),
        (
            &["--frequency-penalty", "-2.5"],
            "--frequency-penalty is -2.5",
        ),
        (&["--repetition-penalty", "0"], "--repetition-penalty is 0"),
        (
            &["--repetition-penalty", "-1"],
            "--repetition-penalty is -1",
        ),
    ];
    for (flags, flag) in cases {
        // Checked before the checkpoint is even opened.
        fails_with(generate(dir.path()).args(flags), &[flag]);
    }
}

#[test]
fn diverging_loss_stops_with_an_error_and_keeps_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let stderr = fails_with(
        train(dir.path())
            .arg("--data")
            .arg(corpus_in(dir.path()))
            .args(tiny_flags_with(&[
                ("--checkpoint-interval", "1"),
                ("--warmup-iters", "0"),
                ("--max-iters", "50"),
                ("--learning-rate", "1e30"),
                ("--grad-clip", "0"),
            ]))
            .arg("--out")
            .arg(&run),
        &[
            "training loss became",
            "at iteration",
            "last good checkpoint",
        ],
    );
    let iter: u64 = stderr
        .split("at iteration ")
        .nth(1)
        .unwrap()
        .split(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let meta = cinder::storage::checkpoint::load_meta(&run.join("latest")).unwrap();
    assert!(
        meta.iter <= iter,
        "latest/ ({}) is from before the failure ({iter})",
        meta.iter
    );
}

#[test]
fn help_lists_every_flag_with_its_default_and_version_works() {
    let dir = tempfile::tempdir().unwrap();
    let help = common::stdout_of(train(dir.path()).arg("--help"));
    for flag in [
        "--config",
        "--data",
        "--out",
        "--resume",
        "--max-iters",
        "--batch-size",
        "--block-size",
        "--n-layer",
        "--n-head",
        "--n-embd",
        "--dropout",
        "--learning-rate",
        "--min-lr",
        "--warmup-iters",
        "--weight-decay",
        "--beta2",
        "--grad-clip",
        "--gradient-accumulation-steps",
        "--eval-interval",
        "--eval-iters",
        "--log-interval",
        "--seed",
        "--quiet",
        "--verbose",
        "--device",
    ] {
        assert!(help.contains(flag), "train --help lacks {flag}");
    }
    let max_iters = cinder::config::TrainConfig::default().max_iters;
    assert!(
        help.contains(&format!("[default: {max_iters}]"))
            && help
                .contains("[default: configs/tiny_cpu.toml; with --init-from, nanoGPT's recipe]")
    );
    let help = common::stdout_of(generate(dir.path()).arg("--help"));
    for default in [
        "[default: 500]",
        "[default: 0.8]",
        "[default: 200]",
        "[default: 1]",
        "[default: 1337]",
    ] {
        assert!(help.contains(default), "generate --help lacks {default}");
    }
    for bin in ["train", "generate", "evaluate"] {
        Command::cargo_bin(bin)
            .unwrap()
            .arg("--version")
            .assert()
            .success()
            .stdout(contains("0.1.0"));
    }
}

#[test]
fn resume_refuses_a_text_with_another_vocabulary_and_a_contradicting_flag() {
    let dir = tempfile::tempdir().unwrap();
    let run = trained_run(dir.path());
    let other = write(dir.path(), "other.txt", "0123456789 ".repeat(500));
    let on_other = || {
        let mut cmd = train(dir.path());
        cmd.arg("--resume")
            .arg(&run)
            .arg("--data")
            .arg(&other)
            .args(["--max-iters", "4"]);
        cmd
    };
    fails_with(
        &mut on_other(),
        &["other.txt is not the text this run was trained on"],
    );
    // A checkpoint from before text checksums (format 1) is checked on its vocabulary.
    common::make_format_1(&run.join("latest"));
    fails_with(&mut on_other(), &["other.txt", "different vocabulary"]);
    fails_with(
        train(dir.path())
            .arg("--resume")
            .arg(&run)
            .args(["--max-iters", "4", "--n-layer", "3"]),
        &["--n-layer 3 contradicts the checkpoint", "n_layer = 2"],
    );
    fails_with(
        train(dir.path()).arg("--resume").arg(&run),
        &["already at iteration 2", "--max-iters"],
    );
}
