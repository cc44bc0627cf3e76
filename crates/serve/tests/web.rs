//! The page's JSON and what `serve` sees of runs on disk: summaries, curves read on as they grow,
//! samples, attention maps; a trainer seen while it runs; new runs and new checkpoints served
//! without a restart, a request already running finishing on its own; no request reaching a path; a client that leaves freeing its place; the
//! time limit.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cinder::sampling::SamplingParams;
use cinder::storage::checkpoint;
use cinder::storage::names::BEST;
use serde_json::{Value, json};

mod common;
use common::{
    LONG, Server, busy_stream, generated, read, streamed, train, train_binary, trained_run,
};

/// Polls `f` every 50 ms until it gives `Some`, for at most `seconds`.
fn wait_for<T>(seconds: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let until = Instant::now() + Duration::from_secs(seconds);
    loop {
        if let Some(value) = f() {
            return value;
        }
        assert!(Instant::now() < until, "waited {seconds} s for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn run_entry(server: &Server, id: &str) -> Option<Value> {
    let (status, list) = server.get("/api/runs");
    assert_eq!(status, 200, "{list}");
    list["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == id)
        .cloned()
}

#[test]
fn the_page_and_its_json_show_runs_curves_samples_and_attention() {
    let dir = tempfile::tempdir().unwrap();
    train(
        dir.path(),
        "tiny",
        &[("sample-tokens", "20"), ("eval-interval", "5")],
    );
    let server = Server::start(dir.path(), &["--runs", "runs"]);

    let page = Server::agent().get(&server.url).call().unwrap();
    assert_eq!(page.status(), 200);
    // The page may ask only this server.
    let policy = page.headers()["content-security-policy"].to_str().unwrap();
    assert!(policy.starts_with("default-src 'self'"), "{policy}");
    let html = page.into_body().read_to_string().unwrap();
    for asset in [
        "/assets/app.js",
        "/assets/uPlot.iife.min.js",
        "/assets/style.css",
    ] {
        assert!(html.contains(asset), "{asset} in {html}");
        let response = Server::agent()
            .get(format!("{}{asset}", server.url))
            .call()
            .unwrap();
        assert_eq!(response.status(), 200, "{asset}");
    }

    let tiny = run_entry(&server, "tiny").unwrap();
    assert_eq!(tiny["kind"], "run");
    assert_eq!(tiny["iter"], 10);
    assert_eq!(tiny["training"], false);
    assert_eq!(
        (&tiny["arch"]["n_layer"], &tiny["arch"]["n_embd"]),
        (&json!(1), &json!(32))
    );
    assert!(tiny["best_val"].as_f64().is_some_and(|v| v > 0.0), "{tiny}");

    let (status, run) = server.get("/api/run?id=tiny");
    assert_eq!(status, 200, "{run}");
    assert!(
        run["config"].as_str().unwrap().contains("n_embd = 32"),
        "{run}"
    );
    let iters: Vec<&Value> = run["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["iter"])
        .collect();
    assert_eq!(iters, [&json!(5), &json!(10)], "{run}");

    let (status, metrics) = server.get("/api/metrics?id=tiny&offset=0");
    assert_eq!(status, 200, "{metrics}");
    assert_eq!(metrics["columns"][0], "iter");
    let rows = metrics["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 10, "{metrics}");
    let val = metrics["columns"]
        .as_array()
        .unwrap()
        .iter()
        .position(|c| c == "val_loss")
        .unwrap();
    assert!(
        rows[4][val].is_number() && rows[3][val].is_null(),
        "{metrics}"
    );
    let next = format!(
        "/api/metrics?id=tiny&offset={}",
        metrics["offset"].as_str().unwrap()
    );
    let (_, more) = server.get(&next);
    assert_eq!(more["rows"], json!([]), "nothing new: {more}");

    let (status, _, text) = server.post_raw(
        "/api/attention",
        &json!({"model": "tiny", "text": "To be, or not"}).to_string(),
        None,
    );
    assert_eq!(status, 200, "{text}");
    let maps: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(maps["tokens"].as_array().unwrap().len(), 13);
    let weights = &maps["weights"];
    assert_eq!(weights.as_array().unwrap().len(), 1, "one layer");
    assert_eq!(weights[0].as_array().unwrap().len(), 2, "two heads");
    let row = weights[0][1][4].as_array().unwrap();
    let sum: f64 = row.iter().map(|w| w.as_f64().unwrap()).sum();
    assert!((sum - 1.0).abs() < 1e-4 && row[5] == 0.0, "{row:?}");

    // Refusals: each names what to fix, and no id or path reaches the filesystem.
    for (method, path, body, status, code) in [
        (
            "POST",
            "/api/attention",
            r#"{"model": "tiny", "text": "€"}"#,
            400,
            "invalid_value",
        ),
        (
            "POST",
            "/api/attention",
            r#"{"model": "tiny"}"#,
            400,
            "invalid_json",
        ),
        (
            "POST",
            "/api/attention",
            r#"{"model": "../runs/tiny", "text": "a"}"#,
            404,
            "model_not_found",
        ),
        (
            "GET",
            "/api/run?id=../runs/tiny",
            "",
            404,
            "model_not_found",
        ),
        ("GET", "/api/run?id=/etc", "", 404, "model_not_found"),
        (
            "GET",
            "/api/metrics?id=tiny&offset=../../etc/passwd",
            "",
            400,
            "invalid_value",
        ),
        ("GET", "/api/metrics", "", 400, "invalid_value"),
        ("GET", "/assets/../Cargo.toml", "", 404, "unknown_url"),
        (
            "GET",
            "/assets/%2e%2e/%2e%2e/corpus.txt",
            "",
            404,
            "unknown_url",
        ),
        ("GET", "/runs/tiny/config.toml", "", 404, "unknown_url"),
    ] {
        let (got, _, text) = if method == "POST" {
            server.post_raw(path, body, None)
        } else {
            let mut r = Server::agent()
                .get(format!("{}{path}", server.url))
                .call()
                .unwrap();
            (
                r.status().as_u16(),
                None,
                r.body_mut().read_to_string().unwrap(),
            )
        };
        assert_eq!(got, status, "{method} {path}: {text}");
        let error: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(error["error"]["code"], code, "{method} {path}: {text}");
    }

    // With a key, the page loads but its JSON needs the key.
    drop(server);
    let server = Server::start(dir.path(), &["--runs", "runs", "--api-key", "sesame"]);
    let page = Server::agent().get(&server.url).call().unwrap();
    assert_eq!(page.status(), 200);
    let (status, _) = server.get("/api/runs");
    assert_eq!(status, 401);
    let mut keyed = Server::agent()
        .get(format!("{}/api/runs", server.url))
        .header("Authorization", "Bearer sesame")
        .call()
        .unwrap();
    assert_eq!(keyed.status(), 200);
    let list: Value = serde_json::from_str(&keyed.body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!(list["runs"][0]["id"], "tiny");
}

/// The iteration of the run's best checkpoint now.
fn best_iter(run: &Path) -> u64 {
    checkpoint::load_meta(&run.join(BEST)).map_or(0, |m| m.iter)
}

#[test]
fn a_run_trained_while_served_is_seen_training_and_its_new_checkpoints_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let run = trained_run(dir.path());
    let server = Server::start(dir.path(), &["--runs", "runs"]);
    let request = json!({"model": "tiny", "prompt": "ROMEO:", "max_tokens": 30, "seed": 11,
        "temperature": 0.8});
    let (status, first) = server.complete(&request);
    assert_eq!(status, 200, "{first}");
    let (_, health) = server.get("/health");
    assert_eq!(
        health["models"]["loaded"],
        json!([{"id": "tiny", "iter": 10}])
    );
    assert_eq!(run_entry(&server, "tiny").unwrap()["training"], false);

    // `train` resumes the run while the server watches: the page sees it training, and the
    // next request after a new best checkpoint uses it.
    let mut trainer: Child = Command::new(train_binary())
        .current_dir(dir.path())
        .args(["--resume", "runs/tiny", "--max-iters", "100000000"])
        .args(["--eval-interval", "20", "--checkpoint-interval", "20"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(60, "the page to see the trainer", || {
        (run_entry(&server, "tiny").unwrap()["training"] == true).then_some(())
    });
    let newer = wait_for(120, "a new best checkpoint", || {
        let iter = best_iter(&run);
        (iter > 10).then_some(iter)
    });
    let (status, _) = server.complete(&request);
    assert_eq!(status, 200);
    let (_, health) = server.get("/health");
    let served = health["models"]["loaded"][0]["iter"].as_u64().unwrap();
    assert!(
        served >= newer,
        "served iteration {served}, best was {newer} before the request"
    );

    trainer.kill().unwrap();
    trainer.wait().unwrap();
    wait_for(10, "the page to see the trainer gone", || {
        (run_entry(&server, "tiny").unwrap()["training"] == false).then_some(())
    });
    // The run is still now: the text is generate's from its best checkpoint.
    let (_, whole) = server.complete(&request);
    let (_, health) = server.get("/health");
    assert_eq!(health["models"]["loaded"][0]["iter"], best_iter(&run));
    let sampling = SamplingParams {
        temperature: 0.8,
        top_k: None,
        ..SamplingParams::default()
    };
    assert_eq!(
        whole["choices"][0]["text"],
        generated(&run, "ROMEO:", sampling, 1, 11, 30)[0]
    );
    assert_ne!(whole["choices"][0]["text"], first["choices"][0]["text"]);

    // A run created after the server started is offered too.
    train(dir.path(), "later", &[]);
    let (_, models) = server.get("/v1/models");
    let ids: Vec<&Value> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["id"])
        .collect();
    assert_eq!(ids, [&json!("later"), &json!("tiny")]);
    let mut later = request.clone();
    later["model"] = json!("later");
    assert_eq!(server.complete(&later).0, 200);
}

/// A stream running when its run's new best checkpoint is renamed into place finishes on the
/// checkpoint it started with; the next request waits for it and gets the new one.
#[test]
fn a_request_running_when_a_new_best_arrives_finishes_on_the_model_it_started_with() {
    let dir = tempfile::tempdir().unwrap();
    let run = trained_run(dir.path());
    let newer = train(dir.path(), "newer", &[("max-iters", "14")]);
    let tokens = 20_000; // a few seconds of the tiny model's sampling
    let server = Server::start(
        dir.path(),
        &["--runs", "runs", "--max-tokens", &tokens.to_string()],
    );
    let ask = |max_tokens: usize, stream: bool| {
        json!({"model": "tiny", "prompt": "ROMEO:", "max_tokens": max_tokens, "seed": 11,
            "temperature": 0.8, "stream": stream})
    };
    let response = Server::agent()
        .post(format!("{}/v1/completions", server.url))
        .header("Content-Type", "application/json")
        .send(ask(tokens, true).to_string())
        .unwrap();
    let mut stream = BufReader::new(response.into_body().into_reader());
    let mut read_so_far = String::new();
    while !read_so_far.contains("data: {") {
        assert!(
            stream.read_line(&mut read_so_far).unwrap() > 0,
            "no chunk came"
        );
    }
    // A new best is renamed into place, as `train` writes it, while the stream runs; the old
    // one is kept aside to compare with.
    let old = dir.path().join("old");
    std::fs::create_dir(&old).unwrap();
    std::fs::rename(run.join(BEST), old.join(BEST)).unwrap();
    std::fs::rename(newer.join(BEST), run.join(BEST)).unwrap();
    let (_, health) = server.get("/health");
    assert_eq!(
        health["requests"]["active"], 1,
        "the stream still runs: {health}"
    );
    let (status, next) = server.complete(&ask(30, false));
    assert_eq!(status, 200, "{next}");

    let mut rest = String::new();
    stream.read_to_string(&mut rest).unwrap();
    let (texts, _) = streamed(&(read_so_far + &rest), 1);
    let sampling = SamplingParams {
        temperature: 0.8,
        top_k: None,
        ..SamplingParams::default()
    };
    let old_text = generated(&old, "ROMEO:", sampling, 1, 11, tokens).remove(0);
    assert_eq!(texts[0].0.chars().count(), tokens);
    assert!(texts[0].0 == old_text, "the stream left the old checkpoint");
    let new_text = generated(&run, "ROMEO:", sampling, 1, 11, 30).remove(0);
    assert_eq!(next["choices"][0]["text"], new_text);
    let old_start: String = old_text.chars().take(new_text.chars().count()).collect();
    assert_ne!(new_text, old_start, "the two checkpoints sample alike");
    let (_, health) = server.get("/health");
    assert_eq!(
        health["models"]["loaded"],
        json!([{"id": "tiny", "iter": best_iter(&run)}])
    );
}

#[test]
fn a_client_that_leaves_frees_its_place_and_the_time_limit_ends_a_stream() {
    let dir = tempfile::tempdir().unwrap();
    trained_run(dir.path());
    let max = LONG.to_string();
    let server = Server::start(
        dir.path(),
        &["--runs", "runs", "--max-tokens", &max, "--max-batch", "1"],
    );
    let body = json!({"model": "tiny", "prompt": "ROMEO:", "max_tokens": LONG, "stream": true});
    let reader = busy_stream(&server);
    let (_, health) = server.get("/health");
    assert_eq!(health["requests"]["active"], 1, "{health}");
    drop(reader); // the client leaves mid-stream
    let left = Instant::now();
    wait_for(5, "the place to be freed", || {
        let (_, health) = server.get("/health");
        (health["requests"]["active"] == 0).then_some(())
    });
    // Well before the time limit (300 s) would end it.
    assert!(
        left.elapsed() < Duration::from_secs(2),
        "{:?}",
        left.elapsed()
    );
    wait_for(5, "the log line of the stream", || {
        read(&server.log)
            .contains("POST /v1/completions 499")
            .then_some(())
    });

    // A client that leaves while its request waits (behind a full batch) frees its place at
    // once too.
    let reader = busy_stream(&server);
    let address = server.url.trim_start_matches("http://").to_string();
    let mut waiting = std::net::TcpStream::connect(address).unwrap();
    let short = json!({"model": "tiny", "prompt": "ROMEO:", "max_tokens": 5}).to_string();
    write!(
        waiting,
        "POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{short}",
        short.len()
    )
    .unwrap();
    let queued = |n: u64| move |server: &Server| server.get("/health").1["requests"]["queued"] == n;
    wait_for(5, "the request to wait", || {
        queued(1)(&server).then_some(())
    });
    drop(waiting);
    let left = Instant::now();
    wait_for(5, "its place to be freed", || {
        queued(0)(&server).then_some(())
    });
    // Well before the time limit (300 s) would end it.
    assert!(
        left.elapsed() < Duration::from_secs(2),
        "{:?}",
        left.elapsed()
    );
    assert_eq!(server.get("/health").1["requests"]["active"], 1);
    drop(reader);

    drop(server);

    // Past --timeout, a stream ends with an error event, a whole completion is a 408; the
    // server goes on serving.
    let server = Server::start(
        dir.path(),
        &["--runs", "runs", "--max-tokens", &max, "--timeout", "2"],
    );
    let response = Server::agent()
        .post(format!("{}/v1/completions", server.url))
        .header("Content-Type", "application/json")
        .send(body.to_string())
        .unwrap();
    let started = Instant::now();
    // Megabytes of events in 2 s: only the last is kept.
    let stream = BufReader::new(response.into_body().into_reader());
    let last = stream
        .lines()
        .map(Result::unwrap)
        .filter(|l| l.starts_with("data: "))
        .last()
        .unwrap();
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(4), "{elapsed:?}");
    assert!(last.contains("request_timeout"), "{last}");
    let mut whole = body.clone();
    whole["stream"] = json!(false);
    let (status, error) = server.complete(&whole);
    assert_eq!(
        (status, &error["error"]["code"]),
        (408, &json!("request_timeout"))
    );
    let (status, _) = server.complete(&json!({"model": "tiny", "max_tokens": 5}));
    assert_eq!(status, 200);
}
