//! The binaries end to end, on a small text in a temporary folder.

mod common;

use std::path::Path;
use std::process::Stdio;

use assert_cmd::Command;
use common::{corpus_in, shakespeare, tiny_flags, tiny_flags_with};

fn train(dir: &Path) -> Command {
    let mut cmd = Command::cargo_bin("train").unwrap();
    cmd.current_dir(dir)
        .arg("--data")
        .arg(corpus_in(dir))
        .args(tiny_flags());
    cmd
}

fn generate(checkpoint: &Path) -> Command {
    let mut cmd = Command::cargo_bin("generate").unwrap();
    cmd.arg("--checkpoint").arg(checkpoint);
    cmd
}

#[test]
fn train_then_generate_exactly_the_requested_characters() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let out = common::stdout_of(train(dir.path()).arg("--out").arg(&run));
    assert!(
        out.contains("backend flex"),
        "start-up names the backend: {out}"
    );
    assert!(run.join("best/meta.json").is_file() && run.join("latest/model.bpk").is_file());
    assert!(
        run.join("config.toml").is_file(),
        "the resolved config is saved with the run"
    );

    let sample = |seed: &str| {
        common::stdout_of(generate(&run).args([
            "--max-new-tokens",
            "123",
            "--quiet",
            "--seed",
            seed,
            "--prompt",
            "ROMEO:",
        ]))
    };
    let text = sample("7");
    let generated = text.strip_suffix('\n').unwrap();
    assert_eq!(generated.chars().count(), 123, "{text:?}");
    let vocab: std::collections::BTreeSet<char> = shakespeare(20_000).chars().collect();
    assert!(
        generated.chars().all(|c| vocab.contains(&c)),
        "{generated:?}"
    );
    assert_eq!(sample("7"), text, "same seed, same text");
    assert_ne!(sample("8"), text, "another seed, another text");
}

/// `generate --show-probs --alternatives 3`: greedy text picks the most likely token, which the
/// table shows first among the alternatives; colours only where asked for (not to a pipe).
#[test]
fn generate_shows_each_tokens_probability_and_alternatives() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    train(dir.path()).arg("--out").arg(&run).assert().success();
    let args = [
        "--max-new-tokens",
        "20",
        "--quiet",
        "--temperature",
        "0",
        "--prompt",
        "ROMEO:",
    ];
    let out =
        common::stdout_of(
            generate(&run)
                .args(args)
                .args(["--show-probs", "--alternatives", "3"]),
        );
    assert!(!out.contains('\u{1b}'), "no colour to a pipe: {out:?}");
    let plain = common::stdout_of(generate(&run).args(args));
    let (text, table) = out.split_once("--- the first sample's tokens").unwrap();
    assert_eq!(text, plain);
    let rows: Vec<&str> = table.lines().skip(1).collect();
    assert_eq!(rows.len(), 20, "{table}");
    for row in rows {
        // "    3        "e" 0.412: "e" 0.412, "a" 0.301, " " 0.120"
        let (chosen, alternatives) = row.split_once(": ").unwrap();
        let (_position, chosen) = chosen.trim_start().split_once(' ').unwrap();
        assert_eq!(alternatives.matches(", ").count(), 2, "{row}");
        assert!(
            alternatives.starts_with(chosen.trim_start()),
            "greedy picks the first: {row}"
        );
    }
    let coloured = generate(&run)
        .args(args)
        .arg("--show-probs")
        .env("CLICOLOR_FORCE", "1")
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&coloured.stdout).contains("\u{1b}["),
        "colours when forced"
    );
}

/// `--early-stop 2` on a run that learns nothing (learning rates of 1e-30 leave every weight as
/// it was, in f32): evaluations at 2 (the best), 4 and 6, then it stops and says so; the
/// summary counts the epochs seen.
#[test]
fn train_stops_early_and_counts_epochs() {
    let dir = tempfile::tempdir().unwrap();
    let frozen = [
        ("--learning-rate", "1e-30"),
        ("--min-lr", "1e-31"),
        ("--max-iters", "50"),
        ("--eval-interval", "2"),
        ("--early-stop", "2"),
    ];
    let out = common::stdout_of(
        Command::cargo_bin("train")
            .unwrap()
            .current_dir(dir.path())
            .arg("--data")
            .arg(corpus_in(dir.path()))
            .args(tiny_flags_with(&frozen))
            .args(["--out", "run"]),
    );
    assert!(out.contains("stopped early at iteration 6 of 50"), "{out}");
    // 6 steps of 4 windows of 16 over the training split: 90% of 20,000 characters, less one.
    let epochs = 6.0 * 4.0 * 16.0 / 17_999.0;
    assert!(
        out.contains(&format!("{epochs:.2} epochs of the training split")),
        "{out}"
    );
}

#[test]
fn several_samples_are_separated_and_the_summary_goes_to_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    train(dir.path()).arg("--out").arg(&run).assert().success();
    let output = generate(&run)
        .args([
            "--max-new-tokens",
            "40",
            "--num-samples",
            "3",
            "--prompt",
            "A",
        ])
        .assert()
        .success()
        .get_output()
        .clone();
    let stdout = String::from_utf8(output.stdout).unwrap();
    let samples: Vec<&str> = stdout.trim_end().split("\n---------------\n").collect();
    assert_eq!(samples.len(), 3, "{stdout}");
    for s in &samples {
        assert!(s.starts_with('A') && s.chars().count() == 41, "{s:?}");
    }
    let stderr = String::from_utf8(output.stderr).unwrap();
    // The first token's time apart (the prompt's pass), then the decoding's speed.
    let report = stderr.lines().last().unwrap_or_default();
    assert!(
        report.starts_with("generated 120 characters in ")
            && report.contains("(the first after ")
            && report.contains(" ms, then ")
            && report.ends_with(" characters/s)"),
        "{stderr}"
    );
}

#[test]
fn generation_is_the_same_with_and_without_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    train(dir.path()).arg("--out").arg(&run).assert().success();
    // Past block_size (16), so the sliding window is exercised too.
    let text = |extra: &[&str]| {
        common::stdout_of(
            generate(&run)
                .args(["--max-new-tokens", "60", "--quiet", "--temperature", "0"])
                .args(extra),
        )
    };
    assert_eq!(text(&[]), text(&["--no-cache"]));
}

/// An interrupt before training begins (here while `--time` measures the machine) ends the
/// program at once and says so, rather than killing it without a word.
#[test]
fn an_interrupt_before_training_stops_at_once_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut child = spawn_train(dir.path(), &["--time", "1h"], &run);
    let measuring = run.join(cinder::storage::names::MEASURING);
    common::signal_once_there(&mut child, &measuring, "-INT");
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("before training began"), "{stderr}");
    assert!(!run.join("latest").exists());
}

/// `train` on the test corpus in `dir` with `flags`, into `run`, its output piped.
fn spawn_train(dir: &Path, flags: &[&str], run: &Path) -> std::process::Child {
    std::process::Command::new(assert_cmd::cargo::cargo_bin("train"))
        .current_dir(dir)
        .arg("--data")
        .arg(corpus_in(dir))
        .args(flags)
        .arg("--out")
        .arg(run)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn sigterm_saves_latest_at_the_reported_iteration() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let flags = tiny_flags_with(&[("--max-iters", "1000000"), ("--log-interval", "1000")]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut child = spawn_train(dir.path(), &flags, &run);
    // Once it has trained a few iterations and written a first latest/.
    common::terminate_once_saved(&mut child, &run);
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        output.status.success(),
        "exit status {:?}: {stdout}",
        output.status
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("stopped at iteration"))
        .expect(&stdout);
    let iter: u64 = line["stopped at iteration ".len()..]
        .split(';')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(iter >= 5);
    let meta = cinder::storage::checkpoint::load_meta(&run.join("latest")).unwrap();
    assert_eq!(meta.iter, iter);
}

#[test]
fn resume_continues_to_the_new_max_iters() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    train(dir.path()).arg("--out").arg(&run).assert().success();
    let out = common::stdout_of(
        Command::cargo_bin("train")
            .unwrap()
            .current_dir(dir.path())
            .arg("--resume")
            .arg(&run)
            .args(["--max-iters", "30"]),
    );
    assert!(
        out.contains("resuming") && out.contains("at iteration 20 of 30"),
        "{out}"
    );
    assert!(out.contains("changed on resume: max_iters = 30"), "{out}");
    assert_eq!(
        cinder::storage::checkpoint::load_meta(&run.join("latest"))
            .unwrap()
            .iter,
        30
    );
}
