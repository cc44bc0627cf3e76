//! Helpers shared by the integration tests: a small corpus and a tiny, fast configuration.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use cinder::config::TrainConfig;
use cinder::device::Backend;

/// The CPU backend, or the GPU in a build without one.
pub fn backend() -> Backend {
    Backend::cpu().or_else(|_| Backend::gpu()).unwrap()
}

/// Burn's random generator is global to the process: tests that seed it and draw from it
/// (initialisation, dropout) take turns.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The first `n` characters of Tiny Shakespeare.
pub fn shakespeare(n: usize) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/tinyshakespeare.txt");
    std::fs::read_to_string(path)
        .unwrap()
        .chars()
        .take(n)
        .collect()
}

/// Writes a small corpus into `dir` and returns its path.
pub fn corpus_in(dir: &Path) -> PathBuf {
    let path = dir.join("corpus.txt");
    std::fs::write(&path, shakespeare(20_000)).unwrap();
    path
}

/// A new run of `config` on the CPU backend over a small corpus written into `dir`, writing to
/// `dir/out`.
pub fn new_trainer(
    config: TrainConfig,
    dir: &Path,
    out: &str,
) -> Result<cinder::train::Trainer, cinder::train::TrainError> {
    let data_path = corpus_in(dir);
    let data = cinder::data::TrainingData::load(
        &data_path,
        None,
        config.train_fraction,
        config.block_size,
    )
    .unwrap();
    cinder::train::Trainer::new(
        config,
        backend(),
        data.tokenizer,
        data.splits,
        data_path,
        dir.join(out),
    )
}

/// A model small enough that a step takes milliseconds.
pub fn tiny_config() -> TrainConfig {
    TrainConfig {
        n_layer: 2,
        n_head: 2,
        n_embd: 32,
        block_size: 16,
        batch_size: 4,
        max_iters: 20,
        warmup_iters: 5,
        lr_decay_iters: 20,
        eval_interval: 5,
        eval_iters: 2,
        log_interval: 1,
        checkpoint_interval: 5,
        ..TrainConfig::default()
    }
}

/// The flags that make `train` use [`tiny_config`].
pub fn tiny_flags() -> Vec<String> {
    tiny_flags_with(&[])
}

/// [`tiny_flags`] with some flags given other values, as `("--max-iters", "100")`.
pub fn tiny_flags_with(changes: &[(&str, &str)]) -> Vec<String> {
    let c = tiny_config();
    [
        ("--n-layer", c.n_layer.to_string()),
        ("--n-head", c.n_head.to_string()),
        ("--n-embd", c.n_embd.to_string()),
        ("--block-size", c.block_size.to_string()),
        ("--batch-size", c.batch_size.to_string()),
        ("--max-iters", c.max_iters.to_string()),
        ("--warmup-iters", c.warmup_iters.to_string()),
        ("--lr-decay-iters", c.lr_decay_iters.to_string()),
        ("--eval-interval", c.eval_interval.to_string()),
        ("--eval-iters", c.eval_iters.to_string()),
        ("--log-interval", c.log_interval.to_string()),
        ("--checkpoint-interval", c.checkpoint_interval.to_string()),
    ]
    .into_iter()
    .flat_map(|(f, v)| {
        let v = changes
            .iter()
            .find(|(g, _)| *g == f)
            .map_or(v, |(_, w)| w.to_string());
        [f.to_string(), v]
    })
    .collect()
}

/// Runs `cmd`, checks that it succeeds, and returns what it printed on stdout.
pub fn stdout_of(mut cmd: impl std::borrow::BorrowMut<assert_cmd::Command>) -> String {
    let out = cmd
        .borrow_mut()
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    String::from_utf8(out).unwrap()
}
