//! The run configuration: what `configs/*.toml` hold, with built-in defaults (nanoGPT's CPU
//! recipe, which a field left out of a config file or an older checkpoint means) and checks that
//! name the field and its allowed range.

use std::path::{Path, PathBuf};

use cinder_model::{Activation, GptConfig, Norm, Position};
use serde::{Deserialize, Serialize};

mod validate;

/// A configuration file that could not be used, or a value out of range.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {}: {message}", path.display())]
    Parse { path: PathBuf, message: String },
    #[error("invalid configuration: `{field}` is {value}, but it must be {allowed}")]
    OutOfRange {
        field: &'static str,
        value: String,
        allowed: &'static str,
    },
    #[error(transparent)]
    Model(#[from] cinder_model::ConfigError),
}

/// Declares [`TrainConfig`] and the flags that override it ([`Overrides`]) from one list: each
/// field once, with its type and the line that documents it and that `--help` shows beside its
/// built-in default. (`init_from` is the one field without a flag of this kind: `--init-from`.)
macro_rules! run_config {
    ($($field:ident: $ty:ty, $help:literal;)*) => {
        /// Everything a training run needs besides its data. Field names follow nanoGPT.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct TrainConfig {
            $( #[doc = $help] pub $field: $ty, )*
            /// A checkpoint (or run folder) whose weights a new run starts from: fine-tuning. The
            /// architecture and vocabulary are then the checkpoint's ([`architecture`]).
            #[serde(skip_serializing_if = "Option::is_none")]
            pub init_from: Option<PathBuf>,
        }

        /// One optional flag per config field, named like nanoGPT's keys in kebab case.
        /// A flag given wins over the config file, which wins over the built-in default.
        #[derive(Debug, Default, Clone, clap::Args)]
        #[command(next_help_heading = "Config overrides (flag > config file > built-in default: nanoGPT's recipe)")]
        pub struct Overrides {
            $(
                #[arg(
                    long,
                    value_name = stringify!($ty),
                    help = with_default($help, &TrainConfig::default().$field),
                )]
                pub $field: Option<$ty>,
            )*
        }

        /// Every field with a flag, and its built-in default as its help shows it.
        pub fn flag_defaults() -> Vec<(&'static str, String)> {
            let d = TrainConfig::default();
            vec![$((stringify!($field), d.$field.to_string()),)*]
        }

        impl Overrides {
            /// Sets every field given on the command line; returns what was set.
            pub fn apply(&self, c: &mut TrainConfig) -> Vec<Change> {
                let mut changes = Vec::new();
                $(
                    if let Some(v) = &self.$field {
                        c.$field = v.clone();
                        changes.push(Change { field: stringify!($field), value: v.to_string() });
                    }
                )*
                changes
            }
        }
    };
}

run_config! {
    // Model: the fields of [`GptConfig`] but `vocab_size`, whose defaults are its.
    n_layer: usize, "Transformer blocks";
    n_head: usize, "Attention heads per block; must divide n_embd";
    n_embd: usize, "Width of the residual stream (embedding size)";
    block_size: usize, "Context length in tokens";
    dropout: f64, "Dropout probability while training, in [0, 1)";
    bias: bool, "Biases in linear layers and LayerNorms";
    activation: Activation, "The MLP's activation: gelu, gelu_tanh (GPT-2's weights') or relu2 (max(0, x)²)";
    layer_norm_epsilon: f64, "The epsilon of every LayerNorm or RMSNorm";
    position: Position, "Positions: learned (an embedding per position) or rope (rotary embeddings on queries and keys)";
    norm: Norm, "layernorm, or rmsnorm (no gain; also after the embedding)";
    qk_norm: bool, "RMS-normalise each head's queries and keys";
    logit_softcap: f64, "Soft-cap the logits at this (c·tanh(logits/c)); 0 disables";
    tie_embeddings: bool, "The head is the token embedding (false: a matrix of its own)";
    zero_init: bool, "Residual output projections and an untied head start at zero";
    // Optimisation.
    batch_size: usize, "Windows per micro-batch";
    max_iters: u64, "Optimiser steps in total";
    learning_rate: f64, "Peak learning rate (with muon: of the gains and biases)";
    min_lr: f64, "Learning rate at the end of the decay (each group falls to min_lr / learning_rate of its own peak)";
    warmup_iters: u64, "Linear warm-up steps";
    lr_decay_iters: u64, "Step at which the decay reaches min_lr";
    weight_decay: f64, "Decoupled weight decay on matrices (AdamW's; with muon, Muon's, and AdamW's parameters get none)";
    beta1: f64, "AdamW beta1 (with muon, AdamW uses 0.8)";
    beta2: f64, "AdamW beta2 (with muon, AdamW uses 0.95)";
    grad_clip: f64, "Clip the global gradient norm to this; 0 disables";
    gradient_accumulation_steps: usize, "Micro-batches per optimiser step";
    lr_schedule: LrSchedule, "After the warm-up: cosine decay, or trapezoid (the peak held, then a linear cool-down)";
    cooldown_fraction: f64, "With trapezoid: the last fraction of lr_decay_iters spent cooling down to min_lr";
    optimizer: OptimizerKind, "adamw, or muon (Muon on the blocks' matrices, AdamW on the rest)";
    muon_lr: f64, "Muon's peak learning rate";
    muon_momentum: f64, "Muon's momentum";
    embedding_lr: f64, "With muon: the embeddings' (and a tied head's) peak learning rate";
    head_lr: f64, "With muon and an untied head: the head's peak learning rate";
    // Evaluation, logging, checkpoints.
    eval_interval: u64, "Evaluate every this many steps (and at the end)";
    eval_iters: usize, "Batches averaged per evaluation";
    log_interval: u64, "Log the training loss every this many steps";
    checkpoint_interval: u64, "Write latest/ every this many steps";
    sample_tokens: usize, "Tokens sampled into samples.jsonl at each evaluation (generate's default prompt, temperature and top-k, the run's seed); 0 disables";
    // Data.
    train_fraction: f64, "Leading fraction of the text used for training";
    seed: u64, "Seed of the weights, batches and dropout";
    tokenizer: String, "char, bpe (trained on the training text), or the path of a Hugging Face tokenizer.json";
    vocab_size: usize, "Tokens of the BPE that --tokenizer bpe trains (0: its default size), or the model's vocabulary padded beyond a tokenizer.json's (0: the file's)";
}

/// A config field set from the command line: its name and new value, as text.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub field: &'static str,
    pub value: String,
}

/// `help`, and the built-in default `value` of its field.
fn with_default(help: &str, value: &impl std::fmt::Display) -> String {
    format!("{help} [default: {value}]")
}

/// The fields that make the model's shape and its vocabulary: a checkpoint's weights fit only a
/// model with the same values of all of them (and the same tokenizer). They are read off the
/// model's own configuration ([`GptConfig`]: every field but `dropout`, which holds no weights),
/// so a new model option joins them by being a field of both configurations.
pub fn architecture() -> Vec<String> {
    let mut fields: Vec<String> = model_fields()
        .into_iter()
        .filter(|f| f != "dropout" && f != "vocab_size")
        .collect();
    fields.extend(["tokenizer", "vocab_size"].map(String::from));
    fields
}

/// The names of [`GptConfig`]'s fields, which a [`TrainConfig`] has too.
fn model_fields() -> Vec<String> {
    toml::Table::try_from(GptConfig::new(1, 1))
        .expect("a model config serialises")
        .keys()
        .cloned()
        .collect()
}

/// How the learning rate moves after the linear warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum LrSchedule {
    /// Cosine decay from the peak to `min_lr` at `lr_decay_iters` (nanoGPT's).
    Cosine,
    /// The peak held, then a linear cool-down to `min_lr` over the last `cooldown_fraction` of
    /// `lr_decay_iters` (warmup-stable-decay, as the nanoGPT speedrun uses).
    Trapezoid,
}

/// Which optimizer trains the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum OptimizerKind {
    /// AdamW on every parameter, weight decay on matrices (nanoGPT's).
    Adamw,
    /// Muon on the matrices inside the blocks (`muon_lr`, `muon_momentum`, `weight_decay`);
    /// AdamW with betas (0.8, 0.95) and no weight decay on the rest: the embeddings (and so the
    /// tied head) at `embedding_lr`, gains and biases at `learning_rate`.
    Muon,
}

/// The value as config files spell it (`trapezoid`, `muon`).
fn config_name<T: Serialize>(value: &T) -> String {
    let v = toml::Value::try_from(value).expect("a config value serialises");
    v.as_str().expect("a config enum is a string").to_string()
}

impl std::fmt::Display for LrSchedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&config_name(self))
    }
}

impl std::fmt::Display for OptimizerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&config_name(self))
    }
}

/// Tokens of a BPE trained with `tokenizer = "bpe"` and no `vocab_size`.
pub const DEFAULT_BPE_VOCAB: usize = 2048;

/// `configs/tiny_cpu.toml`, the default run's recipe, as built into the program (`train` uses it
/// when the file is not there).
const DEFAULT_RUN: &str = include_str!("../../../../configs/tiny_cpu.toml");

impl Default for TrainConfig {
    /// nanoGPT's CPU recipe (`configs/nanogpt_cpu.toml`): the model's own defaults
    /// ([`GptConfig`], GPT-2's architecture) with a context of 64, and AdamW with a cosine
    /// schedule. A field that a config file or a checkpoint leaves out takes its value here: the
    /// behaviour from before the field existed. The default run is [`TrainConfig::default_run`].
    fn default() -> Self {
        let model = GptConfig::new(0, 64);
        Self {
            n_layer: model.n_layer,
            n_head: model.n_head,
            n_embd: model.n_embd,
            block_size: model.block_size,
            dropout: model.dropout,
            bias: model.bias,
            activation: model.activation,
            layer_norm_epsilon: model.layer_norm_epsilon,
            position: model.position,
            norm: model.norm,
            qk_norm: model.qk_norm,
            logit_softcap: model.logit_softcap,
            tie_embeddings: model.tie_embeddings,
            zero_init: model.zero_init,
            batch_size: 12,
            max_iters: 2000,
            learning_rate: 1e-3,
            min_lr: 1e-4,
            warmup_iters: 100,
            lr_decay_iters: 2000,
            weight_decay: 0.1,
            beta1: 0.9,
            beta2: 0.99,
            grad_clip: 1.0,
            gradient_accumulation_steps: 1,
            lr_schedule: LrSchedule::Cosine,
            cooldown_fraction: 0.5,
            optimizer: OptimizerKind::Adamw,
            muon_lr: 0.02,
            muon_momentum: 0.95,
            embedding_lr: 0.01,
            head_lr: 0.004,
            eval_interval: 250,
            eval_iters: 200,
            log_interval: 10,
            checkpoint_interval: 250,
            sample_tokens: 200,
            train_fraction: 0.9,
            seed: 1337,
            tokenizer: "char".into(),
            vocab_size: 0,
            init_from: None,
        }
    }
}

impl TrainConfig {
    /// The default run's recipe, `configs/tiny_cpu.toml`, as built into the program.
    pub fn default_run() -> Self {
        Self::parse(DEFAULT_RUN).expect("configs/tiny_cpu.toml parses (a test checks it)")
    }

    /// Reads a TOML file; fields it leaves out take the built-in defaults.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text).map_err(|message| ConfigError::Parse {
            path: path.to_path_buf(),
            message,
        })
    }

    /// Parses TOML text; the error says the line, column and key.
    pub fn parse(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| {
            let Some(span) = e.span() else {
                return e.message().to_string();
            };
            let line_no = text[..span.start].matches('\n').count() + 1;
            let line = text.lines().nth(line_no - 1).unwrap_or("").trim();
            format!("line {line_no} (`{line}`): {}", e.message())
        })
    }

    /// The configuration as TOML, as saved beside a run.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a config always serialises")
    }

    /// Whether `tokenizer` names a tokenizer.json (not `char` or `bpe`).
    pub fn tokenizer_is_file(&self) -> bool {
        !matches!(self.tokenizer.as_str(), "char" | "bpe")
    }

    /// The model architecture for a tokenizer of `tokens` tokens: a vocabulary of as many, or of
    /// `vocab_size` when it pads a tokenizer.json's. Every other field of [`GptConfig`] is this
    /// configuration's field of the same name.
    pub fn model(&self, tokens: usize) -> GptConfig {
        let vocab_size = if self.tokenizer_is_file() {
            tokens.max(self.vocab_size)
        } else {
            tokens
        };
        let mine = self.to_table();
        let mut table: toml::Table = model_fields()
            .into_iter()
            .filter_map(|f| Some((f.clone(), mine.get(&f)?.clone())))
            .collect();
        table.insert("vocab_size".into(), toml::Value::Integer(vocab_size as i64));
        table
            .try_into()
            .expect("every field of the model's configuration is a field of the run's")
    }

    /// This configuration with the [`architecture`] fields of `other`.
    pub fn with_architecture_of(&self, other: &TrainConfig) -> TrainConfig {
        let mut table = self.to_table();
        let theirs = other.to_table();
        for field in architecture() {
            match theirs.get(&field) {
                Some(v) => table.insert(field, v.clone()),
                None => table.remove(&field),
            };
        }
        table.try_into().expect("a config's fields round-trip")
    }

    /// The configuration as a TOML table, field by field.
    pub fn to_table(&self) -> toml::Table {
        toml::Table::try_from(self).expect("a config always serialises")
    }

    /// Tokens the model reads per optimiser step.
    pub fn tokens_per_iter(&self) -> usize {
        self.batch_size * self.block_size * self.gradient_accumulation_steps
    }
}

#[cfg(test)]
mod tests;
