//! Writing a model as a GPT-2 folder (`export`).

use std::collections::HashMap;
use std::fs;
use std::path::Path;

use burn::prelude::*;
use cinder_data::Tokenizer;
use cinder_data::tokenizer::TOKENIZER_JSON;
use cinder_model::{Activation, Gpt, Norm, Position};
use safetensors::Dtype;
use serde_json::{Value, json};

use super::*;
use crate::config::TrainConfig;

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
