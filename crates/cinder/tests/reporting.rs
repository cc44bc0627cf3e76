//! What a run leaves for people to look at: the metrics file, the loss curve, `evaluate`.

mod common;

use std::path::Path;

use assert_cmd::Command;
use cinder::run::metrics;
use cinder::storage::names;
use common::{corpus_in, tiny_flags_with};

fn train(dir: &Path, flags: &[(&str, &str)]) -> Command {
    let mut cmd = Command::cargo_bin("train").unwrap();
    cmd.current_dir(dir)
        .arg("--data")
        .arg(corpus_in(dir))
        .args(tiny_flags_with(flags));
    cmd.arg("--out").arg(dir.join("run"));
    cmd
}

#[test]
fn metrics_file_is_well_formed_and_continues_across_a_resume() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    train(
        dir.path(),
        &[
            ("--max-iters", "12"),
            ("--log-interval", "2"),
            ("--eval-interval", "5"),
        ],
    )
    .assert()
    .success();
    let text = std::fs::read_to_string(run.join(cinder::storage::names::METRICS)).unwrap();
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("iter,train_loss,val_loss,eval_train_loss,lr,tokens_per_s,elapsed_s")
    );
    assert!(lines.all(|l| l.split(',').count() == 7), "{text}");
    let rows = metrics::read(&run.join(cinder::storage::names::METRICS)).unwrap();
    let iters: Vec<u64> = rows.iter().map(|r| r.iter).collect();
    assert_eq!(iters, [2, 4, 5, 6, 8, 10, 12]);
    let evaluated: Vec<u64> = rows
        .iter()
        .filter(|r| r.val_loss.is_some())
        .map(|r| r.iter)
        .collect();
    assert_eq!(evaluated, [5, 10, 12]);

    // A crash after the last checkpoint (iteration 10... here: rows logged past it) is simulated by
    // resuming from best/ at iteration 12 after adding a stray row: resume drops rows beyond it.
    std::fs::write(
        run.join(cinder::storage::names::METRICS),
        format!("{text}14,1.0,,,1e-4,1.0,99.0\n"),
    )
    .unwrap();
    Command::cargo_bin("train")
        .unwrap()
        .current_dir(dir.path())
        .arg("--resume")
        .arg(&run)
        .args(["--max-iters", "16"])
        .assert()
        .success();
    let rows = metrics::read(&run.join(cinder::storage::names::METRICS)).unwrap();
    let iters: Vec<u64> = rows.iter().map(|r| r.iter).collect();
    assert_eq!(
        iters,
        [2, 4, 5, 6, 8, 10, 12, 14, 15, 16],
        "appended, no iteration twice"
    );
    assert!(
        rows.windows(2).all(|w| w[1].elapsed_s >= w[0].elapsed_s),
        "wall time continues"
    );
}

#[test]
fn loss_png_is_a_real_picture() {
    let dir = tempfile::tempdir().unwrap();
    train(
        dir.path(),
        &[("--max-iters", "10"), ("--eval-interval", "5")],
    )
    .assert()
    .success();
    let png = std::fs::read(dir.path().join("run/loss.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert!(png.len() > 10_000, "{} bytes", png.len());
    // Width and height from the IHDR chunk.
    let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(png[20..24].try_into().unwrap());
    assert_eq!((width, height), (900, 560));
}

#[test]
fn evaluate_prefers_the_text_a_model_overfit() {
    let dir = tempfile::tempdir().unwrap();
    // A small text, learnt by heart.
    let known = "the quick brown fox jumps over the lazy dog. ".repeat(60);
    std::fs::write(dir.path().join("known.txt"), &known).unwrap();
    // The same characters in another order.
    let other: String = known
        .split(' ')
        .rev()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .rev()
        .collect();
    std::fs::write(dir.path().join("other.txt"), &other).unwrap();
    Command::cargo_bin("train")
        .unwrap()
        .current_dir(dir.path())
        .args(["--data", "known.txt", "--out", "run"])
        .args(tiny_flags_with(&[
            ("--max-iters", "150"),
            ("--lr-decay-iters", "150"),
            ("--eval-interval", "150"),
            ("--log-interval", "50"),
        ]))
        .args(["--learning-rate", "3e-3"])
        .assert()
        .success();
    let measure = |args: &[&str]| -> (f64, f64, f64) {
        // "loss 0.1234 nats/char, perplexity 1.131, 0.1780 bits/char"
        let out = common::stdout_of(
            Command::cargo_bin("evaluate")
                .unwrap()
                .current_dir(dir.path())
                .args(["--checkpoint", "run", "--quiet"])
                .args(args),
        );
        let words: Vec<&str> = out.split_whitespace().collect();
        let num = |i: usize| -> f64 { words[i].trim_end_matches(',').parse().unwrap() };
        (num(1), num(4), num(5))
    };
    let (train_loss, perplexity, bits) = measure(&["--split", "train"]);
    let (other_loss, _, _) = measure(&["--data", "other.txt"]);
    assert!(
        train_loss < 0.5 * other_loss,
        "train {train_loss}, other {other_loss}"
    );
    assert!(
        (bits - train_loss / std::f64::consts::LN_2).abs() < 1e-3,
        "{bits} vs {train_loss}"
    );
    assert!((perplexity - train_loss.exp()).abs() < 1e-2 * perplexity);
}

/// `evaluate --per-token FILE`: a line per predicted token, whose surprises average to the loss
/// `evaluate` prints without it; the file is never overwritten.
#[test]
fn evaluate_per_token_writes_each_surprise_and_their_mean_is_the_loss() {
    let dir = tempfile::tempdir().unwrap();
    Command::cargo_bin("train")
        .unwrap()
        .current_dir(dir.path())
        .arg("--data")
        .arg(common::corpus_in(dir.path()))
        .args(["--out", "run"])
        .args(tiny_flags_with(&[]))
        .assert()
        .success();
    let text = "ROMEO:\nWhat, shall this speech be spoke for our excuse?\nOr shall we on";
    std::fs::write(dir.path().join("text.txt"), text).unwrap();
    let evaluate = |extra: &[&str]| {
        let mut cmd = Command::cargo_bin("evaluate").unwrap();
        cmd.current_dir(dir.path())
            .args(["--checkpoint", "run", "--data", "text.txt", "--quiet"])
            .args(extra);
        cmd
    };
    let loss = |out: String| -> f64 { out.split_whitespace().nth(1).unwrap().parse().unwrap() };
    let plain = loss(common::stdout_of(&mut evaluate(&[])));
    let with_file = loss(common::stdout_of(&mut evaluate(&[
        "--per-token",
        "tokens.csv",
    ])));
    assert!((plain - with_file).abs() < 2e-4, "{plain} vs {with_file}");

    let csv = std::fs::read_to_string(dir.path().join("tokens.csv")).unwrap();
    let records = parse_csv(&csv);
    assert_eq!(
        records[0],
        ["position", "id", "token", "surprise_nats", "surprise_bits"]
    );
    // A text of 70 characters and a context of 16 predictions: 4 windows, 64 predicted.
    let rows = &records[1..];
    assert_eq!(rows.len(), 64, "{csv}");
    let chars: Vec<char> = text.chars().collect();
    let mut total = 0.0;
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row[0], (i + 1).to_string());
        assert_eq!(row[2], chars[i + 1].to_string(), "row {i}: {row:?}");
        let (nats, bits): (f64, f64) = (row[3].parse().unwrap(), row[4].parse().unwrap());
        assert!(nats > 0.0 && (bits - nats / std::f64::consts::LN_2).abs() < 1e-5);
        total += nats;
    }
    assert!(
        (total / 64.0 - plain).abs() < 2e-4,
        "{} vs {plain}",
        total / 64.0
    );
    common::fails_with(
        &mut evaluate(&["--per-token", "tokens.csv"]),
        &["tokens.csv exists already"],
    );
    // The 5 characters after the last window are not predicted, and evaluate says so.
    let told = common::stdout_of(
        Command::cargo_bin("evaluate")
            .unwrap()
            .current_dir(dir.path())
            .args(["--checkpoint", "run", "--data", "text.txt"]),
    );
    assert!(
        told.contains("64 characters predicted")
            && told.contains("the last 5 characters, short of a window of 16, not predicted"),
        "{told}"
    );
}

/// The records of a CSV text: fields split at commas outside quotes, quotes doubled inside.
fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let (mut records, mut record, mut field) = (Vec::new(), Vec::new(), String::new());
    let (mut quoted, mut chars) = (false, text.chars().peekable());
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            ('"', _) => quoted = !quoted,
            (',', false) => record.push(std::mem::take(&mut field)),
            ('\n', false) => {
                record.push(std::mem::take(&mut field));
                records.push(std::mem::take(&mut record));
            }
            (c, _) => field.push(c),
        }
    }
    records
}

#[test]
fn each_evaluation_samples_what_generate_writes_and_the_losses_do_not_change() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let flags = [
        ("--max-iters", "6"),
        ("--eval-interval", "3"),
        ("--sample-tokens", "40"),
        ("--seed", "7"),
    ];
    train(dir.path(), &flags).assert().success();
    let samples = cinder::storage::samples::read(&run.join(names::SAMPLES)).unwrap();
    let iters: Vec<u64> = samples.iter().map(|s| s.iter).collect();
    assert_eq!(iters, [3, 6], "one sample per evaluation");
    assert_ne!(
        samples[0].text, samples[1].text,
        "the model learned meanwhile"
    );

    // The last sample is what `generate` writes with the run's seed from the last checkpoint
    // (taken at the same iteration), after its default prompt, a new line.
    let generated = common::stdout_of(
        Command::cargo_bin("generate")
            .unwrap()
            .arg("--checkpoint")
            .arg(run.join("latest"))
            .args(["--seed", "7", "--max-new-tokens", "40", "--quiet"]),
    );
    let generated = generated.strip_suffix('\n').unwrap(); // `generate` ends with a new line
    assert_eq!(samples[1].text, format!("\n{generated}"));

    // Without samples, the same losses.
    let losses = |run: &Path| -> Vec<(u64, f32, Option<f32>)> {
        metrics::read(&run.join(names::METRICS))
            .unwrap()
            .iter()
            .map(|r| (r.iter, r.train_loss, r.val_loss))
            .collect()
    };
    let with = losses(&run);
    let mut off = flags.to_vec();
    off[2].1 = "0";
    train(dir.path(), &off)
        .arg("--overwrite")
        .assert()
        .success();
    assert_eq!(losses(&run), with);
    let samples = cinder::storage::samples::read(&run.join(names::SAMPLES)).unwrap();
    assert!(samples.is_empty(), "--sample-tokens 0 writes none");
}
