//! `train --time`: a run planned for a time budget, end to end on a small text.
//!
//! The tests that give `train` the speeds it would measure (`CINDER_TEST_SPEEDS`, so that the
//! plan is the same on any machine) need the feature `fault-injection`, which no release binary
//! has: `cargo test --release --features cinder/fault-injection --test time_budget`.

mod common;

use std::path::Path;
use std::time::Instant;

use assert_cmd::Command;
use common::corpus_in;

/// Speeds for the ladder's shapes as measuring would report them on a slow machine, and the
/// seconds spent before planning: with them a plan is the same on any machine.
#[cfg(feature = "fault-injection")]
const SPEEDS: &str = r#"{"spent": 0.5, "speeds": [
    {"step": 0.05, "eval_batch": 0.01, "save": 0.01},
    {"step": 0.15, "eval_batch": 0.03, "save": 0.02},
    {"step": 0.45, "eval_batch": 0.09, "save": 0.04}
]}"#;

/// `train` on a small text in `dir`, the machine measured.
fn train_in(dir: &Path) -> Command {
    let mut cmd = Command::cargo_bin("train").unwrap();
    cmd.current_dir(dir).arg("--data").arg(corpus_in(dir));
    cmd
}

/// `train --time budget` with the speeds of [`SPEEDS`].
#[cfg(feature = "fault-injection")]
fn timed(dir: &Path, budget: &str, out: &str) -> Command {
    let mut cmd = train_in(dir);
    cmd.env("CINDER_TEST_SPEEDS", SPEEDS).args([
        "--time",
        budget,
        "--log-interval",
        "1",
        "--out",
        out,
    ]);
    cmd
}

/// The losses of metrics.csv (the timing columns left out).
#[cfg(feature = "fault-injection")]
fn losses(run: &Path) -> Vec<String> {
    std::fs::read_to_string(run.join("metrics.csv"))
        .unwrap()
        .lines()
        .map(|l| l.split(',').take(5).collect::<Vec<_>>().join(","))
        .collect()
}

#[cfg(feature = "fault-injection")]
#[test]
fn a_planned_run_writes_its_choice_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let out = common::stdout_of(timed(dir.path(), "30s", "straight"));
    let chose = out.lines().find(|l| l.starts_with("chose ")).expect(&out);
    // 18,000 training characters: the smallest shape, which reads them many times.
    assert!(chose.contains("2 x 64 (2 heads), context 64"), "{chose}");
    assert!(chose.contains("dropout 0.1"), "{chose}");
    let config =
        cinder::config::TrainConfig::load(&dir.path().join("straight/config.toml")).unwrap();
    assert_eq!(config.time_budget.to_string(), "30s");
    assert_eq!((config.n_layer, config.n_embd), (2, 64));
    assert_eq!(config.lr_decay_iters, config.max_iters);
    assert!(config.max_iters >= cinder::run::plan::MIN_STEPS);
    assert_eq!(config.early_stop, cinder::run::plan::EARLY_STOP);
    assert!(
        out.contains("of the 30s budget"),
        "the summary gives the wall time: {out}"
    );

    // The same plan, stopped part-way (SIGTERM saves latest/) and resumed: the same losses.
    let run = dir.path().join("stopped");
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("train"))
        .current_dir(dir.path())
        .env("CINDER_TEST_SPEEDS", SPEEDS)
        .arg("--data")
        .arg(corpus_in(dir.path()))
        .args(["--time", "30s", "--log-interval", "1", "--out"])
        .arg(&run)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    common::terminate_once_saved(&mut child, &run);
    assert!(child.wait().unwrap().success());
    let stopped_at = cinder::storage::checkpoint::load_meta(&run.join("latest"))
        .unwrap()
        .iter;
    assert!(stopped_at < config.max_iters, "stopped at {stopped_at}");
    let resumed = common::stdout_of(
        Command::cargo_bin("train")
            .unwrap()
            .current_dir(dir.path())
            .env_remove("CINDER_TEST_SPEEDS")
            .arg("--resume")
            .arg(&run),
    );
    assert!(
        !resumed.contains("measuring") && !resumed.contains("chose "),
        "a resume keeps the plan: {resumed}"
    );
    assert_eq!(losses(&run), losses(&dir.path().join("straight")));
    assert!(run.join("best/meta.json").is_file());
}

#[cfg(feature = "fault-injection")]
#[test]
fn a_budget_too_small_says_the_least_that_works() {
    let dir = tempfile::tempdir().unwrap();
    // 2 s, less 0.5 spent and the reserve, leaves no room for 300 steps of 50 ms.
    common::fails_with(
        &mut timed(dir.path(), "2s", "run"),
        &[
            "a time budget of 2s is too small",
            "2 x 64",
            "The least that works here is about --time 19s",
        ],
    );
    assert!(!dir.path().join("run/latest").exists());
}

/// Measured for real: one second leaves nothing once the reserve is kept, on any machine.
#[test]
fn a_budget_too_small_for_this_machine_is_refused_before_training() {
    let dir = tempfile::tempdir().unwrap();
    common::fails_with(
        train_in(dir.path()).args(["--time", "1s", "--out", "run"]),
        &[
            "a time budget of 1s is too small",
            "The least that works here is about --time ",
        ],
    );
    assert!(!dir.path().join("run/latest").exists());
}

#[test]
fn flags_that_contradict_a_budget_are_refused_before_the_folder_is_touched() {
    let dir = tempfile::tempdir().unwrap();
    // A malformed duration is clap's usage error (status 2), with the forms that work.
    let out = train_in(dir.path())
        .args(["--time", "ten minutes", "--out", "run"])
        .assert()
        .code(2)
        .get_output()
        .clone();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("not a duration") && stderr.contains("10m"),
        "{stderr}"
    );
    // Refused before the folder is touched: --overwrite moves no old run aside.
    let old = dir.path().join("old");
    std::fs::create_dir(&old).unwrap();
    std::fs::write(old.join("config.toml"), "").unwrap();
    common::fails_with(
        train_in(dir.path()).args([
            "--time",
            "1m",
            "--out",
            "old",
            "--max-iters",
            "100",
            "--overwrite",
        ]),
        &["cannot go with --max-iters"],
    );
    assert!(old.join("config.toml").is_file());
    assert!(!dir.path().join("old.old-1").exists());
}

/// Without injected speeds the machine is measured, and the run ends near its budget.
#[test]
fn a_measured_run_ends_within_its_budget() {
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let out = common::stdout_of(
        train_in(dir.path())
            // Small steps, so that the smallest shape's 300 fit in 30 s on a slow, busy machine
            // (beside the other tests, in a fresh clone on a 2-core host, a step of this shape
            // took 32 ms and a checkpoint 368 ms: 15 s was too small there).
            .args(["--time", "30s", "--batch-size", "4", "--block-size", "32"])
            .args(["--out", "run"]),
    );
    let wall = started.elapsed().as_secs_f64();
    assert!(out.contains("measuring this machine"), "{out}");
    assert!(out.contains("chose "), "{out}");
    // Tests run side by side here: a loose bound, which a run that ignored its budget (or
    // planned for steps that do not fit) still fails.
    assert!(wall < 30.0 * 1.5, "{wall} s: {out}");
    assert!(!dir.path().join("run/.measuring").exists());
}
