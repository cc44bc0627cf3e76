//! Hugging Face folders (`config.json`, `model.safetensors`, `tokenizer.json`): read as a cinder
//! model, so that every command taking a checkpoint takes one, and written by `export`.
//!
//! Two of `transformers`' architectures compute cinder's models exactly, each for one family of
//! options: GPT-2 ([`gpt2`]: learned positions, LayerNorm, nanoGPT's recipe) and NanoChat
//! ([`nanochat`]: RoPE, RMSNorm without gains, QK-norm, ReLU², no biases; the default recipe).
//! `config.json`'s `model_type` says which one a folder holds. What the two share is here: the
//! files, the errors, choosing an architecture, and reading and writing a folder; the config
//! reader is [`fields`] and the weights file [`weights`]. Each architecture's module holds its
//! `config.json` mapping, what it refuses, and its one map of names to parameters.

use std::fs;
use std::path::{Path, PathBuf};

use burn::prelude::*;
use cinder_data::Tokenizer;
use cinder_data::tokenizer::TOKENIZER_JSON;
use cinder_model::{Gpt, GptConfig};
use serde_json::{Value, json};

use crate::config::TrainConfig;

mod error;
mod fields;
mod files;
pub mod gpt2;
pub mod nanochat;
mod weights;

pub use error::{HfError, Refusal};
use fields::Fields;
pub use files::{CONFIG, GENERATION_CONFIG, TOKENIZER_CONFIG, WEIGHTS};

cinder_model::named! {
    /// A Hugging Face architecture that cinder reads and writes: its `model_type`.
    pub enum Architecture ("an architecture") {
        /// `GPT2LMHeadModel`.
        #[default]
        Gpt2 = "gpt2",
        /// `NanoChatForCausalLM`.
        NanoChat = "nanochat",
    }
}

impl Architecture {
    /// What this architecture cannot express of `config`, by field; empty when the model fits.
    pub fn refusals(self, config: &TrainConfig) -> Vec<Refusal> {
        match self {
            Architecture::Gpt2 => gpt2::refusals(config),
            Architecture::NanoChat => nanochat::refusals(config),
        }
    }

    /// Hugging Face's class for it.
    pub fn class(self) -> &'static str {
        match self {
            Architecture::Gpt2 => "GPT2LMHeadModel",
            Architecture::NanoChat => "NanoChatForCausalLM",
        }
    }

    /// The architecture `export` writes for `config` when none is asked for: the first that
    /// fits.
    pub fn fitting(config: &TrainConfig) -> Result<Architecture, HfError> {
        if let Some(&fits) = Self::ALL.iter().find(|a| a.refusals(config).is_empty()) {
            return Ok(fits);
        }
        let why: String = Self::ALL
            .iter()
            .map(|a| format!("  {}\n", a.needs(config)))
            .collect();
        Err(HfError::NoArchitecture(why))
    }

    /// What `config` would need to change to be written as this architecture: "GPT2LMHeadModel
    /// (gpt2) needs position = learned, not rope; ...", every field it refuses.
    fn needs(&self, config: &TrainConfig) -> String {
        let fields: Vec<String> = self
            .refusals(config)
            .iter()
            .map(|r| format!("{} = {}, not {}", r.field, r.allowed, r.value))
            .collect();
        format!(
            "{} ({}) needs {}",
            self.class(),
            self.name(),
            fields.join("; ")
        )
    }
}

/// Whether `dir` is a Hugging Face folder (and not a cinder checkpoint): it has a
/// `config.json`. Its other files are checked as they are read, each missing one by name.
pub fn is_folder(dir: &Path) -> bool {
    dir.join(CONFIG).is_file()
}

/// The folder's architecture, from its `config.json`'s `model_type`.
pub fn architecture(dir: &Path) -> Result<Architecture, HfError> {
    let fields = Fields::read(&dir.join(CONFIG))?;
    architecture_of(&fields)
}

fn architecture_of(fields: &Fields) -> Result<Architecture, HfError> {
    // GPT-2's own early files have no `model_type`.
    let model_type = fields.string("model_type", Architecture::Gpt2.name())?;
    model_type.parse().map_err(|_| {
        let names: Vec<String> = Architecture::ALL
            .iter()
            .map(|a| format!("\"{a}\""))
            .collect();
        fields.unsupported(
            "model_type",
            format!("\"{model_type}\""),
            &format!("one of {}", names.join(", ")),
        )
    })
}

/// A Hugging Face folder's settings as a cinder run configuration: the architecture from
/// `config.json`, the tokenizer from `tokenizer.json`. Fields that cinder's model cannot follow
/// are refused by name, and a missing field takes the architecture's own default.
pub fn read_config(dir: &Path) -> Result<(TrainConfig, Tokenizer), HfError> {
    let fields = Fields::read(&dir.join(CONFIG))?;
    let architecture = architecture_of(&fields)?;
    let tokenizer_path = dir.join(TOKENIZER_JSON);
    if !tokenizer_path.is_file() {
        return Err(HfError::Missing(tokenizer_path));
    }
    let tokenizer = cinder_data::BpeTokenizer::from_file(&tokenizer_path)
        .map(Tokenizer::Bpe)
        .map_err(|e| HfError::Damaged {
            path: tokenizer_path.clone(),
            reason: e.to_string(),
        })?;
    let mut config = match architecture {
        Architecture::Gpt2 => gpt2::config(&fields)?,
        Architecture::NanoChat => nanochat::config(&fields)?,
    };
    let (field, vocab_size) = config_vocab(architecture, &fields)?;
    if vocab_size < tokenizer.vocab_size() {
        let allowed = format!(
            "at least the {} tokens of {TOKENIZER_JSON}",
            tokenizer.vocab_size()
        );
        return Err(fields.unsupported(field, vocab_size.to_string(), &allowed));
    }
    config.tokenizer = tokenizer_path.display().to_string();
    config.vocab_size = if vocab_size > tokenizer.vocab_size() {
        vocab_size
    } else {
        0
    };
    // Dropout is a training setting: a run that starts from these weights sets its own.
    config.dropout = 0.0;
    config.zero_init = false;
    config
        .model(tokenizer.vocab_size())
        .validate()
        .map_err(|e| {
            let field = match architecture {
                Architecture::Gpt2 => gpt2::hf_field(e.field),
                Architecture::NanoChat => nanochat::hf_field(e.field),
            };
            fields.unsupported(field, e.value, &e.allowed)
        })?;
    Ok((config, tokenizer))
}

/// The vocabulary size `config.json` states (with the architecture's default), and its name.
fn config_vocab(
    architecture: Architecture,
    fields: &Fields,
) -> Result<(&'static str, usize), HfError> {
    let default = match architecture {
        Architecture::Gpt2 => 50257,
        Architecture::NanoChat => 50304,
    };
    Ok(("vocab_size", fields.usize("vocab_size", default)?))
}

/// The weights of the Hugging Face folder `dir` in a model of `config` (from [`read_config`],
/// with perhaps another dropout) on `device`. F16, BF16 and F64 tensors are converted to F32.
pub fn load_weights(dir: &Path, config: &GptConfig, device: &Device) -> Result<Gpt, HfError> {
    let architecture = architecture(dir)?;
    let mut model = config.init(device).map_err(|e| HfError::Damaged {
        path: dir.join(CONFIG),
        reason: e.to_string(),
    })?;
    let path = dir.join(WEIGHTS);
    let shards = dir.join(format!("{WEIGHTS}.index.json"));
    if !path.exists() && shards.exists() {
        return Err(HfError::Unsupported {
            path: shards,
            field: "weight_map",
            value: "weights in shards".into(),
            allowed: format!(
                "one {WEIGHTS} (transformers writes one with max_shard_size=\"100GB\")"
            ),
        });
    }
    let bytes = weights::read(&path)?;
    match architecture {
        Architecture::Gpt2 => {
            let file = weights::Reader::new(&bytes, &path, gpt2::PREFIX)?;
            gpt2::load(&mut model, &file, device)?
        }
        Architecture::NanoChat => {
            let file = weights::Reader::new(&bytes, &path, nanochat::PREFIX)?;
            nanochat::load(&mut model, &file, device)?
        }
    }
    Ok(model)
}

/// Writes `model` (with `config`'s architecture) and `tokenizer` as a Hugging Face folder in
/// `dir` of `architecture`, or of the one that fits the model when `None`: `config.json`,
/// `model.safetensors` (F32), `tokenizer.json`, `tokenizer_config.json` and
/// `generation_config.json`. `dir` must be new or hold none of them; nothing is written when the
/// model does not fit. Returns the architecture written.
pub fn export(
    dir: &Path,
    model: &Gpt,
    config: &TrainConfig,
    tokenizer: &Tokenizer,
    architecture: Option<Architecture>,
) -> Result<Architecture, HfError> {
    let architecture = match architecture {
        Some(a) => {
            if !a.refusals(config).is_empty() {
                return Err(HfError::NotThis(a.needs(config)));
            }
            a
        }
        None => Architecture::fitting(config)?,
    };
    let names = [
        CONFIG,
        WEIGHTS,
        TOKENIZER_JSON,
        TOKENIZER_CONFIG,
        GENERATION_CONFIG,
    ];
    for name in names {
        if dir.join(name).exists() {
            return Err(HfError::Exists {
                dir: dir.to_path_buf(),
                name: name.into(),
            });
        }
    }
    let end_of_text = tokenizer.end_of_text();
    let (tensors, mut hf_config) = match architecture {
        Architecture::Gpt2 => (gpt2::tensors(model), gpt2::config_json(config)),
        Architecture::NanoChat => (nanochat::tensors(model), nanochat::config_json(config)),
    };
    let special = json!({
        "bos_token_id": end_of_text,
        "eos_token_id": end_of_text,
        // NanoChat's default pad token (1) is a character of a character vocabulary, and
        // PyTorch's embedding would not train its row.
        "pad_token_id": null,
    });
    for (key, value) in special.as_object().expect("an object") {
        hf_config[key] = value.clone();
    }
    hf_config["architectures"] = json!([architecture.class()]);
    hf_config["model_type"] = json!(architecture.name());
    hf_config["vocab_size"] = json!(model.vocab_size());
    hf_config["tie_word_embeddings"] = json!(config.tie_embeddings);
    hf_config["dtype"] = json!("float32");
    let mut generation_config = special;
    generation_config["transformers_version"] = json!("5.0.0");
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
    let weights = weights::serialize(tensors).map_err(|e| HfError::Write {
        path: dir.join(WEIGHTS),
        source: std::io::Error::other(e),
    })?;
    let tokenizer_json = tokenizer.hugging_face_json().map_err(|e| HfError::Write {
        path: dir.join(TOKENIZER_JSON),
        source: std::io::Error::other(e.to_string()),
    })?;
    let pretty = |v: &Value| serde_json::to_string_pretty(v).expect("JSON serialises") + "\n";
    let files = [
        (CONFIG, pretty(&hf_config).into_bytes()),
        (TOKENIZER_JSON, tokenizer_json.into_bytes()),
        (TOKENIZER_CONFIG, pretty(&tokenizer_config).into_bytes()),
        (GENERATION_CONFIG, pretty(&generation_config).into_bytes()),
        (WEIGHTS, weights),
    ];
    let write_err = |path: PathBuf| move |source| HfError::Write { path, source };
    fs::create_dir_all(dir).map_err(write_err(dir.to_path_buf()))?;
    for (name, bytes) in files {
        let path = dir.join(name);
        fs::write(&path, bytes).map_err(write_err(path))?;
    }
    Ok(architecture)
}
