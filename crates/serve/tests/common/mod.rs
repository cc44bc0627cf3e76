//! What the tests of `serve` share: a small model trained here, a running `serve`, and reading
//! server-sent events.

#![allow(dead_code)] // each test file uses its part

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use cinder::device::Backend;
use cinder::sampling::SamplingParams;
use cinder::sampling::generate::{GenerateOptions, generate};
use cinder::storage::checkpoint;
use cinder::storage::names::{BEST, LATEST};
use serde_json::{Value, json};

/// A run folder `runs/tiny` under `dir`, trained for a few steps on some Shakespeare.
pub fn trained_run(dir: &Path) -> PathBuf {
    train(dir, "tiny", &[])
}

/// The tiny model's recipe: 10 iterations, evaluated and saved at the end.
const TINY: &[(&str, &str)] = &[
    ("n-layer", "1"),
    ("n-head", "2"),
    ("n-embd", "32"),
    ("block-size", "32"),
    ("batch-size", "4"),
    ("max-iters", "10"),
    ("warmup-iters", "2"),
    ("lr-decay-iters", "10"),
    ("eval-interval", "10"),
    ("eval-iters", "1"),
    ("log-interval", "1"),
    ("checkpoint-interval", "10"),
    ("sample-tokens", "0"),
];

/// The text the tests train on: the start of Tiny Shakespeare, in `dir/corpus.txt`.
pub fn corpus(dir: &Path) -> PathBuf {
    let text = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/tinyshakespeare.txt");
    let text: String = std::fs::read_to_string(text)
        .unwrap()
        .chars()
        .take(20_000)
        .collect();
    let corpus = dir.join("corpus.txt");
    std::fs::write(&corpus, text).unwrap();
    corpus
}

/// The `train` binary, built beside `serve` by the workspace's tests.
pub fn train_binary() -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_serve")).with_file_name("train");
    assert!(
        path.exists(),
        "{} is missing: build it first (cargo build --release --bin train), or run the \
         workspace's tests (cargo test --release --workspace)",
        path.display()
    );
    path
}

/// A run folder `runs/<name>` under `dir`, trained by `train` with the tiny recipe, changed by
/// `changes` (flag without `--`, value; flags the recipe does not set are added).
pub fn train(dir: &Path, name: &str, changes: &[(&str, &str)]) -> PathBuf {
    let corpus = corpus(dir);
    let run = dir.join("runs").join(name);
    let mut command = Command::new(train_binary());
    command.arg("--data").arg(&corpus).arg("--out").arg(&run);
    for (flag, value) in TINY {
        let value = changes
            .iter()
            .find(|(f, _)| f == flag)
            .map_or(*value, |(_, v)| *v);
        command.arg(format!("--{flag}")).arg(value);
    }
    for (flag, value) in changes
        .iter()
        .filter(|(f, _)| TINY.iter().all(|(t, _)| t != f))
    {
        command.arg(format!("--{flag}")).arg(value);
    }
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "train failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    run
}

/// A running `serve`, stopped when dropped.
pub struct Server {
    pub child: Child,
    pub url: String,
    pub log: PathBuf,
}

impl Server {
    pub fn start(dir: &Path, args: &[&str]) -> Server {
        Self::start_with(dir, args, &[])
    }

    /// `serve` with `args` and the environment variables `env` (the caller's CINDER_API_KEY
    /// never).
    pub fn start_with(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        let log = dir.join(format!("serve-{}.log", std::process::id()));
        let mut child = Command::new(env!("CARGO_BIN_EXE_serve"))
            .current_dir(dir)
            .env_remove("CINDER_API_KEY")
            .envs(env.iter().copied())
            .args(["--port", "0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("no address in {line:?}: {}", read(&log)))
            .to_string();
        Server { child, url, log }
    }

    pub fn agent() -> ureq::Agent {
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into()
    }

    /// POSTs `body` (JSON text) to `path`: the status, the Retry-After header, the body.
    pub fn post_raw(
        &self,
        path: &str,
        body: &str,
        key: Option<&str>,
    ) -> (u16, Option<String>, String) {
        let mut request = Self::agent()
            .post(format!("{}{path}", self.url))
            .header("Content-Type", "application/json");
        if let Some(key) = key {
            request = request.header("Authorization", format!("Bearer {key}"));
        }
        let mut response = request.send(body).unwrap();
        let retry = response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_string());
        let status = response.status().as_u16();
        (status, retry, response.body_mut().read_to_string().unwrap())
    }

    /// POSTs `body` to /v1/completions: the status and the JSON answered.
    pub fn complete(&self, body: &Value) -> (u16, Value) {
        let (status, _, text) = self.post_raw("/v1/completions", &body.to_string(), None);
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// The ids `GET /v1/models` lists.
    pub fn model_ids(&self) -> Vec<String> {
        let (_, models) = self.get("/v1/models");
        models["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_string())
            .collect()
    }

    pub fn get(&self, path: &str) -> (u16, Value) {
        let mut response = Self::agent()
            .get(format!("{}{path}", self.url))
            .call()
            .unwrap();
        let text = response.body_mut().read_to_string().unwrap();
        (
            response.status().as_u16(),
            serde_json::from_str(&text).unwrap(),
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The `data:` payloads of a server-sent event stream.
pub fn events(stream: &str) -> Vec<String> {
    stream
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

/// Each choice's text and finish_reason from a stream's chunks, and its usage chunk.
pub fn streamed(stream: &str, choices: usize) -> (Vec<(String, String)>, Option<Value>) {
    let events = events(stream);
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{stream}"
    );
    let mut texts = vec![(String::new(), String::new()); choices];
    let mut usage = None;
    for event in &events[..events.len() - 1] {
        let chunk: Value = serde_json::from_str(event).unwrap();
        assert_eq!(chunk["object"], "text_completion");
        if chunk["choices"] == json!([]) {
            usage = Some(chunk["usage"].clone());
            continue;
        }
        for choice in chunk["choices"].as_array().unwrap() {
            let i = choice["index"].as_u64().unwrap() as usize;
            texts[i].0.push_str(choice["text"].as_str().unwrap());
            if let Some(reason) = choice["finish_reason"].as_str() {
                assert!(
                    texts[i].1.is_empty(),
                    "two finish_reasons for {i}: {stream}"
                );
                texts[i].1 = reason.to_string();
            }
        }
    }
    (texts, usage)
}

/// The checkpoint of the run at `run` (best/, else latest/), on the CPU, and the device.
pub fn loaded(run: &Path) -> (checkpoint::Loaded, burn::prelude::Device) {
    let device = Backend::cpu().unwrap().device;
    (
        checkpoint::load(run, &[BEST, LATEST], &device).unwrap(),
        device,
    )
}

/// `evaluate`'s loss (`text_loss`) on `text` under the run's model.
pub fn evaluated(run: &Path, text: &str) -> f64 {
    let (loaded, device) = loaded(run);
    let ids = loaded.tokenizer.encode(text).unwrap();
    cinder::run::eval::text_loss(&loaded.model, &ids, 1, &device, |_, _| {}).loss
}

/// `generate`'s samples (the library's, as the binary calls it) from the run at `run`.
pub fn generated(
    run: &Path,
    prompt: &str,
    sampling: SamplingParams,
    n: usize,
    seed: u64,
    tokens: usize,
) -> Vec<String> {
    let (loaded, device) = loaded(run);
    let ids = loaded.tokenizer.encode(prompt).unwrap();
    let opts = GenerateOptions {
        max_new_tokens: tokens,
        num_samples: n,
        sampling,
        seed,
        use_cache: true,
        tokens: loaded.tokenizer.vocab_size(),
    };
    let samples = generate(&loaded.model, &ids, &opts, &device, |_| {});
    samples.iter().map(|s| loaded.tokenizer.decode(s)).collect()
}

/// More tokens than a test waits for.
pub const LONG: usize = 1_000_000;

/// Starts a long streamed completion on `server` and returns its reader once the first chunk
/// has come: the worker is busy with it from then on.
pub fn busy_stream(server: &Server) -> impl Read + use<> {
    let body = json!({"model": "tiny", "prompt": "ROMEO:", "max_tokens": LONG, "stream": true});
    let response = Server::agent()
        .post(format!("{}/v1/completions", server.url))
        .header("Content-Type", "application/json")
        .send(body.to_string())
        .unwrap();
    let mut reader = BufReader::new(response.into_body().into_reader());
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        let read = reader.read_line(&mut line).unwrap();
        assert!(read > 0, "the stream ended before its first chunk");
    }
    reader
}
