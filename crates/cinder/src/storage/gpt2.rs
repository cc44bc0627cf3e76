//! Hugging Face GPT-2 folders (`config.json`, `model.safetensors`, `tokenizer.json`): read as a
//! cinder model, so that every command taking a checkpoint takes one, and written by `export`.
//!
//! With GPT-2's options (learned positions, LayerNorm, no QK-norm or soft-cap) cinder's model is
//! GPT-2's, so the parameters map one to one ([`slots`]). GPT-2's `Conv1D` stores its weight
//! `[in, out]`, which is already the layout of Burn's `Linear`: nothing is transposed (nanoGPT's
//! transpose is for PyTorch's `nn.Linear`). A tied head is `wte` (a `lm_head.weight` in the file
//! is left unread); an untied one (`tie_word_embeddings: false`) is `lm_head.weight`. The
//! attention mask buffers (`attn.bias`, `attn.masked_bias`) are
//! ignored. Names may carry `GPT2LMHeadModel`'s `transformer.` prefix or not; `export` writes it.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use burn::module::Param;
use burn::nn::LayerNorm;
use burn::prelude::*;
use cinder_data::Tokenizer;
use cinder_data::tokenizer::TOKENIZER_JSON;
use cinder_model::{Activation, Gpt, GptConfig, Norm, Position};
use safetensors::{Dtype, SafeTensors};
use serde_json::{Value, json};

use crate::config::TrainConfig;

/// The model's shape and settings.
pub const CONFIG: &str = "config.json";
/// The weights.
pub const WEIGHTS: &str = "model.safetensors";
/// What `AutoTokenizer` reads besides `tokenizer.json`.
pub const TOKENIZER_CONFIG: &str = "tokenizer_config.json";
/// The prefix of `GPT2LMHeadModel`'s parameter names.
const PREFIX: &str = "transformer.";

/// Why a GPT-2 folder could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum Gpt2Error {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{} is missing: a GPT-2 folder holds {CONFIG}, {WEIGHTS} and {TOKENIZER_JSON}",
        .0.display()
    )]
    Missing(PathBuf),
    #[error("{} is damaged: {reason}", path.display())]
    Damaged { path: PathBuf, reason: String },
    #[error("{}: `{field}` is {value}, but cinder supports {allowed}", path.display())]
    Unsupported {
        path: PathBuf,
        field: &'static str,
        value: String,
        allowed: String,
    },
    #[error("{}: tensor `{name}` {problem}", path.display())]
    Tensor {
        path: PathBuf,
        name: String,
        problem: String,
    },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} already holds {name}: export into a new or empty folder", dir.display())]
    Exists { dir: PathBuf, name: String },
}

/// Whether `dir` is a GPT-2 folder (and not a cinder checkpoint).
pub fn is_folder(dir: &Path) -> bool {
    dir.join(CONFIG).is_file() && dir.join(WEIGHTS).is_file()
}

/// A GPT-2 folder's settings as a cinder run configuration: the architecture from
/// `config.json`, the tokenizer from `tokenizer.json`. Fields a GPT-2 config can set but cinder's
/// model cannot follow are refused by name.
pub fn read_config(dir: &Path) -> Result<(TrainConfig, Tokenizer), Gpt2Error> {
    let path = dir.join(CONFIG);
    let text = read_text(&path)?;
    let value: Value = serde_json::from_str(&text).map_err(|e| Gpt2Error::Damaged {
        path: path.clone(),
        reason: format!("not valid JSON ({e})"),
    })?;
    let hf = HfConfig {
        path: &path,
        value: &value,
    };
    let unsupported = |field, value: String, allowed: &str| Gpt2Error::Unsupported {
        path: path.clone(),
        field,
        value,
        allowed: allowed.into(),
    };
    let model_type = hf.string("model_type", "gpt2")?;
    if model_type != "gpt2" {
        return Err(unsupported("model_type", model_type, "\"gpt2\""));
    }
    let activation = match hf.string("activation_function", "gelu_new")?.as_str() {
        "gelu" => Activation::Gelu,
        "gelu_new" | "gelu_pytorch_tanh" => Activation::GeluTanh,
        other => {
            return Err(unsupported(
                "activation_function",
                format!("\"{other}\""),
                "\"gelu\", \"gelu_new\" or \"gelu_pytorch_tanh\"",
            ));
        }
    };
    let n_embd = hf.usize("n_embd", 768)?;
    let n_inner = value.get("n_inner").filter(|v| !v.is_null());
    if let Some(n_inner) = n_inner.filter(|v| v.as_u64() != Some(4 * n_embd as u64)) {
        return Err(unsupported(
            "n_inner",
            n_inner.to_string(),
            &format!("null or 4 * n_embd = {}", 4 * n_embd),
        ));
    }
    for (field, default, want) in [
        ("scale_attn_weights", true, true),
        ("scale_attn_by_inverse_layer_idx", false, false),
        ("add_cross_attention", false, false),
    ] {
        let got = hf.bool(field, default)?;
        if got != want {
            return Err(unsupported(field, got.to_string(), &want.to_string()));
        }
    }
    let tokenizer_path = dir.join(TOKENIZER_JSON);
    if !tokenizer_path.is_file() {
        return Err(Gpt2Error::Missing(tokenizer_path));
    }
    let tokenizer = cinder_data::BpeTokenizer::from_file(&tokenizer_path)
        .map(Tokenizer::Bpe)
        .map_err(|e| Gpt2Error::Damaged {
            path: tokenizer_path.clone(),
            reason: e.to_string(),
        })?;
    let vocab_size = hf.usize("vocab_size", 50257)?;
    if vocab_size < tokenizer.vocab_size() {
        return Err(unsupported(
            "vocab_size",
            vocab_size.to_string(),
            &format!(
                "at least the {} tokens of {TOKENIZER_JSON}",
                tokenizer.vocab_size()
            ),
        ));
    }
    let config = TrainConfig {
        n_layer: hf.usize("n_layer", 12)?,
        n_head: hf.usize("n_head", 12)?,
        n_embd,
        block_size: hf.usize("n_positions", 1024)?,
        bias: true,
        activation,
        layer_norm_epsilon: hf.f64("layer_norm_epsilon", cinder_model::LAYER_NORM_EPSILON)?,
        // GPT-2's architecture, whatever cinder's defaults become; only the head may be untied.
        position: Position::Learned,
        norm: Norm::Layernorm,
        qk_norm: false,
        logit_softcap: 0.0,
        tie_embeddings: hf.bool("tie_word_embeddings", true)?,
        zero_init: false,
        // Dropout is a training setting: a run that starts from these weights sets its own.
        dropout: 0.0,
        tokenizer: tokenizer_path.display().to_string(),
        vocab_size: if vocab_size > tokenizer.vocab_size() {
            vocab_size
        } else {
            0
        },
        ..TrainConfig::default()
    };
    config
        .model(tokenizer.vocab_size())
        .validate()
        .map_err(|e| {
            let field = match e.field {
                "block_size" => "n_positions",
                other => other,
            };
            unsupported(field, e.value, &e.allowed)
        })?;
    Ok((config, tokenizer))
}

/// Reads `config.json`'s fields, with Hugging Face's `GPT2Config` defaults.
struct HfConfig<'a> {
    path: &'a Path,
    value: &'a Value,
}

impl HfConfig<'_> {
    fn get<T>(
        &self,
        field: &'static str,
        default: T,
        read: impl Fn(&Value) -> Option<T>,
        kind: &str,
    ) -> Result<T, Gpt2Error> {
        match self.value.get(field) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => read(v).ok_or_else(|| Gpt2Error::Damaged {
                path: self.path.to_path_buf(),
                reason: format!("`{field}` is {v}, but it must be {kind}"),
            }),
        }
    }
    fn usize(&self, field: &'static str, default: usize) -> Result<usize, Gpt2Error> {
        self.get(
            field,
            default,
            |v| v.as_u64().map(|n| n as usize),
            "a whole number",
        )
    }
    fn f64(&self, field: &'static str, default: f64) -> Result<f64, Gpt2Error> {
        self.get(field, default, Value::as_f64, "a number")
    }
    fn bool(&self, field: &'static str, default: bool) -> Result<bool, Gpt2Error> {
        self.get(field, default, Value::as_bool, "true or false")
    }
    fn string(&self, field: &'static str, default: &str) -> Result<String, Gpt2Error> {
        let read = |v: &Value| v.as_str().map(str::to_string);
        self.get(field, default.to_string(), read, "a string")
    }
}

/// One parameter of the model, as it is stored in a GPT-2 file.
enum Slot<'a> {
    Matrix(&'a mut Param<Tensor<2>>),
    Vector(&'a mut Param<Tensor<1>>),
    /// A bias the model may not have (`bias = false`); GPT-2 files always have it, written as
    /// zeros for such a model.
    Bias(&'a mut Option<Param<Tensor<1>>>, usize),
}

/// Every parameter of `model` with its GPT-2 name (without [`PREFIX`], see [`full_name`]), in
/// GPT-2's order. The one place where the two namings meet. A GPT-2 model has learned positions
/// and LayerNorms (export refuses the others); its head is `wte`, or `lm_head` when untied.
fn slots(model: &mut Gpt) -> Vec<(String, Slot<'_>)> {
    use Slot::*;
    fn ln(norm: &mut Option<LayerNorm>) -> &mut LayerNorm {
        norm.as_mut().expect("a GPT-2 model has LayerNorms")
    }
    let c = model.wte.weight.lazy_shape()[1];
    let wpe = model
        .wpe
        .as_mut()
        .expect("a GPT-2 model has learned positions");
    let mut slots = vec![
        ("wte.weight".to_string(), Matrix(&mut model.wte.weight)),
        ("wpe.weight".to_string(), Matrix(&mut wpe.weight)),
    ];
    for (i, b) in model.blocks.iter_mut().enumerate() {
        let at = |name: &str| format!("h.{i}.{name}");
        let (attn, mlp) = (&mut b.attn, &mut b.mlp);
        let (ln_1, ln_2) = (ln(&mut b.ln_1), ln(&mut b.ln_2));
        slots.extend([
            (at("ln_1.weight"), Vector(&mut ln_1.gamma)),
            (at("ln_1.bias"), Bias(&mut ln_1.beta, c)),
            (at("attn.c_attn.weight"), Matrix(&mut attn.c_attn.weight)),
            (at("attn.c_attn.bias"), Bias(&mut attn.c_attn.bias, 3 * c)),
            (at("attn.c_proj.weight"), Matrix(&mut attn.c_proj.weight)),
            (at("attn.c_proj.bias"), Bias(&mut attn.c_proj.bias, c)),
            (at("ln_2.weight"), Vector(&mut ln_2.gamma)),
            (at("ln_2.bias"), Bias(&mut ln_2.beta, c)),
            (at("mlp.c_fc.weight"), Matrix(&mut mlp.c_fc.weight)),
            (at("mlp.c_fc.bias"), Bias(&mut mlp.c_fc.bias, 4 * c)),
            (at("mlp.c_proj.weight"), Matrix(&mut mlp.c_proj.weight)),
            (at("mlp.c_proj.bias"), Bias(&mut mlp.c_proj.bias, c)),
        ]);
    }
    let ln_f = ln(&mut model.ln_f);
    slots.extend([
        ("ln_f.weight".to_string(), Vector(&mut ln_f.gamma)),
        ("ln_f.bias".to_string(), Bias(&mut ln_f.beta, c)),
    ]);
    if let Some(head) = &mut model.lm_head {
        slots.push((HEAD.to_string(), Matrix(head)));
    }
    slots
}

/// The untied head's name: outside the `transformer.` module in Hugging Face's files.
const HEAD: &str = "lm_head.weight";

/// The name of `name` (a [`slots`] name) in a file whose transformer's names start with
/// `prefix`.
fn full_name(prefix: &str, name: &str) -> String {
    if name == HEAD {
        name.to_string()
    } else {
        format!("{prefix}{name}")
    }
}

/// Whether a tensor of a GPT-2 file that cinder has no parameter for may be left unread: the
/// attention's mask buffers, and a tied head (the same values as `wte`).
fn ignored(name: &str) -> bool {
    name == HEAD || name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias")
}

/// The weights of the GPT-2 folder `dir` in a model of `config` (from [`read_config`], with
/// perhaps another dropout) on `device`. F16, BF16 and F64 tensors are converted to F32.
pub fn load_weights(dir: &Path, config: &GptConfig, device: &Device) -> Result<Gpt, Gpt2Error> {
    let path = dir.join(WEIGHTS);
    let bytes = fs::read(&path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => Gpt2Error::Missing(path.clone()),
        _ => Gpt2Error::Read {
            path: path.clone(),
            source,
        },
    })?;
    let file = SafeTensors::deserialize(&bytes).map_err(|e| Gpt2Error::Damaged {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    let prefix = if file.names().iter().any(|n| n.starts_with(PREFIX)) {
        PREFIX
    } else {
        ""
    };
    let mut model = config.init(device).map_err(|e| Gpt2Error::Damaged {
        path: dir.join(CONFIG),
        reason: e.to_string(),
    })?;
    let tensor_err = |name: &str, problem: String| Gpt2Error::Tensor {
        path: path.clone(),
        name: name.to_string(),
        problem,
    };
    let mut expected = Vec::new();
    for (name, slot) in slots(&mut model) {
        let full = full_name(prefix, &name);
        let view = file
            .tensor(&full)
            .map_err(|_| tensor_err(&full, "is missing".into()))?;
        let want = match &slot {
            Slot::Matrix(p) => p.lazy_shape().to_vec(),
            Slot::Vector(p) => p.lazy_shape().to_vec(),
            Slot::Bias(_, n) => vec![*n],
        };
        if view.shape() != want.as_slice() {
            let problem = format!(
                "has shape {:?}, but {CONFIG} makes it {want:?}",
                view.shape()
            );
            return Err(tensor_err(&full, problem));
        }
        let values = floats(view.dtype(), view.data()).map_err(|p| tensor_err(&full, p))?;
        let data = TensorData::new(values, want);
        match slot {
            Slot::Matrix(p) => *p = Param::from_data(data, device),
            Slot::Vector(p) => *p = Param::from_data(data, device),
            Slot::Bias(p, _) => *p = Some(Param::from_data(data, device)),
        }
        expected.push(full);
    }
    if let Some(extra) = file
        .names()
        .into_iter()
        .find(|n| !expected.iter().any(|e| e == *n) && !ignored(n.trim_start_matches(PREFIX)))
    {
        let problem = "is not a parameter of GPT-2: this is another kind of model".into();
        return Err(tensor_err(extra, problem));
    }
    Ok(model)
}

/// Little-endian `dtype` values as f32.
fn floats(dtype: Dtype, bytes: &[u8]) -> Result<Vec<f32>, String> {
    fn each<const N: usize>(bytes: &[u8], f: impl Fn([u8; N]) -> f32) -> Vec<f32> {
        bytes
            .chunks_exact(N)
            .map(|c| f(c.try_into().expect("chunks of N")))
            .collect()
    }
    Ok(match dtype {
        Dtype::F32 => each(bytes, f32::from_le_bytes),
        Dtype::F16 => each(bytes, |b| half::f16::from_le_bytes(b).to_f32()),
        Dtype::BF16 => each(bytes, |b| half::bf16::from_le_bytes(b).to_f32()),
        Dtype::F64 => each(bytes, |b| f64::from_le_bytes(b) as f32),
        other => {
            return Err(format!(
                "has type {other:?}; cinder reads F32, F16, BF16 and F64"
            ));
        }
    })
}

/// Writes `model` (with `config`'s architecture) and `tokenizer` as a GPT-2 folder in `dir`,
/// which must be new or empty of the four files: `config.json`, `model.safetensors` (F32),
/// `tokenizer.json` and `tokenizer_config.json`. A model without biases gets zero biases.
pub fn export(
    dir: &Path,
    model: &Gpt,
    config: &TrainConfig,
    tokenizer: &Tokenizer,
) -> Result<(), Gpt2Error> {
    let refuse = |field, value: String, allowed: &str| Gpt2Error::Unsupported {
        path: dir.join(CONFIG),
        field,
        value,
        allowed: format!("{allowed} in a GPT-2 folder"),
    };
    let activation = match config.activation {
        Activation::Gelu => "gelu",
        Activation::GeluTanh => "gelu_new",
        Activation::Relu2 => {
            let allowed = "gelu or gelu_tanh (its config.json has no ReLU²)";
            return Err(refuse("activation", "relu2".into(), allowed));
        }
    };
    // What GPT-2's architecture cannot express, by name.
    if config.position != Position::Learned {
        let allowed = "learned (GPT-2 has no rotary embeddings)";
        return Err(refuse("position", config.position.to_string(), allowed));
    }
    if config.norm != Norm::Layernorm {
        let allowed = "layernorm (GPT-2 has no RMSNorm)";
        return Err(refuse("norm", config.norm.to_string(), allowed));
    }
    if config.qk_norm {
        return Err(refuse(
            "qk_norm",
            "true".into(),
            "false (GPT-2 has no QK-norm)",
        ));
    }
    if config.logit_softcap != 0.0 {
        let allowed = "0 (GPT-2's logits are not capped)";
        return Err(refuse(
            "logit_softcap",
            config.logit_softcap.to_string(),
            allowed,
        ));
    }
    for name in [CONFIG, WEIGHTS, TOKENIZER_JSON, TOKENIZER_CONFIG] {
        if dir.join(name).exists() {
            return Err(Gpt2Error::Exists {
                dir: dir.to_path_buf(),
                name: name.into(),
            });
        }
    }
    let write_err = |path: PathBuf| move |source| Gpt2Error::Write { path, source };
    fs::create_dir_all(dir).map_err(write_err(dir.to_path_buf()))?;

    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut model = model.clone();
    for (name, slot) in slots(&mut model) {
        let (shape, values) = match slot {
            Slot::Matrix(p) => (p.val().dims().to_vec(), p.val().into_data()),
            Slot::Vector(p) => (p.val().dims().to_vec(), p.val().into_data()),
            Slot::Bias(Some(p), _) => (p.val().dims().to_vec(), p.val().into_data()),
            Slot::Bias(None, n) => (vec![n], TensorData::new(vec![0.0f32; n], [n])),
        };
        let values = values.convert::<f32>();
        tensors.push((full_name(PREFIX, &name), shape, values.as_bytes().to_vec()));
    }
    let views = tensors
        .iter()
        .map(|(name, shape, bytes)| {
            let view = safetensors::tensor::TensorView::new(Dtype::F32, shape.clone(), bytes)
                .expect("shape and bytes agree");
            (name.clone(), view)
        })
        .collect::<Vec<_>>();
    // Hugging Face's loaders refuse a safetensors file without its framework.
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    let weights = safetensors::serialize(views, Some(metadata)).map_err(|e| Gpt2Error::Write {
        path: dir.join(WEIGHTS),
        source: std::io::Error::other(e.to_string()),
    })?;

    let vocab_size = model.vocab_size();
    let end_of_text = tokenizer.end_of_text();
    let hf_config = json!({
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": vocab_size,
        "n_positions": config.block_size,
        "n_ctx": config.block_size,
        "n_embd": config.n_embd,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_inner": null,
        "activation_function": activation,
        "layer_norm_epsilon": config.layer_norm_epsilon,
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout,
        "initializer_range": 0.02,
        "scale_attn_weights": true,
        "tie_word_embeddings": config.tie_embeddings,
        "use_cache": true,
        "bos_token_id": end_of_text,
        "eos_token_id": end_of_text,
        "torch_dtype": "float32",
    });
    let mut tokenizer_config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": config.block_size,
        "clean_up_tokenization_spaces": false,
    });
    if end_of_text.is_some() {
        for key in ["bos_token", "eos_token"] {
            tokenizer_config[key] = json!(cinder_data::bpe::END_OF_TEXT);
        }
    }
    let tokenizer_json = tokenizer
        .hugging_face_json()
        .map_err(|e| Gpt2Error::Write {
            path: dir.join(TOKENIZER_JSON),
            source: std::io::Error::other(e.to_string()),
        })?;
    let pretty = |v: &Value| serde_json::to_string_pretty(v).expect("JSON serialises") + "\n";
    let files = [
        (CONFIG, pretty(&hf_config).into_bytes()),
        (TOKENIZER_JSON, tokenizer_json.into_bytes()),
        (TOKENIZER_CONFIG, pretty(&tokenizer_config).into_bytes()),
        (WEIGHTS, weights),
    ];
    for (name, bytes) in files {
        let path = dir.join(name);
        fs::write(&path, bytes).map_err(write_err(path))?;
    }
    Ok(())
}

fn read_text(path: &Path) -> Result<String, Gpt2Error> {
    fs::read_to_string(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => Gpt2Error::Missing(path.to_path_buf()),
        _ => Gpt2Error::Read {
            path: path.to_path_buf(),
            source,
        },
    })
}
