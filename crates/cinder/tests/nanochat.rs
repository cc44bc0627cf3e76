//! Hugging Face NanoChat folders: the default recipe's model exported, read back, checked
//! against a naive NanoChat written here from `transformers`' `modeling_nanochat.py`, and
//! refused by name where it cannot be expressed.

mod common;

use std::collections::HashMap;
use std::path::Path;

use burn::module::Param;
use burn::prelude::*;
use cinder::config::TrainConfig;
use cinder::storage::hf::{self, Architecture};
use cinder_data::{CharTokenizer, Tokenizer};
use cinder_model::Gpt;
use common::{fails_with, stdout_of};
use safetensors::Dtype;
use serde_json::{Value, json};

fn cmd(bin: &str) -> assert_cmd::Command {
    assert_cmd::Command::cargo_bin(bin).unwrap()
}

/// The text of the tests: newlines, runs of spaces, non-ASCII characters.
const TEXT: &str = "First Citizen:\nBefore we   proceed, hear me speak.\n\nÉté — ça va? 你好\n";

fn chars() -> Tokenizer {
    Tokenizer::Char(CharTokenizer::from_chars(TEXT.chars()))
}

/// The first `n` ids of [`TEXT`].
fn ids_of(tok: &Tokenizer, n: usize) -> Vec<usize> {
    tok.encode(TEXT).unwrap()[..n]
        .iter()
        .map(|&i| i as usize)
        .collect()
}

/// The default recipe's architecture, small, with drawn (not zero) projections.
fn small(changes: impl Fn(&mut TrainConfig)) -> TrainConfig {
    let mut config = TrainConfig {
        n_layer: 2,
        n_head: 4,
        n_embd: 32,
        block_size: 24,
        zero_init: false,
        ..TrainConfig::default_run()
    };
    changes(&mut config);
    config
}

/// A model of `config`, its attention outputs and head scaled up from the initial weights' so
/// that attention moves the logits by much more than the tests' tolerances (at the initial
/// scale, turning the wrong way moves them by 1e-3).
fn model_of(config: &TrainConfig, tok: &Tokenizer, seed: u64) -> Gpt {
    let device = common::backend().device;
    device.seed(seed);
    let mut model = config.model(tok.vocab_size()).init(&device).unwrap();
    let louder = |p: &Param<Tensor<2>>, by: f32| Param::from_tensor(p.val() * by);
    for b in &mut model.blocks {
        b.attn.c_proj.weight = louder(&b.attn.c_proj.weight, 30.0);
    }
    if let Some(head) = &model.lm_head {
        model.lm_head = Some(louder(head, 10.0));
    } else {
        model.wte.weight = louder(&model.wte.weight, 10.0);
    }
    model
}

/// Every tensor of an exported file, by its full name.
fn read_tensors(path: &Path) -> HashMap<String, (Vec<usize>, Vec<f32>)> {
    common::read_tensors(path, "")
}

fn json_of(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Logits `[T, V]` of `model` for `ids`.
fn logits(model: &Gpt, ids: &[usize]) -> Vec<f32> {
    let device = common::backend().device;
    let ids: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
    let idx = Tensor::<2, Int>::from_data(TensorData::new(ids.clone(), [1, ids.len()]), &device);
    model
        .forward(idx)
        .into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .unwrap()
}

/// NanoChat's forward pass, naively, from `transformers`' `modeling_nanochat.py`, over the
/// tensors of an exported folder: `[T, V]` logits of `ids`.
fn naive_nanochat(folder: &Path, ids: &[usize]) -> Vec<f32> {
    let config = json_of(&folder.join("config.json"));
    let t = read_tensors(&folder.join("model.safetensors"));
    let get = |name: &str| &t[name].1;
    let n = |k: &str| config[k].as_u64().unwrap() as usize;
    let (c, heads, kv_heads, layers) = (
        n("hidden_size"),
        n("num_attention_heads"),
        n("num_key_value_heads"),
        n("num_hidden_layers"),
    );
    let eps = config["rms_norm_eps"].as_f64().unwrap();
    let theta = config["rope_parameters"]["rope_theta"].as_f64().unwrap();
    let cap = config["final_logit_softcapping"].as_f64();
    let d = c / heads;
    let rms = |x: &[f32]| -> Vec<f32> {
        let ms = x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / x.len() as f64;
        let r = 1.0 / (ms + eps).sqrt();
        x.iter().map(|v| (*v as f64 * r) as f32).collect()
    };
    // y = x W^T for PyTorch's [out, in] weight
    let linear = |x: &[f32], w: &[f32], out: usize| -> Vec<f32> {
        let inp = x.len();
        (0..out)
            .map(|o| (0..inp).map(|i| x[i] * w[o * inp + i]).sum())
            .collect()
    };
    // rotate_half = cat(x2, -x1); q * cos + rotate_half(q) * sin
    let rope = |x: &mut [f32], pos: usize| {
        let half = d / 2;
        for i in 0..half {
            let inv = 1.0 / theta.powf((2 * i) as f64 / d as f64);
            let (cos, sin) = ((pos as f64 * inv).cos(), (pos as f64 * inv).sin());
            let (a, b) = (x[i] as f64, x[i + half] as f64);
            x[i] = (a * cos + b * sin) as f32;
            x[i + half] = (b * cos - a * sin) as f32;
        }
    };
    let wte = get("model.embed_tokens.weight");
    let mut h: Vec<Vec<f32>> = ids.iter().map(|&i| rms(&wte[i * c..(i + 1) * c])).collect();
    for l in 0..layers {
        let w = |name: &str| get(&format!("model.layers.{l}.{name}.weight"));
        let mut qs = Vec::new();
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        for (pos, x) in h.iter().enumerate() {
            let x = rms(x);
            let (mut q, mut k) = (
                linear(&x, w("self_attn.q_proj"), heads * d),
                linear(&x, w("self_attn.k_proj"), kv_heads * d),
            );
            let v = linear(&x, w("self_attn.v_proj"), kv_heads * d);
            for head in q.chunks_mut(d).chain(k.chunks_mut(d)) {
                rope(head, pos);
                let normed = rms(head);
                head.copy_from_slice(&normed);
            }
            qs.push(q);
            ks.push(k);
            vs.push(v);
        }
        for (pos, x) in h.iter_mut().enumerate() {
            let mut y = vec![0.0f32; heads * d];
            for head in 0..heads {
                let g = head / (heads / kv_heads);
                let q = &qs[pos][head * d..(head + 1) * d];
                let scores: Vec<f64> = (0..=pos)
                    .map(|s| {
                        let k = &ks[s][g * d..(g + 1) * d];
                        q.iter().zip(k).map(|(a, b)| (a * b) as f64).sum::<f64>()
                            / (d as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for (s, p) in e.iter().enumerate() {
                    for j in 0..d {
                        y[head * d + j] += (p / sum) as f32 * vs[s][g * d + j];
                    }
                }
            }
            let o = linear(&y, w("self_attn.o_proj"), c);
            x.iter_mut().zip(o).for_each(|(a, b)| *a += b);
        }
        for x in h.iter_mut() {
            let hidden: Vec<f32> = linear(&rms(x), w("mlp.fc1"), 4 * c)
                .into_iter()
                .map(|v| v.max(0.0).powi(2))
                .collect();
            let o = linear(&hidden, w("mlp.fc2"), c);
            x.iter_mut().zip(o).for_each(|(a, b)| *a += b);
        }
    }
    let head = t.get("lm_head.weight").map_or(wte, |(_, v)| v);
    let vocab = head.len() / c;
    h.iter()
        .flat_map(|x| {
            linear(&rms(x), head, vocab).into_iter().map(|v| match cap {
                Some(cap) => (cap * (v as f64 / cap).tanh()) as f32,
                None => v,
            })
        })
        .collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    cinder_testing::max_diff(a, b)
}

/// The default recipe exports as NanoChat, every value of `config.json` stated; the naive
/// NanoChat over the written tensors computes cinder's logits (tied and untied, capped and not,
/// with grouped key/value heads); reading the folder back gives the same model, and exporting
/// that again the same tensors.
#[test]
fn the_default_recipe_exports_as_nanochat_and_computes_the_same_logits() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let device = common::backend().device;
    let tok = chars();
    let ids = ids_of(&tok, 20);
    type Change = fn(&mut TrainConfig);
    let cases: [(&str, Change); 4] = [
        ("untied", |_| {}),
        ("tied", |c| c.tie_embeddings = true),
        ("capped", |c| c.logit_softcap = 15.0),
        ("grouped", |c| c.n_kv_head = 2),
    ];
    for (name, change) in cases {
        let config = small(change);
        let model = model_of(&config, &tok, 3);
        let folder = dir.path().join(name);
        let written = hf::export(&folder, &model, &config, &tok, None).unwrap();
        assert_eq!(written, Architecture::NanoChat);
        for file in [
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
            "generation_config.json",
        ] {
            assert!(folder.join(file).is_file(), "{name}: {file}");
        }
        let hf_config = json_of(&folder.join("config.json"));
        assert_eq!(hf_config["model_type"], "nanochat");
        assert_eq!(hf_config["architectures"], json!(["NanoChatForCausalLM"]));
        assert_eq!(hf_config["rms_norm_eps"], json!(config.layer_norm_epsilon));
        assert_eq!(hf_config["intermediate_size"], json!(4 * config.n_embd));
        assert_eq!(
            hf_config["max_position_embeddings"],
            json!(config.block_size)
        );
        assert_eq!(
            hf_config["tie_word_embeddings"],
            json!(config.tie_embeddings)
        );
        let cap = (config.logit_softcap != 0.0).then_some(config.logit_softcap);
        assert_eq!(hf_config["final_logit_softcapping"], json!(cap));
        // A character vocabulary has no special tokens: nothing stops generation early.
        for key in ["bos_token_id", "eos_token_id", "pad_token_id"] {
            assert_eq!(hf_config[key], Value::Null, "{name}: {key}");
            assert_eq!(
                json_of(&folder.join("generation_config.json"))[key],
                Value::Null
            );
        }
        let tensors = read_tensors(&folder.join("model.safetensors"));
        assert_eq!(
            tensors.contains_key("lm_head.weight"),
            !config.tie_embeddings,
            "{name}"
        );

        let ours = logits(&model, &ids);
        let theirs = naive_nanochat(&folder, &ids);
        let diff = max_diff(&ours, &theirs);
        assert!(diff < 2e-4, "{name}: logits differ by {diff}");

        let (read, read_tok) = hf::read_config(&folder).unwrap();
        assert_eq!(read_tok.vocab_size(), tok.vocab_size());
        let back = hf::load_weights(&folder, &read.model(tok.vocab_size()), &device).unwrap();
        assert_eq!(max_diff(&logits(&back, &ids), &ours), 0.0, "{name}");
        let again = dir.path().join(format!("{name}-again"));
        hf::export(&again, &back, &read, &read_tok, None).unwrap();
        assert_eq!(
            read_tensors(&again.join("model.safetensors")),
            tensors,
            "{name}: export, import, export"
        );
    }
}

/// The naive NanoChat is a test that can fail: without the sign flip of the queries' and keys'
/// second halves (NanoChat turns by -θ), the logits differ.
#[test]
fn without_the_flip_the_logits_differ() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let tok = chars();
    let ids = ids_of(&tok, 20);
    let config = small(|_| {});
    let model = model_of(&config, &tok, 3);
    let folder = dir.path().join("nanochat");
    hf::export(&folder, &model, &config, &tok, None).unwrap();
    // Undo the flip in the file: negate the second half of each head of q_proj and k_proj.
    let mut tensors = read_tensors(&folder.join("model.safetensors"));
    let d = config.n_embd / config.n_head;
    for (name, (shape, values)) in tensors.iter_mut() {
        if name.ends_with("q_proj.weight") || name.ends_with("k_proj.weight") {
            for (row, chunk) in values.chunks_mut(shape[1]).enumerate() {
                if row % d >= d / 2 {
                    chunk.iter_mut().for_each(|v| *v = -*v);
                }
            }
        }
    }
    let mut named: Vec<_> = tensors.into_iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = named
        .into_iter()
        .map(|(n, (s, v))| (n, s, v.iter().flat_map(|x| x.to_le_bytes()).collect()))
        .collect();
    let views: Vec<_> = bytes
        .iter()
        .map(|(n, s, b)| {
            let view = safetensors::tensor::TensorView::new(Dtype::F32, s.clone(), b).unwrap();
            (n.clone(), view)
        })
        .collect();
    let file = safetensors::serialize(views, None).unwrap();
    std::fs::write(folder.join("model.safetensors"), file).unwrap();
    let diff = max_diff(&logits(&model, &ids), &naive_nanochat(&folder, &ids));
    assert!(diff > 1e-2, "logits differ by only {diff}");
}

/// `export` writes the architecture a model fits, and refuses one that fits neither by naming
/// every field each would need; `--architecture` names every field its architecture needs. Nothing is
/// written.
#[test]
fn export_picks_the_architecture_that_fits_and_names_what_each_needs() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let tok = chars();

    let nanogpt = small(|c| {
        let recipe = TrainConfig::default();
        c.position = recipe.position;
        c.norm = recipe.norm;
        c.qk_norm = recipe.qk_norm;
        c.activation = recipe.activation;
        c.bias = recipe.bias;
    });
    let model = model_of(&nanogpt, &tok, 1);
    let written = hf::export(&dir.path().join("gpt2"), &model, &nanogpt, &tok, None).unwrap();
    assert_eq!(written, Architecture::Gpt2);
    let err = hf::export(
        &dir.path().join("forced"),
        &model,
        &nanogpt,
        &tok,
        Some(Architecture::NanoChat),
    )
    .unwrap_err()
    .to_string();
    // Every field it would need, not the first alone.
    for needs in [
        "NanoChatForCausalLM (nanochat) needs",
        "position = rope (NanoChat has no position table), not learned",
        "norm = rmsnorm",
        "qk_norm = true",
        "activation = relu2",
    ] {
        assert!(err.contains(needs), "{needs:?} in {err}");
    }
    assert!(!dir.path().join("forced").exists());

    // RoPE with LayerNorm: neither.
    let neither = small(|c| c.norm = cinder_model::Norm::Layernorm);
    let model = model_of(&neither, &tok, 1);
    let err = hf::export(&dir.path().join("neither"), &model, &neither, &tok, None)
        .unwrap_err()
        .to_string();
    for needs in [
        "GPT2LMHeadModel (gpt2) needs",
        "position = learned",
        "activation = gelu or gelu_tanh",
        "NanoChatForCausalLM (nanochat) needs norm = rmsnorm",
        "not layernorm",
        "--architecture",
    ] {
        assert!(err.contains(needs), "{needs:?} in {err}");
    }
    assert!(!dir.path().join("neither").exists());
}

/// A NanoChat folder as `transformers` writes one: names under `model.`, BF16 weights, fields
/// left out taking NanoChat's defaults (a soft-cap of 15, an untied head), the tokenizer from
/// `tokenizer.json`; and each bad folder refused by file and field.
#[test]
fn nanochat_folders_load_with_nanochats_defaults_and_are_refused_by_name() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let tok = chars();
    let config = small(|c| c.logit_softcap = 15.0);
    let model = model_of(&config, &tok, 5);
    let exported = dir.path().join("exported");
    hf::export(&exported, &model, &config, &tok, None).unwrap();

    // The same folder, trimmed to the fields transformers cannot do without, in BF16.
    let make = |name: &str, change: &dyn Fn(&mut Value)| {
        let folder = dir.path().join(name);
        std::fs::create_dir_all(&folder).unwrap();
        for file in ["tokenizer.json", "tokenizer_config.json"] {
            std::fs::copy(exported.join(file), folder.join(file)).unwrap();
        }
        let full = json_of(&exported.join("config.json"));
        let mut hf_config = json!({ "model_type": "nanochat" });
        for key in [
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "max_position_embeddings",
            "rms_norm_eps",
        ] {
            hf_config[key] = full[key].clone();
        }
        change(&mut hf_config);
        std::fs::write(folder.join("config.json"), hf_config.to_string()).unwrap();
        let tensors = read_tensors(&exported.join("model.safetensors"));
        let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
            .into_iter()
            .map(|(n, (s, v))| {
                let b = v
                    .iter()
                    .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
                    .collect();
                (n, s, b)
            })
            .collect();
        let views: Vec<_> = bytes
            .iter()
            .map(|(n, s, b)| {
                let view = safetensors::tensor::TensorView::new(Dtype::BF16, s.clone(), b);
                (n.clone(), view.unwrap())
            })
            .collect();
        let file = safetensors::serialize(views, None).unwrap();
        std::fs::write(folder.join("model.safetensors"), file).unwrap();
        folder
    };

    let folder = make("transformers", &|_| {});
    let (read, _) = hf::read_config(&folder).unwrap();
    assert_eq!(read.logit_softcap, 15.0, "NanoChat's default soft-cap");
    assert!(!read.tie_embeddings, "NanoChat's default: untied");
    assert_eq!(read.n_kv_head, config.n_head);
    let device = common::backend().device;
    let back = hf::load_weights(&folder, &read.model(tok.vocab_size()), &device).unwrap();
    let ids = ids_of(&tok, 12);
    let diff = max_diff(&logits(&back, &ids), &logits(&model, &ids));
    assert!(diff > 0.0 && diff < 0.1, "BF16 weights: {diff}");
    // Every command takes it: generate samples it.
    let out = stdout_of(cmd("generate").arg("--checkpoint").arg(&folder).args([
        "--max-new-tokens",
        "5",
        "--prompt",
        "Fir",
    ]));
    assert!(out.starts_with("Fir"), "{out}");
    // An explicit null turns the soft-cap off.
    let folder = make("uncapped", &|c| c["final_logit_softcapping"] = Value::Null);
    assert_eq!(hf::read_config(&folder).unwrap().0.logit_softcap, 0.0);

    let generate = |folder: &Path| {
        let mut c = cmd("generate");
        c.arg("--checkpoint")
            .arg(folder)
            .args(["--max-new-tokens", "3"]);
        c
    };
    type Case<'a> = (&'a str, &'a dyn Fn(&mut Value), &'a [&'a str]);
    let bad: [Case; 6] = [
        (
            "llama",
            &|c| c["model_type"] = json!("llama"),
            &["`model_type` is \"llama\"", "\"gpt2\", \"nanochat\""],
        ),
        (
            "inner",
            &|c| c["intermediate_size"] = json!(100),
            &[
                "config.json",
                "`intermediate_size` is 100",
                "4 * hidden_size = 128",
            ],
        ),
        (
            "scaled",
            &|c| c["rope_parameters"] = json!({"rope_type": "linear", "factor": 2.0}),
            &["`rope_type` is \"linear\"", "no scaling"],
        ),
        (
            "theta",
            &|c| c["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 500000.0}),
            &["`rope_theta` is 500000", "10000"],
        ),
        (
            "wider",
            &|c| {
                c["hidden_size"] = json!(64);
                c["intermediate_size"] = json!(256);
            },
            &[
                "model.safetensors",
                "model.embed_tokens.weight",
                "has shape",
            ],
        ),
        (
            "smaller-vocab",
            &|c| c["vocab_size"] = json!(3),
            &["`vocab_size` is 3", "tokens of tokenizer.json"],
        ),
    ];
    for (name, change, message) in bad {
        let folder = make(name, change);
        fails_with(&mut generate(&folder), message);
    }
    let folder = make("no-tokenizer", &|_| {});
    std::fs::remove_file(folder.join("tokenizer.json")).unwrap();
    fails_with(&mut generate(&folder), &["tokenizer.json is missing"]);
    let folder = make("no-weights", &|_| {});
    std::fs::remove_file(folder.join("model.safetensors")).unwrap();
    fails_with(&mut generate(&folder), &["model.safetensors is missing"]);
    std::fs::write(folder.join("model.safetensors.index.json"), "{}").unwrap();
    fails_with(
        &mut generate(&folder),
        &["index.json", "shards", "one model.safetensors"],
    );
}

/// `export` on a run of the default recipe writes NanoChat; the folder evaluates to the
/// checkpoint's loss, fine-tunes with `train --init-from`, is not resumed, and is inspected.
#[test]
fn a_default_run_exports_and_its_folder_evaluates_and_fine_tunes() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = common::corpus_in(dir.path());
    let run = dir.path().join("run");
    let mut train = cmd("train");
    train
        .current_dir(dir.path())
        // The tiny model, with the default recipe's architecture.
        .args(common::tiny_flags_with(&[
            ("--position", "rope"),
            ("--norm", "rmsnorm"),
            ("--qk-norm", "true"),
            ("--activation", "relu2"),
            ("--bias", "false"),
        ]))
        .arg("--data")
        .arg(&corpus)
        .arg("--out")
        .arg(&run)
        .arg("-q");
    stdout_of(&mut train);
    let folder = dir.path().join("nanochat");
    let out = cmd("export")
        .arg("--checkpoint")
        .arg(&run)
        .arg("--out")
        .arg(&folder)
        .assert()
        .success();
    let said = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert!(said.contains("NanoChatForCausalLM"), "{said}");
    let evaluate = |checkpoint: &Path| {
        stdout_of(
            cmd("evaluate")
                .current_dir(dir.path())
                .arg("--checkpoint")
                .arg(checkpoint)
                .arg("--data")
                .arg(&corpus)
                .arg("-q"),
        )
    };
    let loss = |s: String| -> f64 {
        s.split_whitespace()
            .filter_map(|w| {
                w.trim_matches(|c: char| !c.is_ascii_digit() && c != '.')
                    .parse()
                    .ok()
            })
            .find(|v: &f64| *v > 0.5)
            .unwrap_or_else(|| panic!("no loss in {s}"))
    };
    let (ours, theirs) = (loss(evaluate(&run)), loss(evaluate(&folder)));
    assert!((ours - theirs).abs() < 5e-4, "{ours} against {theirs}");
    stdout_of(
        cmd("train")
            .current_dir(dir.path())
            .arg("--init-from")
            .arg(&folder)
            .arg("--data")
            .arg(&corpus)
            .args([
                "--max-iters",
                "2",
                "--eval-interval",
                "2",
                "--eval-iters",
                "1",
            ])
            .args(["--batch-size", "2", "-q"])
            .arg("--out")
            .arg(dir.path().join("tuned")),
    );
    fails_with(
        cmd("train")
            .current_dir(dir.path())
            .arg("--resume")
            .arg(&folder),
        &["is a Hugging Face folder", "--init-from"],
    );
    // inspect reads it too: its attention maps over the text's characters.
    stdout_of(
        cmd("inspect")
            .arg("--checkpoint")
            .arg(&folder)
            .args(["--text", "To be, or not", "--out"])
            .arg(dir.path().join("maps")),
    );
    let json = std::fs::read_to_string(dir.path().join("maps/attention.json")).unwrap();
    let maps: cinder::inspect::AttentionMaps = serde_json::from_str(&json).unwrap();
    assert_eq!(maps.tokens.concat(), "To be, or not");
}
