//! `serve`'s API over HTTP, against a small model trained here: the text is `generate`'s, streamed
//! or whole; stop strings; OpenAI's error objects; the API key; the queue; stopping.

use std::io::Read;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use cinder::sampling::SamplingParams;
use cinder::storage::names::LATEST;
use serde_json::{Value, json};

mod common;
use common::{LONG, Server, busy_stream, events, generated, read, streamed, trained_run};

#[test]
fn completions_are_generates_text_whole_or_streamed() {
    let dir = tempfile::tempdir().unwrap();
    let run = trained_run(dir.path());
    let server = Server::start(dir.path(), &["--runs", "runs"]);
    let sampling = SamplingParams {
        temperature: 0.8,
        top_k: Some(20),
        ..SamplingParams::default()
    };
    for n in [1, 2] {
        let expected = generated(&run, "ROMEO:", sampling, n, 7, 30);
        let request = json!({"model": "tiny", "prompt": "ROMEO:", "max_tokens": 30,
            "temperature": 0.8, "top_k": 20, "seed": 7, "n": n});
        let (status, whole) = server.complete(&request);
        assert_eq!(status, 200, "{whole}");
        assert_eq!(whole["object"], "text_completion");
        assert!(whole["id"].as_str().unwrap().starts_with("cmpl-"));
        assert_eq!(whole["model"], "tiny");
        let choices = whole["choices"].as_array().unwrap();
        assert_eq!(choices.len(), n);
        for (i, choice) in choices.iter().enumerate() {
            assert_eq!(choice["index"], i);
            assert_eq!(choice["text"], expected[i], "choice {i} of {n}");
            assert_eq!(choice["finish_reason"], "length");
        }
        assert_eq!(
            whole["usage"],
            json!({"prompt_tokens": 6, "completion_tokens": 30 * n, "total_tokens": 6 + 30 * n})
        );

        let mut request = request.clone();
        request["stream"] = json!(true);
        request["stream_options"] = json!({"include_usage": true});
        let (status, _, stream) = server.post_raw("/v1/completions", &request.to_string(), None);
        assert_eq!(status, 200, "{stream}");
        let (texts, usage) = streamed(&stream, n);
        for (i, (text, reason)) in texts.iter().enumerate() {
            assert_eq!(text, &expected[i]);
            assert_eq!(reason, "length");
        }
        assert_eq!(usage, Some(whole["usage"].clone()));

        // vLLM's continuous_usage_stats: every chunk carries the usage so far.
        request["stream_options"] = json!({"include_usage": true, "continuous_usage_stats": true});
        let (status, _, stream) = server.post_raw("/v1/completions", &request.to_string(), None);
        assert_eq!(status, 200, "{stream}");
        let (texts, usage) = streamed(&stream, n);
        assert_eq!(
            texts.iter().map(|t| &t.0).collect::<Vec<_>>(),
            expected.iter().collect::<Vec<_>>()
        );
        assert_eq!(usage, Some(whole["usage"].clone()));
        let data = events(&stream);
        let chunks: Vec<Value> = data[..data.len() - 2] // the last usage, [DONE]
            .iter()
            .map(|e| serde_json::from_str(e).unwrap())
            .collect();
        // At least as many tokens written as characters sent (a token is a character here).
        let (mut sent, mut written) = (0, 0);
        for chunk in &chunks {
            assert_eq!(chunk["usage"]["prompt_tokens"], 6, "{chunk}");
            let so_far = chunk["usage"]["completion_tokens"].as_u64().unwrap();
            sent += chunk["choices"][0]["text"]
                .as_str()
                .unwrap()
                .chars()
                .count() as u64;
            assert!(
                so_far >= written && so_far >= sent,
                "{so_far} after {written}, {sent} sent"
            );
            written = so_far;
        }
        assert_eq!(written, 30 * n as u64);
    }
    let log = read(&server.log);
    assert!(
        log.contains("POST /v1/completions 200 model=tiny tokens=30 "),
        "{log}"
    );
}

#[test]
fn a_stop_string_ends_the_text_before_it_whole_or_streamed() {
    let dir = tempfile::tempdir().unwrap();
    trained_run(dir.path());
    let server = Server::start(dir.path(), &["--runs", "runs"]);
    // A seed gives the same draws with or without stop strings.
    let seeded = json!({"model": "tiny", "prompt": "ROMEO:", "max_tokens": 30, "seed": 3});
    let (_, whole) = server.complete(&seeded);
    let text = whole["choices"][0]["text"].as_str().unwrap().to_string();
    // A stop string from the middle of the text: two characters first met there.
    let chars: Vec<char> = text.chars().collect();
    let stop: String = (5..chars.len() - 2)
        .map(|i| chars[i..i + 2].iter().collect::<String>())
        .find(|pair| {
            !chars[..5]
                .iter()
                .collect::<String>()
                .contains(pair.as_str())
        })
        .unwrap_or_else(|| panic!("no stop string to pick in {text:?}"));
    let before = &text[..text.find(&stop).unwrap()];
    assert!(before.chars().count() >= 4, "{text:?}");
    let mut request = seeded.clone();
    request["stop"] = json!(["never met", stop]);
    let (status, stopped) = server.complete(&request);
    assert_eq!(status, 200, "{stopped}");
    assert_eq!(stopped["choices"][0]["text"], before);
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");

    request["stream"] = json!(true);
    let (_, _, stream) = server.post_raw("/v1/completions", &request.to_string(), None);
    let (texts, _) = streamed(&stream, 1);
    assert_eq!(texts[0], (before.to_string(), "stop".to_string()));
}

#[test]
fn bad_requests_get_openai_errors_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    trained_run(dir.path());
    let server = Server::start(
        dir.path(),
        &[
            "--runs",
            "runs",
            "--max-tokens",
            "100",
            "--max-prompt-chars",
            "100",
            "--max-batch",
            "4",
        ],
    );
    let ok = json!({"model": "tiny", "prompt": "ROMEO:"});
    let with = |field: &str, value: Value| {
        let mut body = ok.clone();
        body[field] = value;
        body.to_string()
    };
    // A 400 naming `field`, for `field` set to `value`.
    let bad = |field: &str, value: Value| (with(field, value), 400, json!(field), "invalid_value");
    let cases: Vec<(String, u16, Value, &str)> = vec![
        ("{not json".into(), 400, Value::Null, "invalid_json"),
        ("[1, 2]".into(), 400, Value::Null, "invalid_json"),
        (
            json!({"prompt": "a"}).to_string(),
            400,
            json!("model"),
            "invalid_value",
        ),
        bad("max_tokens", json!("x")),
        bad("max_tokens", json!(0)),
        bad("max_tokens", json!(101)),
        bad("temperature", json!(-1)),
        bad("top_p", json!(0)),
        bad("top_k", json!(0)),
        bad("top_k", json!(-2)),
        bad("n", json!(0)),
        bad("n", json!(9)),
        bad("stop", json!(["a", "b", "c", "d", "e"])),
        bad("stop", json!("")),
        bad("prompt", json!(7)),
        bad("prompt", json!([])),
        bad("prompt", json!("price: €5")),
        bad("prompt", json!("\u{feff}")), // a byte-order mark alone: no token
        bad("prompt", json!("x".repeat(101))),
        bad("n", json!(5)), // 5 choices, --max-batch 4
        bad("stop", json!("s".repeat(257))),
        bad("best_of", json!(2)),
        bad("best_of", json!(0)),
        bad("best_of", json!(-3)),
        bad("frequency_penalty", json!(2.5)),
        bad("echo", json!("yes")),
        bad("logprobs", json!(6)),
        bad("logit_bias", json!({"1": 5})),
        bad("suffix", json!("end")),
        bad("presence_penalty", json!(-3)),
        bad("min_p", json!(1.5)),
        bad("repetition_penalty", json!(0)),
        bad("top_p", json!(1.5)),
        // A misspelt or unknown parameter is refused by name, as OpenAI's API does.
        bad("temprature", json!(0.5)),
        bad("stop_sequences", json!(["a"])),
        (
            with("stream_options", json!({"include_usag": true})),
            400,
            json!("stream_options.include_usag"),
            "invalid_value",
        ),
        (
            with("model", json!("nope")),
            404,
            json!("model"),
            "model_not_found",
        ),
        (
            with("model", json!("../runs/tiny")),
            404,
            json!("model"),
            "model_not_found",
        ),
        // Just over the limit: a body far over it may not be sent whole before the answer comes.
        (
            "x".repeat((1 << 20) + 1000),
            413,
            Value::Null,
            "request_too_large",
        ),
    ];
    for (body, status, param, code) in cases {
        let (got, _, text) = server.post_raw("/v1/completions", &body, None);
        let shown: String = body.chars().take(80).collect();
        assert_eq!(got, status, "{shown}: {text}");
        let error: Value = serde_json::from_str(&text).unwrap();
        let error = &error["error"];
        assert_eq!(error["param"], param, "{shown}: {text}");
        assert_eq!(error["code"], code, "{shown}: {text}");
        assert!(error["message"].as_str().unwrap().len() > 10, "{text}");
        assert!(error["type"].is_string(), "{text}");
    }
    let (status, error) = server.get("/v1/nothing");
    assert_eq!(
        (status, &error["error"]["code"]),
        (404, &json!("unknown_url"))
    );
    let (status, whole) = server.complete(&ok);
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["usage"]["completion_tokens"], 16); // OpenAI's default max_tokens
    // OpenAI's own fields at their neutral values, and its `user`, are accepted.
    let neutral = json!({"model": "tiny", "prompt": "ROMEO:", "user": "someone", "min_p": 0,
        "repetition_penalty": 1, "presence_penalty": 0, "logprobs": null, "echo": false, "best_of": 1});
    let (status, whole) = server.complete(&neutral);
    assert_eq!(status, 200, "{whole}");
    // No prompt, or an empty one, samples from the start (generate's default prompt).
    for body in [
        json!({"model": "tiny"}),
        json!({"model": "tiny", "prompt": ""}),
    ] {
        let (status, whole) = server.complete(&body);
        assert_eq!(status, 200, "{whole}");
        assert_eq!(whole["usage"]["prompt_tokens"], 1, "{whole}");
    }
}

#[test]
fn models_health_ids_and_the_api_key() {
    let dir = tempfile::tempdir().unwrap();
    let run = trained_run(dir.path());
    let latest = run.join(LATEST);
    let server = Server::start(
        dir.path(),
        &[
            "--runs",
            "runs",
            "--checkpoint",
            latest.to_str().unwrap(),
            "--api-key",
            "sesame",
        ],
    );
    // Transparent huge pages are off (`cinder::without_huge_pages`), where Linux says (5.0 on).
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id()));
    match status
        .iter()
        .flat_map(|s| s.lines())
        .find(|l| l.starts_with("THP_enabled:"))
    {
        Some(line) => assert_eq!(line.split_whitespace().nth(1), Some("0"), "{line}"),
        None => eprintln!("not checked: this system does not say whether huge pages are on"),
    }
    let (status, health) = server.get("/health");
    assert_eq!(status, 200);
    assert_eq!(health["status"], "ok");
    assert_eq!(health["models"], json!({"available": 2, "loaded": []}));
    assert_eq!(health["requests"], json!({"active": 0, "queued": 0}));

    let body = json!({"model": "latest", "prompt": "ROMEO:", "max_tokens": 3}).to_string();
    for key in [None, Some("wrong")] {
        let (status, _, text) = server.post_raw("/v1/completions", &body, key);
        assert_eq!(status, 401, "{text}");
        assert!(text.contains("invalid_api_key"), "{text}");
    }
    let (status, _, text) = server.post_raw("/v1/completions", &body, Some("sesame"));
    assert_eq!(status, 200, "{text}");
    let (_, health) = server.get("/health");
    assert_eq!(
        health["models"]["loaded"],
        json!([{"id": "latest", "iter": 10}])
    );

    // /v1/models needs the key too.
    let (status, _) = server.get("/v1/models");
    assert_eq!(status, 401);
    drop(server);
    let server = Server::start(
        dir.path(),
        &["--runs", "runs", "--checkpoint", latest.to_str().unwrap()],
    );
    assert_eq!(server.model_ids(), ["latest", "tiny"]);
    let (_, models) = server.get("/v1/models");
    assert_eq!(models["data"][0]["object"], "model");

    // The key from the environment works as --api-key does.
    drop(server);
    let keyed = Server::start_with(
        dir.path(),
        &["--runs", "runs"],
        &[("CINDER_API_KEY", "sesame")],
    );
    assert_eq!(keyed.get("/v1/models").0, 401);
    let (status, _, text) = keyed.post_raw("/v1/completions", &body, Some("sesame"));
    assert_eq!(status, 404, "{text}"); // authorised: only the model is not there
    drop(keyed);
    // Beyond loopback without a key: served, with a warning.
    let open = Server::start(dir.path(), &["--runs", "runs", "--host", "0.0.0.0"]);
    assert_eq!(open.get("/v1/models").0, 200);
    let log = read(&open.log);
    assert!(
        log.contains("warning: listening on 0.0.0.0 without --api-key"),
        "{log}"
    );
    drop(open);

    // A run under --runs named with --checkpoint too (`serve --checkpoint checkpoints/tiny_cpu`
    // with the default --runs): served once.
    let twice = Server::start(
        dir.path(),
        &["--runs", "runs", "--checkpoint", run.to_str().unwrap()],
    );
    assert_eq!(twice.model_ids(), ["tiny"]);
    drop(twice);
    // Two folders of one name: refused at start.
    let other = dir.path().join("elsewhere").join("tiny");
    std::fs::create_dir_all(&other).unwrap();
    for entry in std::fs::read_dir(&latest).unwrap() {
        let entry = entry.unwrap();
        let to = other.join(LATEST);
        std::fs::create_dir_all(&to).unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
    let out = Command::new(env!("CARGO_BIN_EXE_serve"))
        .current_dir(dir.path())
        .args([
            "--port",
            "0",
            "--runs",
            "runs",
            "--checkpoint",
            other.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("two models would have the id \"tiny\""),
        "{stderr}"
    );
}

#[test]
fn a_full_queue_is_a_429_and_stopping_ends_open_streams_and_refuses_waiting_requests() {
    let dir = tempfile::tempdir().unwrap();
    trained_run(dir.path());
    let mut server = Server::start(
        dir.path(),
        &[
            "--runs",
            "runs",
            "--max-batch",
            "1",
            "--queue",
            "1",
            "--max-tokens",
            &LONG.to_string(),
            // A failed check must not leave the waiting request for the default 300 s.
            "--timeout",
            "20",
        ],
    );
    let mut open = busy_stream(&server);
    let body = json!({"model": "tiny", "prompt": "ROMEO:", "max_tokens": 1}).to_string();
    let stopped_at = std::thread::scope(|scope| {
        // One request waits for the running one's row...
        let waiting = scope.spawn(|| server.post_raw("/v1/completions", &body, None));
        let since = Instant::now();
        while server.get("/health").1["requests"]["queued"] != 1 {
            assert!(since.elapsed() < Duration::from_secs(10), "it never queued");
            std::thread::sleep(Duration::from_millis(20));
        }
        // ... so the next finds the queue full.
        let (status, retry, text) = server.post_raw("/v1/completions", &body, None);
        assert_eq!(status, 429, "{text}");
        assert_eq!(retry.as_deref(), Some("1"));
        assert!(text.contains("queue_full"), "{text}");

        // SIGTERM: the open stream ends with a finish_reason and [DONE], the waiting request
        // is refused with a 503, and serve exits 0.
        let stopped_at = Instant::now();
        let kill = Command::new("kill")
            .args(["-TERM", &server.child.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        let (status, _, text) = waiting.join().unwrap();
        assert_eq!(status, 503, "{text}");
        let error: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(error["error"]["code"], "shutting_down", "{text}");
        stopped_at
    });
    let mut rest = String::new();
    open.read_to_string(&mut rest).unwrap();
    let events = events(&rest);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{rest}");
    let last: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length", "{rest}");
    // It ended when told to, far short of max_tokens (a token is a character here).
    let (texts, _) = streamed(&rest, 1);
    assert!(
        texts[0].0.chars().count() < LONG / 2,
        "{} characters",
        texts[0].0.len()
    );
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        // Well before the forced exit 5 s after the signal.
        assert!(
            stopped_at.elapsed() < Duration::from_secs(3),
            "serve did not exit"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0), "{}", read(&server.log));
}

/// Whether OpenAI's Python package can be imported, or why not.
fn openai_python() -> Result<(), String> {
    let out = Command::new("python3")
        .args(["-c", "import openai"])
        .output()
        .map_err(|e| format!("no python3: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err("OpenAI's Python package is missing (pip install openai)".into())
    }
}

#[test]
fn openais_own_client_works_unchanged() {
    if let Err(why) = openai_python() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI runs the OpenAI client test: {why}"
        );
        eprintln!("skipped: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let run = trained_run(dir.path());
    let server = Server::start(dir.path(), &["--runs", "runs", "--api-key", "sesame"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/openai_client.py");
    let out = Command::new("python3")
        .arg(script)
        .args([server.url.as_str(), "sesame", "tiny"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Value = serde_json::from_str(&stdout).unwrap();
    let sampling = SamplingParams {
        temperature: 0.8,
        top_k: Some(20),
        ..SamplingParams::default()
    };
    let expected = generated(&run, "ROMEO:", sampling, 2, 7, 30);
    let usage = json!({"prompt_tokens": 6, "completion_tokens": 60, "total_tokens": 66});
    assert_eq!(got["models"], json!(["tiny"]));
    assert_eq!(got["whole"]["texts"], json!(expected));
    assert_eq!(got["whole"]["finish"], json!(["length", "length"]));
    assert_eq!(got["whole"]["object"], "text_completion");
    assert_eq!(got["whole"]["usage"]["total_tokens"], 66);
    assert_eq!(got["streamed"]["texts"], json!(expected));
    assert_eq!(got["streamed"]["finish"], json!(["length", "length"]));
    assert_eq!(
        got["streamed"]["usage"]["completion_tokens"],
        usage["completion_tokens"]
    );
    let error = |class: &str, status: u16, param: Value, code: &str| json!({"class": class, "status": status, "param": param, "code": code});
    assert_eq!(
        got["unknown_model"],
        error("NotFoundError", 404, json!("model"), "model_not_found")
    );
    assert_eq!(
        got["bad_max_tokens"],
        error("BadRequestError", 400, json!("max_tokens"), "invalid_value")
    );
    assert_eq!(
        got["wrong_key"],
        error("AuthenticationError", 401, Value::Null, "invalid_api_key")
    );
    // The client reads the log-probabilities, streamed as whole.
    let logprobs = &got["logprobs"];
    let whole = &logprobs["whole"];
    assert_eq!(whole["tokens"].as_array().unwrap().len(), 20, "{whole}");
    let joined: String = whole["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(joined, whole["text"].as_str().unwrap());
    assert_eq!(&logprobs["streamed"], whole);
    let scored = &logprobs["scored"];
    assert_eq!(scored["text"], "ROMEO: my");
    let token_logprobs = scored["token_logprobs"].as_array().unwrap();
    assert_eq!(token_logprobs.len(), 9);
    assert!(
        token_logprobs[0].is_null()
            && token_logprobs[1..]
                .iter()
                .all(|l| l.as_f64().unwrap() < 0.0)
    );
}

/// Penalties and min-p: a seeded request's text is `generate`'s with the same samplers, alone
/// and in a batch of 16 requests decoded together (each row with its own counts).
#[test]
fn samplers_give_generates_text_alone_and_batched() {
    let dir = tempfile::tempdir().unwrap();
    let run = trained_run(dir.path());
    let max = LONG.to_string();
    let server = Server::start(
        dir.path(),
        &[
            "--runs",
            "runs",
            "--max-tokens",
            &max,
            "--max-batch",
            "32",
            "--queue",
            "32",
            "--max-n",
            "16",
        ],
    );
    let d = SamplingParams::default();
    let samplers = [
        (
            json!({"presence_penalty": 1.5}),
            SamplingParams {
                presence_penalty: 1.5,
                ..d
            },
        ),
        (
            json!({"frequency_penalty": 0.8}),
            SamplingParams {
                frequency_penalty: 0.8,
                ..d
            },
        ),
        (
            json!({"repetition_penalty": 1.3}),
            SamplingParams {
                repetition_penalty: 1.3,
                ..d
            },
        ),
        (
            json!({"min_p": 0.2}),
            SamplingParams {
                min_p: Some(0.2),
                ..d
            },
        ),
        (
            json!({"presence_penalty": -0.5, "frequency_penalty": 0.3, "repetition_penalty": 0.9,
                "min_p": 0.05, "top_p": 0.9, "top_k": 30}),
            SamplingParams {
                presence_penalty: -0.5,
                frequency_penalty: 0.3,
                repetition_penalty: 0.9,
                min_p: Some(0.05),
                top_p: Some(0.9),
                top_k: Some(30),
                ..d
            },
        ),
    ];
    let tokens = 120;
    // Greedy with a repetition penalty, and sampled at two temperatures.
    let cases: Vec<(Value, SamplingParams, u64)> = (0..16)
        .map(|i| {
            let (fields, params) = &samplers[i % samplers.len()];
            let temperature = [0.0, 0.8, 1.2][i % 3];
            let mut request = json!({"model": "tiny", "prompt": "ROMEO:", "max_tokens": tokens,
                "temperature": temperature, "seed": i});
            for (k, v) in fields.as_object().unwrap() {
                request[k] = v.clone();
            }
            let params = SamplingParams {
                temperature,
                ..*params
            };
            (request, params, i as u64)
        })
        .collect();
    let expected: Vec<String> = cases
        .iter()
        .map(|(_, params, seed)| generated(&run, "ROMEO:", *params, 1, *seed, tokens)[0].clone())
        .collect();
    // The samplers change the text: the penalties are on.
    let plain = SamplingParams {
        temperature: 0.0,
        ..d
    };
    assert_ne!(
        expected[0],
        generated(&run, "ROMEO:", plain, 1, 0, tokens)[0]
    );

    let (status, alone) = server.complete(&cases[4].0);
    assert_eq!(status, 200, "{alone}");
    assert_eq!(alone["choices"][0]["text"], expected[4]);

    // With a long stream holding the worker, the 16 join one batch.
    let busy = busy_stream(&server);
    let texts: Vec<Value> = std::thread::scope(|scope| {
        let handles: Vec<_> = cases
            .iter()
            .map(|(request, _, _)| {
                let server = &server;
                scope.spawn(move || server.complete(request))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                let (status, answer) = h.join().unwrap();
                assert_eq!(status, 200, "{answer}");
                answer["choices"][0]["text"].clone()
            })
            .collect()
    });
    drop(busy);
    for (i, (text, want)) in texts.iter().zip(&expected).enumerate() {
        assert_eq!(text, want, "request {i}: {:?}", cases[i].0);
    }
    // Each joined the long stream's batch.
    let (_, health) = server.get("/health");
    let widest = health["decoding"]["widest"].as_u64().unwrap();
    assert!(widest >= 2, "no rows were decoded together: {health}");

    // Sixteen rows of one request are one batch by construction: each row keeps its own counts,
    // as generate's samples do.
    let (request, params, seed) = &cases[4];
    let mut sixteen = request.clone();
    sixteen["n"] = json!(16);
    let (status, answer) = server.complete(&sixteen);
    assert_eq!(status, 200, "{answer}");
    let texts: Vec<&str> = answer["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, generated(&run, "ROMEO:", *params, 16, *seed, tokens));

    // Every batch (alone, together, sixteen rows) used one key/value cache, made for
    // --max-batch rows.
    let log = read(&server.log);
    let made: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("key/value cache"))
        .collect();
    assert_eq!(made.len(), 1, "{log}");
    assert!(made[0].contains("for 32 rows"), "{}", made[0]);
}

/// vLLM's `/tokenize` and `/detokenize` round-trip a text with multi-byte characters through a
/// byte-level BPE; the pieces are the tokens' bytes, OpenAI's `bytes:` form where a token holds
/// part of a character.
#[test]
fn tokenize_then_detokenize_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    common::train(
        dir.path(),
        "bpe",
        &[("tokenizer", "bpe"), ("vocab-size", "300")],
    );
    let server = Server::start(dir.path(), &["--runs", "runs"]);
    let text = "ROMEO: café, naïve — 5 € 日本\nJULIET: 🌹";
    let post = |path: &str, body: Value| {
        let (status, _, answer) = server.post_raw(path, &body.to_string(), None);
        (status, serde_json::from_str::<Value>(&answer).unwrap())
    };
    let (status, tokens) = post("/tokenize", json!({"model": "bpe", "prompt": text}));
    assert_eq!(status, 200, "{tokens}");
    let ids = tokens["tokens"].as_array().unwrap();
    let pieces = tokens["token_strs"].as_array().unwrap();
    assert_eq!(tokens["count"], ids.len());
    assert_eq!(tokens["max_model_len"], 32);
    assert_eq!(pieces.len(), ids.len());
    // The pieces are the text's bytes, token by token.
    let mut bytes = Vec::new();
    for piece in pieces {
        let piece = piece.as_str().unwrap();
        match piece.strip_prefix("bytes:") {
            Some(hex) => {
                for b in hex.split("\\x").skip(1) {
                    bytes.push(u8::from_str_radix(b, 16).unwrap());
                }
            }
            None => bytes.extend(piece.as_bytes()),
        }
    }
    assert_eq!(String::from_utf8(bytes).unwrap(), text);
    assert!(
        pieces
            .iter()
            .any(|p| p.as_str().unwrap().starts_with("bytes:")),
        "{pieces:?}"
    );
    let (status, back) = post("/detokenize", json!({"model": "bpe", "tokens": ids}));
    assert_eq!(status, 200, "{back}");
    assert_eq!(back["prompt"], text);

    // Bad requests name what to fix.
    let refused = |path: &str, body: Value, param: &str| {
        let (status, answer) = post(path, body);
        assert_eq!(status, 400, "{answer}");
        assert_eq!(answer["error"]["param"], param, "{answer}");
    };
    refused(
        "/detokenize",
        json!({"model": "bpe", "tokens": [1, 300]}),
        "tokens",
    );
    refused(
        "/detokenize",
        json!({"model": "bpe", "tokens": ["a"]}),
        "tokens",
    );
    refused("/tokenize", json!({"model": "bpe", "text": "a"}), "text");
    refused("/tokenize", json!({"model": "bpe"}), "prompt");
    let (status, _) = post("/tokenize", json!({"model": "nope", "prompt": "a"}));
    assert_eq!(status, 404);
}

/// A task on a model that is decoding (`/tokenize`, `/detokenize`) is answered between two of
/// its steps: it neither waits for the texts decoding to end nor keeps a later completion from
/// joining them. (Were it to wait, it would wait for `--timeout` to end the long stream.)
#[test]
fn tokenizing_a_model_that_is_decoding_waits_for_no_text() {
    let dir = tempfile::tempdir().unwrap();
    trained_run(dir.path());
    let max = LONG.to_string();
    let server = Server::start(
        dir.path(),
        &["--runs", "runs", "--max-tokens", &max, "--timeout", "30"],
    );
    let open = busy_stream(&server);
    let since = Instant::now();
    for (path, body) in [
        ("/tokenize", json!({"model": "tiny", "prompt": "ROMEO:"})),
        ("/detokenize", json!({"model": "tiny", "tokens": [1, 2, 3]})),
    ] {
        let (status, _, answer) = server.post_raw(path, &body.to_string(), None);
        assert_eq!(status, 200, "{path}: {answer}");
    }
    let short = json!({"model": "tiny", "prompt": "a", "max_tokens": 5});
    let (status, whole) = server.complete(&short);
    assert_eq!(status, 200, "{whole}");
    let waited = since.elapsed();
    assert!(
        waited < Duration::from_secs(10),
        "answered after {waited:?}, with a text decoding"
    );
    // The long text still goes on: its next message is more text.
    let mut open = std::io::BufReader::new(open);
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        let read = std::io::BufRead::read_line(&mut open, &mut line).unwrap();
        assert!(read > 0, "the long stream ended");
    }
    assert!(line.contains("\"text\""), "{line}");
    drop((open, server));

    // Nor does it wait behind a completion waiting for rows: two of them, where one of the
    // two is taken.
    let server = Server::start(
        dir.path(),
        &[
            "--runs",
            "runs",
            "--max-tokens",
            &max,
            "--timeout",
            "30",
            "--max-batch",
            "2",
        ],
    );
    let _open = busy_stream(&server);
    let url = server.url.clone();
    std::thread::spawn(move || {
        let two = json!({"model": "tiny", "prompt": "a", "max_tokens": 5, "n": 2});
        let _ = Server::agent()
            .post(format!("{url}/v1/completions"))
            .header("Content-Type", "application/json")
            .send(two.to_string());
    });
    std::thread::sleep(Duration::from_millis(500));
    let since = Instant::now();
    let body = json!({"model": "tiny", "prompt": "ROMEO:"});
    let (status, _, answer) = server.post_raw("/tokenize", &body.to_string(), None);
    assert_eq!(status, 200, "{answer}");
    let waited = since.elapsed();
    assert!(
        waited < Duration::from_secs(10),
        "answered after {waited:?}, behind a completion waiting for rows"
    );
}

/// The run's model on the CPU, its composite layers (the reference), and its tokenizer.
fn reference_model(
    run: &Path,
) -> (
    cinder_model::Gpt,
    cinder_data::Tokenizer,
    burn::prelude::Device,
) {
    let (loaded, device) = common::loaded(run);
    let model = loaded.model.with_ops(cinder_model::Ops::Composite);
    (model, loaded.tokenizer, device)
}

/// Checks a choice's `logprobs` (with `echo`: every token of prompt and completion) against a
/// log-softmax of the composite path's logits over the whole text, to 1e-4: each token's and
/// its top 5.
fn assert_logprobs_are_the_models(run: &Path, logprobs: &Value) {
    let (model, tokenizer, device) = reference_model(run);
    let text: String = logprobs["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let ids = tokenizer.encode(&text).unwrap();
    let (t, v) = (ids.len(), model.vocab_size());
    let logits: Vec<f32> = model
        .forward(cinder::data::ids_tensor(&ids, [1, t], &device))
        .into_data()
        .try_to_vec()
        .unwrap();
    assert_eq!(logprobs["token_logprobs"][0], Value::Null);
    assert_eq!(logprobs["top_logprobs"][0], Value::Null);
    for i in 1..t {
        let row = &logits[(i - 1) * v..(i - 1) * v + tokenizer.vocab_size()];
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let norm = max
            + row
                .iter()
                .map(|&l| (l as f64 - max).exp())
                .sum::<f64>()
                .ln();
        let log_softmax = |id: usize| row[id] as f64 - norm;
        let got = logprobs["token_logprobs"][i].as_f64().unwrap();
        assert!(
            (got - log_softmax(ids[i] as usize)).abs() < 1e-4,
            "token {i}: {got}"
        );
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
        let top = logprobs["top_logprobs"][i].as_object().unwrap();
        for &id in &order[..5] {
            let piece = tokenizer.decode(&[id as u32]);
            let got = top[&piece].as_f64().unwrap();
            assert!(
                (got - log_softmax(id)).abs() < 1e-4,
                "token {i}, top {piece:?}: {got}"
            );
        }
    }
}

/// `echo` with `max_tokens` 0 scores a text exactly as `evaluate` does; the log-probabilities
/// of a completion's tokens (cached decoding) and of its echoed prompt (one forward pass) are
/// the composite path's; streamed chunks each carry their own tokens; a stop string's tokens
/// are left out with its text.
#[test]
fn logprobs_score_a_text_as_evaluate_does_and_are_the_models() {
    let dir = tempfile::tempdir().unwrap();
    let run = trained_run(dir.path());
    let server = Server::start(dir.path(), &["--runs", "runs"]);

    // Scoring: the mean surprise is evaluate's loss on the text.
    let text = "ROMEO:\nO, she doth teach";
    let request = json!({"model": "tiny", "prompt": text, "max_tokens": 0, "echo": true,
        "logprobs": 5});
    let (status, scored) = server.complete(&request);
    assert_eq!(status, 200, "{scored}");
    let choice = &scored["choices"][0];
    assert_eq!(choice["text"], text);
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(scored["usage"]["completion_tokens"], 0);
    let logprobs = &choice["logprobs"];
    let surprise: Vec<f64> = logprobs["token_logprobs"].as_array().unwrap()[1..]
        .iter()
        .map(|l| -l.as_f64().unwrap())
        .collect();
    assert_eq!(surprise.len(), text.chars().count() - 1);
    let loss = common::evaluated(&run, text);
    let mean = surprise.iter().sum::<f64>() / surprise.len() as f64;
    assert!((mean - loss).abs() < 1e-4, "scored {mean}, evaluate {loss}");
    let offsets: Vec<u64> = logprobs["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    assert_eq!(
        offsets,
        (0..text.chars().count() as u64).collect::<Vec<_>>()
    );
    assert_logprobs_are_the_models(&run, logprobs);

    // A prompt past the context cannot be scored whole.
    let long = json!({"model": "tiny", "prompt": "a".repeat(33), "max_tokens": 0, "echo": true,
        "logprobs": 0});
    let (status, refused) = server.complete(&long);
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["error"]["param"], "prompt");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("context is 32 tokens"),
        "{refused}"
    );

    // A completion's tokens, echoed prompt and all.
    let request = json!({"model": "tiny", "prompt": "ROMEO:", "max_tokens": 20, "temperature": 0.8,
        "seed": 3, "logprobs": 5, "echo": true});
    let (status, whole) = server.complete(&request);
    assert_eq!(status, 200, "{whole}");
    let logprobs = &whole["choices"][0]["logprobs"];
    assert_eq!(logprobs["tokens"].as_array().unwrap().len(), 26);
    assert_logprobs_are_the_models(&run, logprobs);
    let expected = generated(
        &run,
        "ROMEO:",
        SamplingParams {
            temperature: 0.8,
            ..SamplingParams::default()
        },
        1,
        3,
        20,
    );
    assert_eq!(
        whole["choices"][0]["text"],
        format!("ROMEO:{}", expected[0])
    );

    // An empty prompt samples from the default one, which is not the user's to echo: echo
    // adds nothing to it, text or tokens.
    let plain = json!({"model": "tiny", "prompt": "", "max_tokens": 8, "seed": 3, "logprobs": 1});
    let mut echoed = plain.clone();
    echoed["echo"] = json!(true);
    let ((status, alone), (echo_status, with_echo)) =
        (server.complete(&plain), server.complete(&echoed));
    assert_eq!((status, echo_status), (200, 200), "{alone} {with_echo}");
    assert!(
        alone["choices"][0]["text"]
            .as_str()
            .is_some_and(|t| !t.is_empty()),
        "{alone}"
    );
    assert_eq!(alone["choices"][0]["text"], with_echo["choices"][0]["text"]);
    assert_eq!(
        alone["choices"][0]["logprobs"],
        with_echo["choices"][0]["logprobs"]
    );
    echoed["max_tokens"] = json!(0);
    let (status, nothing) = server.complete(&echoed);
    assert_eq!(status, 200, "{nothing}");
    assert_eq!(nothing["choices"][0]["text"], "", "{nothing}");

    // Streamed: each chunk carries the tokens of its text, and together they are the whole's.
    let mut streamed_request = request.clone();
    streamed_request["stream"] = json!(true);
    let (status, _, stream) =
        server.post_raw("/v1/completions", &streamed_request.to_string(), None);
    assert_eq!(status, 200, "{stream}");
    let mut together =
        json!({"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []});
    for event in events(&stream) {
        let Ok(chunk) = serde_json::from_str::<Value>(&event) else {
            continue;
        };
        let choice = &chunk["choices"][0];
        if choice["finish_reason"].is_string() {
            continue;
        }
        let lp = &choice["logprobs"];
        let joined: String = lp["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        assert_eq!(joined, choice["text"].as_str().unwrap(), "{chunk}");
        for field in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
            together[field]
                .as_array_mut()
                .unwrap()
                .extend(lp[field].as_array().unwrap().iter().cloned());
        }
    }
    assert_eq!(&together, logprobs);

    // A stop string: the text ends before it, and so do the tokens.
    let completion: String = expected[0].clone();
    let stop: String = completion.chars().skip(8).take(2).collect();
    let mut stopped = request.clone();
    stopped["stop"] = json!([stop]);
    let (status, answer) = server.complete(&stopped);
    assert_eq!(status, 200, "{answer}");
    let text = answer["choices"][0]["text"].as_str().unwrap();
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");
    let tokens = answer["choices"][0]["logprobs"]["tokens"]
        .as_array()
        .unwrap();
    let joined: String = tokens.iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(joined, text);
    assert!(
        text.len() < 6 + completion.len() && !text[6..].contains(&stop),
        "{text:?} {stop:?}"
    );

    // Bad values name the parameter.
    for (field, value) in [
        ("logprobs", json!(6)),
        ("logprobs", json!(-1)),
        ("logprobs", json!("x")),
    ] {
        let mut bad = json!({"model": "tiny", "prompt": "A"});
        bad[field] = value;
        let (status, answer) = server.complete(&bad);
        assert_eq!(
            (status, &answer["error"]["param"]),
            (400, &json!(field)),
            "{answer}"
        );
    }
}

#[test]
fn concurrent_requests_are_decoded_together_each_with_generates_text() {
    let dir = tempfile::tempdir().unwrap();
    let run = trained_run(dir.path());
    let max = LONG.to_string();
    let server = Server::start(dir.path(), &["--runs", "runs", "--max-tokens", &max]);
    // Four open streams: all generate at once, none waits...
    let open: Vec<_> = (0..4).map(|_| busy_stream(&server)).collect();
    let (_, health) = server.get("/health");
    assert_eq!(
        health["requests"],
        json!({"active": 4, "queued": 0}),
        "{health}"
    );
    // ... in the same forward passes: each pass decodes all four rows. Requests that took turns
    // (a pass each) would pass the check above, not this one.
    let decoding = |health: &Value| {
        let count = |name: &str| health["decoding"][name].as_u64().unwrap();
        (count("passes"), count("rows"), count("widest"))
    };
    let (passes, rows, _) = decoding(&health);
    let since = Instant::now();
    let (more_passes, more_rows, widest) = loop {
        let (_, health) = server.get("/health");
        let (p, r, widest) = decoding(&health);
        if p >= passes + 100 {
            break (p - passes, r - rows, widest);
        }
        assert!(
            since.elapsed() < Duration::from_secs(20),
            "the streams stalled: {health}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // The counts are read while passes go on: a pass's rows may be counted before the pass.
    let per_pass = more_rows as f64 / more_passes as f64;
    assert!(
        per_pass > 3.9 && per_pass < 4.1 && widest == 4,
        "{more_rows} rows in {more_passes} passes, {widest} in the widest"
    );
    drop(open);

    // Requests of different prompts, lengths, seeds and n, sent together, join and leave the
    // batch at different steps: each text is generate's for its seed.
    let sampling = SamplingParams {
        temperature: 0.8,
        top_k: None,
        ..SamplingParams::default()
    };
    let cases = [
        ("ROMEO:", 30, 1, 1),
        ("JULIET:\nO", 12, 2, 2),
        ("A", 25, 3, 1),
        ("First", 7, 4, 3),
    ];
    let answers: Vec<Value> = std::thread::scope(|scope| {
        let handles: Vec<_> = cases
            .iter()
            .map(|&(prompt, tokens, seed, n)| {
                let server = &server;
                scope.spawn(move || {
                    let request = json!({"model": "tiny", "prompt": prompt, "max_tokens": tokens,
                        "temperature": 0.8, "seed": seed, "n": n});
                    server.complete(&request)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap().1).collect()
    });
    for ((prompt, tokens, seed, n), answer) in cases.iter().zip(&answers) {
        let expected = generated(&run, prompt, sampling, *n, *seed, *tokens);
        let texts: Vec<&str> = answer["choices"]
            .as_array()
            .unwrap_or_else(|| panic!("{answer}"))
            .iter()
            .map(|c| c["text"].as_str().unwrap())
            .collect();
        assert_eq!(texts, expected, "{prompt:?}, seed {seed}, n {n}");
    }
}

/// Under load a stream's text comes in fewer, longer chunks: with 50 texts decoding (49 open
/// streams and its own), a request's chunks of text are 100 ms apart or more, its first and its
/// last aside, where alone they may come every 20 ms (`engine::choice::gap`).
#[test]
fn under_load_a_streams_chunks_are_spread_by_all_the_texts_decoding() {
    let dir = tempfile::tempdir().unwrap();
    trained_run(dir.path());
    let max = LONG.to_string();
    let server = Server::start(dir.path(), &["--runs", "runs", "--max-tokens", &max]);
    let _open: Vec<_> = (0..49).map(|_| busy_stream(&server)).collect();
    let request = json!({"model": "tiny", "prompt": "ROMEO:", "max_tokens": 5000, "stream": true});
    let since = Instant::now();
    let (status, _, stream) = server.post_raw("/v1/completions", &request.to_string(), None);
    let wall = since.elapsed();
    assert_eq!(status, 200, "{stream}");
    let (texts, _) = streamed(&stream, 1);
    assert_eq!(texts[0].1, "length", "{stream}");
    let with_text = events(&stream)
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter(|chunk| {
            chunk["choices"][0]["text"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
        })
        .count();
    let most = 2 + (wall.as_millis() / 100) as usize;
    assert!(
        (2..=most).contains(&with_text),
        "{with_text} chunks of text in {wall:?}: at most {most} with 50 texts decoding"
    );
}

/// Hugging Face folders under `--runs` are models too: an exported folder itself, and a folder
/// whose `latest/` is one (as `scripts/continue_in_pytorch.py` writes).
#[test]
fn hugging_face_folders_under_runs_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let run = trained_run(dir.path());
    let export = common::train_binary().with_file_name("export");
    let runs = dir.path().join("runs");
    for out in [runs.join("exported"), runs.join("continued").join("latest")] {
        let status = std::process::Command::new(&export)
            .arg("--checkpoint")
            .arg(&run)
            .arg("--out")
            .arg(&out)
            .status()
            .unwrap();
        assert!(status.success());
    }
    let server = Server::start(dir.path(), &["--runs", "runs"]);
    let ids = server.model_ids();
    assert_eq!(ids, ["continued", "exported", "tiny"]);
    let request = json!({"prompt": "ROMEO:", "max_tokens": 8, "temperature": 0});
    let mut texts = Vec::new();
    for model in ids {
        let mut request = request.clone();
        request["model"] = json!(model);
        let (status, body) = server.complete(&request);
        assert_eq!(status, 200, "{model}: {body}");
        texts.push(body["choices"][0]["text"].as_str().unwrap().to_string());
    }
    assert!(
        texts.iter().all(|t| *t == texts[0]),
        "the same model: {texts:?}"
    );
}
