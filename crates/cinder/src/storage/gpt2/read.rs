//! Reading a GPT-2 folder: its `config.json` as a run configuration, its weights into a model.

use std::fs;
use std::path::Path;

use burn::prelude::*;
use cinder_data::Tokenizer;
use cinder_data::tokenizer::TOKENIZER_JSON;
use cinder_model::{Activation, Gpt, GptConfig, Norm, Position};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use super::*;
use crate::config::TrainConfig;

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

fn read_text(path: &Path) -> Result<String, Gpt2Error> {
    fs::read_to_string(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => Gpt2Error::Missing(path.to_path_buf()),
        _ => Gpt2Error::Read {
            path: path.to_path_buf(),
            source,
        },
    })
}
