//! Hugging Face GPT-2 folders: tiny ones that the tests write themselves, with GPT-2's own
//! tensor names, read by every command and written back by `export`.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use burn::prelude::*;
use cinder::sampling::generate::{GenerateOptions, generate};
use cinder::sampling::{DEFAULT_PROMPT, DEFAULT_TOP_K, SamplingParams, prompt_ids};
use cinder::storage::checkpoint;
use cinder::storage::hf::Architecture::Gpt2;
use cinder::storage::names::{BEST, LATEST};
use cinder_data::BpeTokenizer;
use cinder_model::{Activation, GptConfig, Norm, Ops, Position};
use cinder_testing::max_diff;
use common::{fails_with, stdout_of};
use safetensors::Dtype;
use serde_json::json;

const N_LAYER: usize = 2;
const N_EMBD: usize = 16;
const N_POSITIONS: usize = 32;

fn cmd(bin: &str) -> assert_cmd::Command {
    assert_cmd::Command::cargo_bin(bin).unwrap()
}

/// A byte-level BPE as GPT-2 has, trained small.
fn tokenizer() -> BpeTokenizer {
    let text = common::shakespeare(5_000);
    BpeTokenizer::train(text.lines(), 300).unwrap()
}

/// GPT-2's tensors for a model of the constants above and `vocab` tokens, by GPT-2's names,
/// with the attention-mask buffer GPT-2 files carry. Values are small and seeded; LayerNorm
/// scales are near 1.
fn gpt2_tensors(vocab: usize, seed: u64) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let (c, p) = (N_EMBD, N_POSITIONS);
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2
    };
    let mut t = |name: String, shape: Vec<usize>, offset: f32| {
        let n = shape.iter().product();
        let values = (0..n).map(|_| offset + next()).collect();
        (name, shape, values)
    };
    let mut out = vec![
        t("wte.weight".into(), vec![vocab, c], 0.0),
        t("wpe.weight".into(), vec![p, c], 0.0),
    ];
    for i in 0..N_LAYER {
        let h = |name: &str| format!("h.{i}.{name}");
        out.extend([
            t(h("ln_1.weight"), vec![c], 1.0),
            t(h("ln_1.bias"), vec![c], 0.0),
            t(h("attn.bias"), vec![1, 1, p, p], 0.0),
            t(h("attn.c_attn.weight"), vec![c, 3 * c], 0.0),
            t(h("attn.c_attn.bias"), vec![3 * c], 0.0),
            t(h("attn.c_proj.weight"), vec![c, c], 0.0),
            t(h("attn.c_proj.bias"), vec![c], 0.0),
            t(h("ln_2.weight"), vec![c], 1.0),
            t(h("ln_2.bias"), vec![c], 0.0),
            t(h("mlp.c_fc.weight"), vec![c, 4 * c], 0.0),
            t(h("mlp.c_fc.bias"), vec![4 * c], 0.0),
            t(h("mlp.c_proj.weight"), vec![4 * c, c], 0.0),
            t(h("mlp.c_proj.bias"), vec![c], 0.0),
        ]);
    }
    out.extend([
        t("ln_f.weight".into(), vec![c], 1.0),
        t("ln_f.bias".into(), vec![c], 0.0),
    ]);
    out
}

/// Writes `tensors` as a safetensors file, each name after `prefix`, in `dtype` (F32 or F16).
fn write_safetensors(
    path: &Path,
    tensors: &[(String, Vec<usize>, Vec<f32>)],
    prefix: &str,
    dtype: Dtype,
) {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, v)| match dtype {
            Dtype::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Dtype::F16 => v
                .iter()
                .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                .collect(),
            Dtype::BF16 => v
                .iter()
                .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                .collect(),
            other => panic!("{other:?}"),
        })
        .collect();
    let views: Vec<_> = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, shape, _), b)| {
            let view = safetensors::tensor::TensorView::new(dtype, shape.clone(), b).unwrap();
            (format!("{prefix}{name}"), view)
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// A GPT-2 folder in `dir`: `config.json` (with `changes` applied), the tensors of
/// [`gpt2_tensors`] under `prefix` in `dtype`, and a byte-level BPE's `tokenizer.json`.
fn write_folder(dir: &Path, prefix: &str, dtype: Dtype, changes: serde_json::Value) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let tok = tokenizer();
    let mut config = json!({
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": tok.vocab_size(),
        "n_positions": N_POSITIONS,
        "n_embd": N_EMBD,
        "n_layer": N_LAYER,
        "n_head": 2,
        "n_inner": null,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.1,
        "embd_pdrop": 0.1,
        "attn_pdrop": 0.1,
    });
    for (k, v) in changes.as_object().unwrap() {
        config[k] = v.clone();
    }
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tok.to_json()).unwrap();
    let vocab = config["vocab_size"].as_u64().unwrap() as usize;
    let tensors = gpt2_tensors(vocab, 7);
    write_safetensors(&dir.join("model.safetensors"), &tensors, prefix, dtype);
    dir.to_path_buf()
}

/// Every tensor of an exported file, by GPT-2's names without `transformer.`.
fn read_tensors(path: &Path) -> HashMap<String, (Vec<usize>, Vec<f32>)> {
    common::read_tensors(path, "transformer.")
}

/// Next-token logits of `model` for a fixed sequence.
fn logits(model: &cinder_model::Gpt, device: &Device) -> Vec<f32> {
    let ids: Vec<i64> = (0..20).map(|i| (i * 37 % 250) as i64).collect();
    let idx = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, 20]), device);
    model
        .forward(idx)
        .into_data()
        .convert::<f32>()
        .try_to_vec()
        .unwrap()
}

#[test]
fn import_then_export_gives_the_same_tensor_values() {
    let dir = tempfile::tempdir().unwrap();
    let folder = write_folder(&dir.path().join("gpt2"), "", Dtype::F32, json!({}));
    let out = dir.path().join("exported");
    stdout_of(
        cmd("export")
            .arg("--checkpoint")
            .arg(&folder)
            .arg("--out")
            .arg(&out),
    );

    let written = read_tensors(&out.join("model.safetensors"));
    let mut expected = 0;
    for (name, shape, values) in gpt2_tensors(tokenizer().vocab_size(), 7) {
        if name.ends_with(".attn.bias") {
            assert!(!written.contains_key(&name), "{name} is a buffer");
            continue;
        }
        let (got_shape, got) = &written[&name];
        assert_eq!(got_shape, &shape, "{name}");
        assert_eq!(got, &values, "{name}");
        expected += 1;
    }
    assert_eq!(written.len(), expected, "no other tensors");
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["activation_function"], "gelu_new");
    assert_eq!(config["n_positions"], N_POSITIONS);
    assert_eq!(
        std::fs::read_to_string(out.join("tokenizer.json")).unwrap(),
        tokenizer().to_json()
    );
    // The export is itself a GPT-2 folder that loads; a second export never overwrites it.
    stdout_of(
        cmd("export")
            .arg("--checkpoint")
            .arg(&out)
            .arg("--out")
            .arg(dir.path().join("again")),
    );
    fails_with(
        cmd("export")
            .arg("--checkpoint")
            .arg(&folder)
            .arg("--out")
            .arg(&out),
        &["already holds config.json", "new or empty folder"],
    );
}

/// The run configuration of a model of this file's GPT-2 shape (nanoGPT's recipe otherwise).
fn small_gpt2() -> cinder::config::TrainConfig {
    cinder::config::TrainConfig {
        n_layer: N_LAYER,
        n_head: 4,
        n_embd: N_EMBD,
        block_size: N_POSITIONS,
        ..cinder::config::TrainConfig::default()
    }
}

/// A model with an option no GPT-2 folder can express is refused by that option's name, and
/// nothing is written.
#[test]
fn export_refuses_what_gpt2_cannot_express_by_name() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let device = common::backend().device;
    let gpt2 = small_gpt2();
    type Option = fn(&mut cinder::config::TrainConfig);
    let cases: [(Option, &str, &str); 6] = [
        (|c| c.activation = Activation::Relu2, "activation", "relu2"),
        (|c| c.n_kv_head = 2, "n_kv_head", "2"),
        (|c| c.position = Position::Rope, "position", "rope"),
        (|c| c.norm = Norm::Rmsnorm, "norm", "rmsnorm"),
        (|c| c.qk_norm = true, "qk_norm", "true"),
        (|c| c.logit_softcap = 30.0, "logit_softcap", "30"),
    ];
    let tok = cinder_data::Tokenizer::Bpe(tokenizer());
    for (set, field, value) in cases {
        let mut config = gpt2.clone();
        set(&mut config);
        let model = config.model(tok.vocab_size()).init(&device).unwrap();
        let folder = dir.path().join(field);
        let err =
            cinder::storage::hf::export(&folder, &model, &config, &tok, Some(Gpt2)).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains(field) && message.contains(value),
            "{message}"
        );
        assert!(!folder.exists(), "nothing written");
    }
}

/// An untied head is written as Hugging Face writes one (`lm_head.weight` beside the
/// transformer's tensors, `tie_word_embeddings: false`), and read back as the same model.
#[test]
fn an_untied_head_exports_as_lm_head_and_imports_back() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let device = common::backend().device;
    device.seed(4);
    let config = cinder::config::TrainConfig {
        tie_embeddings: false,
        ..small_gpt2()
    };
    let tok = cinder_data::Tokenizer::Bpe(tokenizer());
    let model = config.model(tok.vocab_size()).init(&device).unwrap();
    let folder = dir.path().join("gpt2");
    cinder::storage::hf::export(&folder, &model, &config, &tok, Some(Gpt2)).unwrap();
    let hf: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(folder.join("config.json")).unwrap())
            .unwrap();
    assert_eq!(hf["tie_word_embeddings"], json!(false));
    let tensors = read_tensors(&folder.join("model.safetensors"));
    let head = &tensors["lm_head.weight"];
    assert_eq!(head.0, vec![tok.vocab_size(), N_EMBD]);
    let own: Vec<f32> = model
        .lm_head
        .as_ref()
        .unwrap()
        .val()
        .into_data()
        .try_to_vec()
        .unwrap();
    assert_eq!(head.1, own);

    let loaded = checkpoint::load(&folder, &[BEST, LATEST], &device).unwrap();
    assert!(!loaded.meta.config.tie_embeddings);
    let d = max_diff(&logits(&model, &device), &logits(&loaded.model, &device));
    assert!(d < 1e-5, "logits differ by {d}");
}

/// A cinder model with GPT-2's tanh GELU and an unusual epsilon, exported and imported: the
/// imported model (fused layers) gives the logits of the original on Burn's composite layers.
#[test]
fn an_imported_model_gives_the_composite_models_logits() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let device = common::backend().device;
    device.seed(3);
    let config = cinder::config::TrainConfig {
        activation: Activation::GeluTanh,
        layer_norm_epsilon: 1e-2,
        ..small_gpt2()
    };
    let tok = cinder_data::Tokenizer::Bpe(tokenizer());
    let model = config.model(tok.vocab_size()).init(&device).unwrap();
    let folder = dir.path().join("gpt2");
    cinder::storage::hf::export(&folder, &model, &config, &tok, Some(Gpt2)).unwrap();

    let loaded = checkpoint::load(&folder, &[BEST, LATEST], &device).unwrap();
    assert_eq!(loaded.meta.config.activation, Activation::GeluTanh);
    assert_eq!(
        loaded.meta.config.optimizer,
        cinder::config::OptimizerKind::Adamw,
        "a GPT-2 folder is trained with AdamW unless a config says otherwise"
    );
    assert_eq!(loaded.meta.config.layer_norm_epsilon, 1e-2);
    let want = logits(&model.clone().with_ops(Ops::Composite), &device);
    let got = logits(&loaded.model, &device);
    let d = max_diff(&want, &got);
    assert!(d < 1e-4, "logits differ by {d}");
    // The exact GELU and the default epsilon give other logits: the settings were used.
    let exact = GptConfig {
        activation: Activation::Gelu,
        layer_norm_epsilon: 1e-5,
        ..loaded.meta.config.model(tok.vocab_size())
    };
    let other = cinder::storage::hf::load_weights(&folder, &exact, &device).unwrap();
    assert!(max_diff(&want, &logits(&other, &device)) > 1e-3);
}

#[test]
fn both_key_spellings_and_half_precision_load_alike() {
    let dir = tempfile::tempdir().unwrap();
    let device = common::backend().device;
    let load = |prefix: &str, dtype: Dtype, name: &str| {
        let folder = write_folder(&dir.path().join(name), prefix, dtype, json!({}));
        let loaded = checkpoint::load(&folder, &[BEST, LATEST], &device).unwrap();
        logits(&loaded.model, &device)
    };
    let plain = load("", Dtype::F32, "plain");
    let prefixed = load("transformer.", Dtype::F32, "prefixed");
    assert_eq!(plain, prefixed);
    // Half precision keeps about 3 decimal digits of these small values, bfloat16 about 2.
    for (dtype, tolerance) in [(Dtype::F16, 1e-2), (Dtype::BF16, 5e-2)] {
        let half = load("transformer.", dtype, &format!("{dtype:?}"));
        let d = max_diff(&plain, &half);
        assert!(d > 0.0 && d < tolerance, "{dtype:?} logits differ by {d}");
    }
}

#[test]
fn damaged_or_mismatched_folders_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let make = |name: &str, changes| write_folder(&dir.path().join(name), "", Dtype::F32, changes);
    let generate = |folder: &Path| {
        let mut c = cmd("generate");
        c.arg("--checkpoint")
            .arg(folder)
            .args(["--max-new-tokens", "3"]);
        c
    };

    let folder = make("no-tokenizer", json!({}));
    std::fs::remove_file(folder.join("tokenizer.json")).unwrap();
    fails_with(&mut generate(&folder), &["tokenizer.json is missing"]);

    let folder = make("wider", json!({ "n_embd": 32 }));
    fails_with(
        &mut generate(&folder),
        &["tensor `wte.weight` has shape", ", 16]", ", 32]"],
    );

    let folder = make("relu", json!({ "activation_function": "relu" }));
    fails_with(
        &mut generate(&folder),
        &["`activation_function`", "\"relu\"", "gelu_new"],
    );

    let folder = make("inner", json!({ "n_inner": 20 }));
    fails_with(
        &mut generate(&folder),
        &["`n_inner` is 20", "4 * n_embd = 64"],
    );

    let folder = make("heads", json!({ "n_head": 3 }));
    fails_with(&mut generate(&folder), &["`n_embd`", "multiple of n_head"]);

    let folder = make("truncated", json!({}));
    let weights = folder.join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
    fails_with(&mut generate(&folder), &["model.safetensors is damaged"]);

    let folder = make("missing-tensor", json!({}));
    let mut tensors = gpt2_tensors(tokenizer().vocab_size(), 7);
    tensors.retain(|(name, _, _)| name != "h.1.mlp.c_fc.bias");
    write_safetensors(&folder.join("model.safetensors"), &tensors, "", Dtype::F32);
    fails_with(&mut generate(&folder), &["`h.1.mlp.c_fc.bias` is missing"]);

    let folder = make("bad-json", json!({}));
    std::fs::write(folder.join("config.json"), "{ \"n_embd\": ").unwrap();
    fails_with(
        &mut generate(&folder),
        &["config.json is damaged", "not valid JSON"],
    );

    // Weights but no optimizer state: a run starts from it, but does not resume it.
    let folder = make("resume", json!({}));
    fails_with(
        cmd("train")
            .current_dir(dir.path())
            .arg("--resume")
            .arg(&folder),
        &["is a Hugging Face folder", "--init-from"],
    );
}

/// `train --init-from` a GPT-2 folder fine-tunes it; the run's checkpoints keep GPT-2's
/// settings and tokenizer; `evaluate` measures a text shorter than the context, and `inspect`
/// reads the folder.
#[test]
fn a_gpt2_folder_fine_tunes_and_evaluates() {
    let dir = tempfile::tempdir().unwrap();
    let folder = write_folder(
        &dir.path().join("gpt2"),
        "transformer.",
        Dtype::F16,
        json!({ "layer_norm_epsilon": 1e-3 }),
    );
    let text = dir.path().join("text.txt");
    std::fs::write(&text, common::shakespeare(8_000)).unwrap();
    let run = dir.path().join("run");
    // `train --init-from` the folder on the text, into `out`.
    let fine_tune = |out: &Path| {
        let mut c = cmd("train");
        c.current_dir(dir.path())
            .arg("--init-from")
            .arg(&folder)
            .arg("--data")
            .arg(&text)
            .arg("--out")
            .arg(out);
        c
    };
    let settings = [
        "--max-iters=3",
        "--batch-size=2",
        "--eval-interval=3",
        "--eval-iters=1",
        "--dropout=0.1",
        "--learning-rate=1e-4",
        "--min-lr=1e-5",
        "--warmup-iters=1",
        "--lr-decay-iters=3",
        "--block-size=16", // crops GPT-2's 32 positions
    ];
    stdout_of(fine_tune(&run).args(settings));
    let meta = checkpoint::load_meta(&run.join(LATEST)).unwrap();
    assert_eq!(meta.iter, 3);
    // GPT-2's architecture, and AdamW, whatever the default run's recipe is.
    let c = &meta.config;
    assert_eq!(
        (c.position, c.norm, c.qk_norm),
        (Position::Learned, Norm::Layernorm, false)
    );
    assert_eq!((c.tie_embeddings, c.logit_softcap), (true, 0.0));
    assert_eq!(c.optimizer, cinder::config::OptimizerKind::Adamw);
    assert_eq!(meta.config.activation, Activation::GeluTanh);
    assert_eq!(meta.config.layer_norm_epsilon, 1e-3);
    assert_eq!((meta.config.n_embd, meta.config.block_size), (N_EMBD, 16));
    fails_with(
        fine_tune(&dir.path().join("longer")).args(["--block-size", "64"]),
        &["--block-size 64 contradicts", "block_size = 32"],
    );

    let short = dir.path().join("short.txt");
    std::fs::write(&short, "To be, or not").unwrap();
    for checkpoint in [&folder, &run] {
        let out = stdout_of(
            cmd("evaluate")
                .arg("--checkpoint")
                .arg(checkpoint)
                .arg("--data")
                .arg(&short)
                .arg("-q"),
        );
        assert!(out.starts_with("loss "), "{out}");
    }
    fails_with(
        cmd("evaluate").arg("--checkpoint").arg(&folder),
        &["no training text", "--data"],
    );
    // inspect labels positions with the BPE's tokens.
    let out = stdout_of(
        cmd("inspect")
            .arg("--checkpoint")
            .arg(&folder)
            .args(["--text", "To be, or not", "--out"])
            .arg(dir.path().join("maps")),
    );
    assert!(out.starts_with("position "), "{out}");
    let json = std::fs::read_to_string(dir.path().join("maps/attention.json")).unwrap();
    let maps: cinder::inspect::AttentionMaps = serde_json::from_str(&json).unwrap();
    assert_eq!(maps.tokens.concat(), "To be, or not");
    assert!(
        maps.tokens.len() < 13,
        "tokens, not characters: {:?}",
        maps.tokens
    );
}

/// A text shorter than the context is one window of its own length: its loss is the model's
/// loss on the whole text.
#[test]
fn a_short_text_is_one_window() {
    let _serial = common::serial();
    let device = common::backend().device;
    device.seed(9);
    let model = GptConfig::new(11, 16)
        .with_n_layer(1)
        .with_n_head(2)
        .with_n_embd(8)
        .init(&device)
        .unwrap();
    let ids: Vec<u32> = vec![3, 1, 4, 1, 5, 9, 2, 6];
    let result = cinder::run::eval::text_loss(&model, &ids, 4, &device, |_, _| {});
    assert_eq!(result.predicted, 7);
    let t = |v: &[u32]| {
        let v: Vec<i64> = v.iter().map(|&i| i64::from(i)).collect();
        Tensor::<2, Int>::from_data(TensorData::new(v, [1, 7]), &device)
    };
    let whole: f32 = model.loss(t(&ids[..7]), t(&ids[1..]), None).into_scalar();
    assert!(
        (result.loss - f64::from(whole)).abs() < 1e-6,
        "{} vs {whole}",
        result.loss
    );
}

/// nanoGPT pads GPT-2's vocabulary (50,257 to 50,304 rows): a folder whose `vocab_size` exceeds
/// its tokenizer's loads with the model's rows, and samples only the tokenizer's ids; one below
/// it is refused.
#[test]
fn a_padded_vocabulary_loads_and_samples_known_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = tokenizer().vocab_size();
    let padded = tokens + 20;
    let folder = write_folder(
        &dir.path().join("padded"),
        "",
        Dtype::F32,
        json!({ "vocab_size": padded }),
    );
    let device = common::backend().device;
    let loaded = checkpoint::load(&folder, &[BEST, LATEST], &device).unwrap();
    assert_eq!(loaded.model.vocab_size(), padded);
    assert_eq!(loaded.tokenizer.vocab_size(), tokens);
    assert_eq!(loaded.meta.config.vocab_size, padded);
    // generate's sampling: 40 tokens at temperature 2 after the default prompt, seed 1337. The
    // padding rows are likely enough that a sampler blind to the tokenizer picks them.
    let sample = |tokens: usize| {
        let opts = GenerateOptions {
            max_new_tokens: 40,
            num_samples: 1,
            sampling: SamplingParams {
                temperature: 2.0,
                top_k: Some(DEFAULT_TOP_K),
                ..SamplingParams::default()
            },
            seed: 1337,
            use_cache: true,
            tokens,
        };
        let prompt = prompt_ids(&loaded.tokenizer, DEFAULT_PROMPT, false).unwrap();
        generate(&loaded.model, &prompt, &opts, &device, |_| {}).remove(0)
    };
    let blind = sample(padded);
    assert!(
        blind.iter().any(|&id| id as usize >= tokens),
        "no padding id even when allowed: {blind:?}"
    );
    let ids = sample(tokens);
    assert!(
        ids.iter().all(|&id| (id as usize) < tokens),
        "a padding id was picked: {ids:?}"
    );
    let out = stdout_of(cmd("generate").arg("--checkpoint").arg(&folder).args([
        "--max-new-tokens",
        "40",
        "--temperature",
        "2",
        "--seed",
        "1337",
        "-q",
    ]));
    assert_eq!(out, loaded.tokenizer.decode(&ids) + "\n");

    let folder = write_folder(
        &dir.path().join("short"),
        "",
        Dtype::F32,
        json!({ "vocab_size": tokens - 1 }),
    );
    fails_with(
        cmd("generate").arg("--checkpoint").arg(&folder),
        &["`vocab_size`", "tokenizer.json"],
    );
}
