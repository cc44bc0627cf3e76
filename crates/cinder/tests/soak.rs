//! Crashes, a full disk and a busy run folder, through the `train` binary: `kill -9` at chosen
//! moments (held there by the test-only `CINDER_TEST_STALL`, see `cinder::faults`), and
//! checkpoint writes that fail with ENOSPC (`CINDER_TEST_WRITE_BUDGET`). Each time the run
//! folder stays loadable, and a resumed run ends with exactly the weights of a run never
//! interrupted. A trainer held mid-step keeps other trainers out of its folder, not readers.
//! Built only with the `fault-injection` feature.
//!
//! The moments are drawn from a seed, printed; `CINDER_SOAK_SEED=<n>` replays a draw.

mod common;

use std::path::Path;
use std::process::Command;

use burn::prelude::*;
use cinder::storage::checkpoint;
use common::{corpus_in, fails_with, snapshot, stalled, tiny_config, tiny_flags, tiny_flags_with};
use rand::{Rng, SeedableRng};

const TRAIN: &str = env!("CARGO_BIN_EXE_train");
const GENERATE: &str = env!("CARGO_BIN_EXE_generate");

fn train(dir: &Path, run: &Path, changes: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(TRAIN);
    cmd.current_dir(dir)
        .arg("--quiet")
        .arg("--data")
        .arg(dir.join("corpus.txt"))
        .args(tiny_flags_with(changes))
        .arg("--out")
        .arg(run);
    cmd
}

fn resume(dir: &Path, run: &Path) -> Command {
    let mut cmd = Command::new(TRAIN);
    cmd.current_dir(dir)
        .arg("--quiet")
        .arg("--resume")
        .arg(run)
        .arg("--max-iters")
        .arg(tiny_config().max_iters.to_string());
    cmd
}

/// Runs `cmd` to the end; panics with its output if it fails.
fn succeed(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every parameter of the model in the checkpoint `dir`, in visiting order.
fn weights(dir: &Path) -> Vec<Vec<f32>> {
    let meta = checkpoint::load_meta(dir).unwrap();
    common::weights(&checkpoint::load_model(dir, &meta, &Device::default()).unwrap())
}

/// The final weights of an uninterrupted run.
fn reference(dir: &Path) -> Vec<Vec<f32>> {
    let run = dir.join("reference");
    succeed(&mut train(dir, &run, &[]));
    weights(&run.join("latest"))
}

/// After a crash or a failed write: `generate` loads the folder, and resuming finishes with the
/// reference weights, leaving no temporary folder behind.
fn recovers(dir: &Path, run: &Path, want: &[Vec<f32>], what: &str) {
    succeed(Command::new(GENERATE).arg("--checkpoint").arg(run).args([
        "--max-new-tokens",
        "5",
        "--quiet",
    ]));
    succeed(&mut resume(dir, run));
    let latest = run.join("latest");
    assert_eq!(
        checkpoint::load_meta(&latest).unwrap().iter,
        tiny_config().max_iters
    );
    assert!(
        weights(&latest) == want,
        "{what}: weights differ from the uninterrupted run"
    );
    for name in [".latest.tmp", ".latest.old", ".best.tmp", ".best.old"] {
        assert!(!run.join(name).exists(), "{what}: {name} left behind");
    }
}

#[test]
fn kill_9_at_eight_moments_then_resume_to_the_same_weights() {
    let seed = std::env::var("CINDER_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs()
        });
    println!("soak seed {seed} (replay with CINDER_SOAK_SEED={seed})");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    corpus_in(dir.path());
    let want = reference(dir.path());

    // The tiny run: 20 steps, an evaluation (2 splits x 2 batches) every 5, then best/ (when
    // the loss improved) and latest/. Every moment drawn comes after the first checkpoint
    // (best/ at step 5), so that there is something to load.
    let c = tiny_config();
    let steps = c.max_iters;
    let eval_batches = (2 * c.eval_iters) as u64 * (steps / c.eval_interval);
    let mut moments: Vec<String> = Vec::new();
    for _ in 0..2 {
        moments.push(format!(
            "step:{}",
            rng.random_range(c.checkpoint_interval + 2..=steps)
        ));
        let first_eval = 2 * c.eval_iters as u64;
        moments.push(format!(
            "eval:{}",
            rng.random_range(first_eval + 1..=eval_batches)
        ));
    }
    for point in [
        "checkpoint-written",
        "checkpoint-swapped",
        "checkpoint-installed",
    ] {
        moments.push(format!("{point}:{}", rng.random_range(2..=4)));
    }
    moments.push(format!("checkpoint-swapped:{}", rng.random_range(2..=4)));
    assert_eq!(moments.len(), 8);

    for (i, at) in moments.iter().enumerate() {
        let run = dir.path().join(format!("run-{i}"));
        let mut child = stalled(&mut train(dir.path(), &run, &[]), at);
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        recovers(dir.path(), &run, &want, &format!("killed at {at}"));
    }
}

#[test]
fn a_full_disk_fails_cleanly_and_the_run_resumes() {
    let dir = tempfile::tempdir().unwrap();
    corpus_in(dir.path());
    let want = reference(dir.path());
    let run = dir.path().join("run");
    succeed(&mut train(dir.path(), &run, &[("--max-iters", "5")]));
    let before = weights(&run.join("latest"));

    // The next checkpoint write runs out of space after 1,000 bytes.
    let out = resume(dir.path(), &run)
        .env("CINDER_TEST_WRITE_BUDGET", "1000")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert!(
        stderr.contains("the previous checkpoint there, if any, is intact"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        weights(&run.join("latest")) == before,
        "latest/ is untouched"
    );

    recovers(dir.path(), &run, &want, "after ENOSPC");
}

fn train_in(dir: &Path) -> assert_cmd::Command {
    let mut cmd = assert_cmd::Command::cargo_bin("train").unwrap();
    cmd.current_dir(dir);
    cmd
}

#[test]
fn a_second_trainer_is_refused_while_readers_read_and_kill_9_frees_the_folder() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let data = corpus_in(dir.path());
    // The first trainer holds the folder, stalled in step 8 (latest/ was written at step 5).
    let mut first = stalled(
        std::process::Command::new(env!("CARGO_BIN_EXE_train"))
            .current_dir(dir.path())
            .arg("--data")
            .arg(&data)
            .args(tiny_flags())
            .arg("--out")
            .arg(&run),
        "step:8",
    );
    let before = snapshot(&run);
    let pid = first.id().to_string();
    for extra in [&["--overwrite"][..], &[]] {
        fails_with(
            train_in(dir.path())
                .arg("--data")
                .arg(&data)
                .args(tiny_flags())
                .arg("--out")
                .arg(&run)
                .args(extra),
            &["in use by another train process", &pid, "run"],
        );
    }
    fails_with(
        train_in(dir.path()).arg("--resume").arg(&run),
        &["in use by another train process", &pid],
    );
    assert!(
        snapshot(&run) == before,
        "the refused trainers touched nothing"
    );
    // Readers are not locked out.
    assert_cmd::Command::cargo_bin("generate")
        .unwrap()
        .arg("--checkpoint")
        .arg(&run)
        .args(["--max-new-tokens", "5", "--quiet"])
        .assert()
        .success();
    assert_cmd::Command::cargo_bin("evaluate")
        .unwrap()
        .arg("--checkpoint")
        .arg(&run)
        .assert()
        .success();

    first.kill().unwrap(); // SIGKILL: the OS releases the lock
    first.wait().unwrap();
    train_in(dir.path())
        .arg("--resume")
        .arg(&run)
        .arg("--quiet")
        .assert()
        .success();
}
