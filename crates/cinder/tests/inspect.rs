//! The attention inspector through its binary.

mod common;

use assert_cmd::Command;
use cinder::inspect::AttentionMaps;
use common::{corpus_in, tiny_flags_with};

#[test]
fn writes_a_png_and_json_that_round_trips_and_prints_the_focus() {
    let dir = tempfile::tempdir().unwrap();
    Command::cargo_bin("train")
        .unwrap()
        .current_dir(dir.path())
        .arg("--data")
        .arg(corpus_in(dir.path()))
        .args(tiny_flags_with(&[("--max-iters", "3")]))
        .args(["--out", "run"])
        .assert()
        .success();
    let run = |text: &str, more: &[&str]| {
        let mut cmd = Command::cargo_bin("inspect").unwrap();
        cmd.current_dir(dir.path())
            .args([
                "--checkpoint",
                "run",
                "--out",
                "maps",
                "--top",
                "2",
                "--text",
                text,
            ])
            .args(more);
        cmd
    };
    let inspect = |text: &str, more: &[&str]| {
        let out = run(text, more).assert().success().get_output().clone();
        (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let (stdout, _) = inspect("First Citizen", &[]);
    // 2 layers x 2 heads, two characters each, for the last position.
    assert!(stdout.starts_with("position 12 (\"n\")"), "{stdout}");
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.trim_start().starts_with("layer"))
            .count(),
        4,
        "{stdout}"
    );

    let png = std::fs::read(dir.path().join("maps/attention.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let json = std::fs::read_to_string(dir.path().join("maps/attention.json")).unwrap();
    let maps: AttentionMaps = serde_json::from_str(&json).unwrap();
    assert_eq!(
        serde_json::to_string(&maps).unwrap(),
        json,
        "the JSON round-trips"
    );
    assert_eq!(maps.tokens.concat(), "First Citizen");
    assert_eq!(maps.shape(), (2, 2));
    for head in maps.weights.iter().flatten() {
        for (q, row) in head.iter().enumerate() {
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5);
            assert!(row[q + 1..].iter().all(|&w| w == 0.0));
        }
    }
    let focus = maps.focus(12, 2);
    assert!(
        focus
            .iter()
            .all(|f| f.top.len() == 2 && f.top[0].2 >= f.top[1].2)
    );

    // Files already there are replaced only when asked.
    let refused = run("Citizen", &[]).assert().failure().get_output().clone();
    let stderr = String::from_utf8(refused.stderr).unwrap();
    assert!(stderr.contains("--overwrite"), "{stderr}");
    let kept = std::fs::read_to_string(dir.path().join("maps/attention.json")).unwrap();
    assert_eq!(kept, json);

    // Longer than the context (16): the last window, said so.
    let (_, stderr) = inspect("First Citizen: Before we proceed", &["--overwrite"]);
    assert!(stderr.contains("inspecting its last 16"), "{stderr}");
    let json = std::fs::read_to_string(dir.path().join("maps/attention.json")).unwrap();
    let maps: AttentionMaps = serde_json::from_str(&json).unwrap();
    assert_eq!(maps.tokens.concat(), "Before we proceed"[1..].to_string());
}
