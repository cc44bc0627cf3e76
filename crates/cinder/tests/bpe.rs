//! Beyond characters: byte-level BPE runs, several input texts, prepared datasets, through the
//! binaries.

mod common;

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use burn::prelude::*;
use cinder::storage::checkpoint;
use common::{corpus_in, fails_with, stdout_of, tiny_flags_with};

fn bin(name: &str, dir: &Path) -> Command {
    let mut cmd = Command::cargo_bin(name).unwrap();
    cmd.current_dir(dir);
    cmd
}

fn weights(dir: &Path) -> Vec<Vec<f32>> {
    let meta = checkpoint::load_meta(dir).unwrap();
    common::weights(&checkpoint::load_model(dir, &meta, &Device::default()).unwrap())
}

/// A tiny BPE run of `iters` steps on `data` into `out`.
fn bpe_run(dir: &Path, data: &[&Path], out: &str, iters: &str) -> PathBuf {
    bin("train", dir)
        .arg("--data")
        .args(data)
        .args(["--tokenizer", "bpe", "--vocab-size", "300"])
        .args(tiny_flags_with(&[("--max-iters", iters)]))
        .arg("--out")
        .arg(dir.join(out))
        .assert()
        .success();
    dir.join(out)
}

#[test]
fn a_bpe_run_resumes_exactly_and_samples_and_evaluates() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = corpus_in(dir.path());
    let straight = bpe_run(dir.path(), &[&corpus], "straight", "20");
    let halves = bpe_run(dir.path(), &[&corpus], "halves", "10");
    bin("train", dir.path())
        .arg("--resume")
        .arg(&halves)
        .args(["--max-iters", "20"])
        .assert()
        .success();
    assert!(weights(&straight.join("latest")) == weights(&halves.join("latest")));

    // The checkpoint carries the tokenizer, loadable on its own; resume did not retrain it.
    let ckpt = halves.join("latest");
    let json = std::fs::read_to_string(ckpt.join("tokenizer.json")).unwrap();
    assert_eq!(
        json,
        std::fs::read_to_string(halves.join("data/tokenizer.json")).unwrap()
    );
    let meta = checkpoint::load_meta(&ckpt).unwrap();
    assert_eq!(meta.format_version, checkpoint::FORMAT_VERSION);
    assert_eq!(meta.vocab.vocab_size(), 300);

    let out = bin("generate", dir.path())
        .arg("--checkpoint")
        .arg(&halves)
        .args(["--max-new-tokens", "50", "--quiet"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    assert!(String::from_utf8(out).is_ok(), "streamed text is UTF-8");

    let report = stdout_of(bin("evaluate", dir.path()).arg("--checkpoint").arg(&halves));
    assert!(
        report.contains("nats/token") && report.contains("bits/byte"),
        "{report}"
    );
    let other = common::shakespeare(3000);
    std::fs::write(dir.path().join("other.txt"), other).unwrap();
    let report = stdout_of(
        bin("evaluate", dir.path())
            .arg("--checkpoint")
            .arg(&halves)
            .arg("--data")
            .arg(dir.path().join("other.txt")),
    );
    assert!(report.contains("bits/byte"), "{report}");
}

#[test]
fn texts_folders_and_prepared_datasets_train() {
    let dir = tempfile::tempdir().unwrap();
    let docs = dir.path().join("docs");
    std::fs::create_dir(&docs).unwrap();
    let text = common::shakespeare(20_000);
    let (a, b) = text.split_at(12_000);
    std::fs::write(docs.join("1.txt"), a).unwrap();
    std::fs::write(docs.join("2.txt"), b).unwrap();

    // A folder of documents, characters.
    let run = dir.path().join("chars");
    bin("train", dir.path())
        .arg("--data")
        .arg(&docs)
        .args(tiny_flags_with(&[("--max-iters", "3")]))
        .arg("--out")
        .arg(&run)
        .assert()
        .success();
    let meta = checkpoint::load_meta(&run.join("latest")).unwrap();
    assert_eq!(meta.data_paths, vec![docs.clone()]);

    // prepare, then train from the folder; the tokenizer comes with it.
    let prepared = dir.path().join("prepared");
    let out = stdout_of(
        bin("prepare", dir.path())
            .arg("--data")
            .arg(docs.join("1.txt"))
            .arg(docs.join("2.txt"))
            .args(["--tokenizer", "bpe", "--vocab-size", "300", "--out"])
            .arg(&prepared),
    );
    assert!(out.contains("16-bit ids") && out.contains("MB/s"), "{out}");
    let run = dir.path().join("from-prepared");
    bin("train", dir.path())
        .arg("--data")
        .arg(&prepared)
        .args(tiny_flags_with(&[("--max-iters", "3")]))
        .arg("--out")
        .arg(&run)
        .assert()
        .success();
    let meta = checkpoint::load_meta(&run.join("latest")).unwrap();
    assert_eq!(meta.vocab.vocab_size(), 300);
    // Its config.toml names the BPE it trained with, not the default characters, and trains
    // on the folder again as it stands.
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    let file = std::path::absolute(prepared.join("tokenizer.json")).unwrap();
    assert!(
        config.contains(&format!("tokenizer = {:?}", file.display().to_string())),
        "{config}"
    );
    bin("train", dir.path())
        .arg("--config")
        .arg(run.join("config.toml"))
        .arg("--data")
        .arg(&prepared)
        .args(["--max-iters", "1", "--out"])
        .arg(dir.path().join("again"))
        .assert()
        .success();
    // Another tokenizer.json asked for is refused, not trained on the folder's under a config
    // that names the other.
    let other = dir.path().join("other-prepared");
    bin("prepare", dir.path())
        .arg("--data")
        .arg(docs.join("1.txt"))
        .args(["--tokenizer", "bpe", "--vocab-size", "280", "--out"])
        .arg(&other)
        .assert()
        .success();
    fails_with(
        bin("train", dir.path())
            .arg("--data")
            .arg(&prepared)
            .arg("--tokenizer")
            .arg(other.join("tokenizer.json"))
            .args(["--max-iters", "1"]),
        &["prepared with a BPE (300 tokens)", "the tokenizer in"],
    );
    // Resuming reads the same prepared folder.
    bin("train", dir.path())
        .arg("--resume")
        .arg(&run)
        .args(["--max-iters", "5"])
        .assert()
        .success();

    // A tokenizer.json by path.
    let run = dir.path().join("by-path");
    bin("train", dir.path())
        .arg("--data")
        .arg(docs.join("1.txt"))
        .arg("--tokenizer")
        .arg(prepared.join("tokenizer.json"))
        .args(tiny_flags_with(&[("--max-iters", "2")]))
        .arg("--out")
        .arg(&run)
        .assert()
        .success();
    assert_eq!(
        std::fs::read(run.join("latest/tokenizer.json")).unwrap(),
        std::fs::read(prepared.join("tokenizer.json")).unwrap()
    );
}

#[test]
fn tokenizer_flags_that_cannot_work_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = corpus_in(dir.path());
    let train = || {
        let mut cmd = bin("train", dir.path());
        cmd.arg("--data").arg(&corpus).args(["--max-iters", "1"]);
        cmd
    };
    fails_with(
        train().args(["--tokenizer", "bpe", "--vocab-size", "100"]),
        &["vocab_size", "at least 257"],
    );
    fails_with(
        train().args(["--tokenizer", "char", "--vocab-size", "500"]),
        &["vocab_size", "0 (the default)"],
    );
    fails_with(
        train().args(["--tokenizer", "missing/tokenizer.json"]),
        &["cannot read tokenizer", "missing/tokenizer.json"],
    );
    std::fs::write(dir.path().join("bad.json"), "{\"not\": \"a tokenizer\"}").unwrap();
    fails_with(
        train().args(["--tokenizer", "bad.json"]),
        &["bad.json", "not a tokenizer.json"],
    );
    let prepared = dir.path().join("p");
    bin("prepare", dir.path())
        .arg("--data")
        .arg(&corpus)
        .arg("--out")
        .arg(&prepared)
        .assert()
        .success();
    fails_with(
        bin("prepare", dir.path())
            .arg("--data")
            .arg(&corpus)
            .arg("--out")
            .arg(&prepared),
        &["already holds a prepared dataset"],
    );
    // A BPE asked for, on characters prepared: refused, not trained on characters under a
    // config that says BPE.
    fails_with(
        bin("train", dir.path()).arg("--data").arg(&prepared).args([
            "--tokenizer",
            "bpe",
            "--max-iters",
            "1",
        ]),
        &["prepared with a character", "drop --tokenizer"],
    );
    // prepare never replaces a file of the names it writes (a nanoGPT data folder's).
    let theirs = dir.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::write(theirs.join("train.bin"), "mine").unwrap();
    fails_with(
        bin("prepare", dir.path())
            .arg("--data")
            .arg(&corpus)
            .arg("--out")
            .arg(&theirs),
        &["train.bin exists", "never replaces"],
    );
    assert_eq!(
        std::fs::read_to_string(theirs.join("train.bin")).unwrap(),
        "mine"
    );
    let bin_file = prepared.join("val.bin");
    let bytes = std::fs::read(&bin_file).unwrap();
    std::fs::write(&bin_file, &bytes[..bytes.len() - 3]).unwrap();
    fails_with(
        bin("train", dir.path()).arg("--data").arg(&prepared),
        &["val.bin has", "prepare it again"],
    );
}
