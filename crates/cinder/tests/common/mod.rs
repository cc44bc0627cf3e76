//! Helpers shared by the integration tests: a small corpus and a tiny, fast configuration.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;

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
) -> Result<cinder::run::trainer::Trainer, cinder::run::trainer::TrainError> {
    let data = training_data(&corpus_in(dir), &config);
    cinder::run::trainer::Trainer::new(config, backend(), data, dir.join(out))
}

/// The text at `path`, loaded for a run of `config`.
pub fn training_data(path: &Path, config: &TrainConfig) -> cinder::data::TrainingData {
    cinder::data::TrainingData::open(
        &[path.to_path_buf()],
        &cinder::data::TokenizerChoice::of(config),
        config,
        None,
        &mut |_, _, _| {},
    )
    .unwrap()
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

/// The flags that make `train` use [`tiny_config`] (without `--config`, in a folder without
/// `configs/tiny_cpu.toml`: on the built-in copy of the default run's recipe).
pub fn tiny_flags() -> Vec<String> {
    tiny_flags_with(&[])
}

/// [`tiny_flags`] with some flags given other values, as `("--max-iters", "100")`: one flag for
/// every field where [`tiny_config`] differs from the default run's recipe.
pub fn tiny_flags_with(changes: &[(&str, &str)]) -> Vec<String> {
    let (tiny, recipe) = (
        tiny_config().to_table(),
        TrainConfig::default_run().to_table(),
    );
    let mut flags: Vec<(String, String)> = tiny
        .iter()
        .filter(|(field, value)| recipe.get(*field) != Some(*value))
        .map(|(field, value)| {
            let value = match value {
                toml::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (format!("--{}", field.replace('_', "-")), value)
        })
        .collect();
    for (flag, value) in changes {
        match flags.iter_mut().find(|(f, _)| f == flag) {
            Some(slot) => slot.1 = value.to_string(),
            None => flags.push((flag.to_string(), value.to_string())),
        }
    }
    flags.into_iter().flat_map(|(f, v)| [f, v]).collect()
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

/// Every parameter's values, in visiting order.
pub fn weights(model: &impl Module) -> Vec<Vec<f32>> {
    struct All(Vec<Vec<f32>>);
    impl ModuleVisitor for All {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            self.0
                .push(p.val().into_data().try_to_vec::<f32>().unwrap());
        }
    }
    let mut all = All(Vec::new());
    model.visit(&mut all);
    all.0
}

/// Starts `cmd` (a cinder binary) with the test-only `CINDER_TEST_STALL=<at>` (see
/// `cinder::faults`) and returns it once it has stalled there, holding whatever it holds.
pub fn stalled(cmd: &mut Command, at: &str) -> Child {
    let mut child = cmd
        .env("CINDER_TEST_STALL", at)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let stalled = line.starts_with("cinder-test: stalled at");
            let _ = tx.send((stalled, line));
        }
    });
    let start = Instant::now();
    let mut said = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok((true, _)) => return child,
            Ok((false, line)) => said.push(line),
            Err(_) => {}
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("{cmd:?} ended ({status}) before stalling at {at}: {said:?}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "never stalled at {at}"
        );
    }
}

/// Waits until the `train` process `child` has written `run`'s first latest/, then sends it
/// SIGTERM, on which it saves latest/ and exits.
pub fn terminate_once_saved(child: &mut Child, run: &Path) {
    signal_once_there(child, &run.join("latest/meta.json"), "-TERM");
}

/// Waits (at most 2 minutes) until `path` exists while `child` runs, then sends it `signal`
/// (`kill`'s flag: `-TERM`, `-INT`).
pub fn signal_once_there(child: &mut Child, path: &Path, signal: &str) {
    let started = Instant::now();
    while !path.exists() {
        assert!(child.try_wait().unwrap().is_none(), "train exited early");
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// A user error: status 1, a message starting with `error:`, no panic or backtrace.
pub fn fails_with(cmd: &mut assert_cmd::Command, needles: &[&str]) -> String {
    let out = cmd.assert().failure().code(1).get_output().clone();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.lines().any(|l| l.starts_with("error: ")), "{stderr}");
    assert!(
        !stderr.contains("panicked") && !stderr.contains("RUST_BACKTRACE"),
        "{stderr}"
    );
    for needle in needles {
        assert!(stderr.contains(needle), "expected {needle:?} in: {stderr}");
    }
    stderr
}

/// A trained tiny run in `dir/run`.
pub fn trained_run(dir: &Path) -> PathBuf {
    assert_cmd::Command::cargo_bin("train")
        .unwrap()
        .current_dir(dir)
        .arg("--data")
        .arg(corpus_in(dir))
        .args(tiny_flags_with(&[
            ("--max-iters", "2"),
            ("--eval-interval", "1"),
        ]))
        .arg("--out")
        .arg(dir.join("run"))
        .assert()
        .success();
    dir.join("run")
}

/// Rewrites the checkpoint `dir` as format version 1 wrote it: no text identity, one data path,
/// the character vocabulary inline.
pub fn make_format_1(dir: &Path) {
    let path = dir.join("meta.json");
    let mut meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let fields = meta.as_object_mut().unwrap();
    fields.insert("format_version".into(), 1.into());
    fields.remove("data_identity").unwrap();
    fields.remove("data_paths").unwrap();
    assert!(fields["vocab"].is_array(), "format 1 has characters only");
    std::fs::write(&path, serde_json::to_vec_pretty(&meta).unwrap()).unwrap();
}

/// Every file under `dir` with its contents, to see that a refused command touched nothing.
/// The lock file is left out: a trainer that finds the folder free holds it for a moment, and
/// writes its process id there, before it refuses an old run.
pub fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut all = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if !path.ends_with(cinder::storage::names::LOCK) {
                let bytes = std::fs::read(&path).unwrap();
                all.push((path.display().to_string(), bytes));
            }
        }
    }
    all.sort();
    all
}

/// Every tensor of an F32 safetensors file, by name with `prefix` taken off, as its shape and
/// values.
pub fn read_tensors(
    path: &Path,
    prefix: &str,
) -> std::collections::HashMap<String, (Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    file.tensors()
        .into_iter()
        .map(|(name, view)| {
            assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name}");
            let values = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            let name = name.trim_start_matches(prefix).to_string();
            (name, (view.shape().to_vec(), values))
        })
        .collect()
}
