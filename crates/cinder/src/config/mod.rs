//! The run configuration: what `configs/*.toml` hold, with built-in defaults (nanoGPT's CPU
//! recipe, which a field left out of a config file or an older checkpoint means) and checks that
//! name the field and its allowed range.

use std::path::{Path, PathBuf};

use cinder_data::tokenizer;
use cinder_model::{Activation, GptConfig, Norm, Position, named};
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

/// Declares [`TrainConfig`] and the flags that override it ([`Overrides`]): the model's fields,
/// as `cinder_model::model_fields!` declares them (their defaults are [`GptConfig`]'s), then the
/// run's own from the list below, each field once with its type, its built-in default and the
/// line that documents it and that `--help` shows beside that default. (`init_from` is the one
/// field without a flag of this kind: `--init-from`.)
macro_rules! run_config {
    (
        run { $($field:ident: $ty:ty = $default:expr, $help:literal;)* }
        model { $($mfield:ident: $mty:ty $(= $mdefault:tt)?, $mhelp:literal;)* }
    ) => {
        /// Everything a training run needs besides its data. Field names follow nanoGPT.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct TrainConfig {
            $( #[doc = $mhelp] pub $mfield: $mty, )*
            $( #[doc = $help] pub $field: $ty, )*
            /// A checkpoint (or run folder) whose weights a new run starts from: fine-tuning. The
            /// architecture and vocabulary are then the checkpoint's ([`architecture`]).
            #[serde(skip_serializing_if = "Option::is_none")]
            pub init_from: Option<PathBuf>,
        }

        impl Default for TrainConfig {
            /// nanoGPT's CPU recipe (`configs/nanogpt_cpu.toml`): the model's own defaults
            /// ([`GptConfig`], GPT-2's architecture) with a context of [`DEFAULT_BLOCK_SIZE`],
            /// and AdamW with a cosine schedule. A field that a config file or a checkpoint
            /// leaves out takes its value here: the behaviour from before the field existed.
            /// The default run is [`TrainConfig::default_run`].
            fn default() -> Self {
                let model = GptConfig::new(0, DEFAULT_BLOCK_SIZE);
                Self {
                    $( $mfield: model.$mfield, )*
                    $( $field: $default, )*
                    init_from: None,
                }
            }
        }

        /// The fields of the model's configuration ([`GptConfig`]) that a [`TrainConfig`] has:
        /// all but `vocab_size`.
        pub const MODEL_FIELDS: &[&str] = &[$(stringify!($mfield)),*];

        impl TrainConfig {
            /// The model of this configuration with a vocabulary of `vocab_size` tokens.
            fn model_of(&self, vocab_size: usize) -> GptConfig {
                GptConfig {
                    vocab_size,
                    $( $mfield: self.$mfield.clone(), )*
                }
            }
        }

        /// One optional flag per config field, named like nanoGPT's keys in kebab case.
        /// A flag given wins over the config file, which wins over the built-in default.
        #[derive(Debug, Default, Clone, clap::Args)]
        #[command(next_help_heading = "Config overrides (flag > config file > built-in default: nanoGPT's recipe)")]
        pub struct Overrides {
            $(
                #[arg(
                    long,
                    value_name = stringify!($mty),
                    help = with_default($mhelp, &TrainConfig::default().$mfield),
                )]
                pub $mfield: Option<$mty>,
            )*
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
            vec![
                $((stringify!($mfield), d.$mfield.to_string()),)*
                $((stringify!($field), d.$field.to_string()),)*
            ]
        }

        impl Overrides {
            /// Sets every field given on the command line; returns what was set.
            pub fn apply(&self, c: &mut TrainConfig) -> Vec<Change> {
                let mut changes = Vec::new();
                $(
                    if let Some(v) = &self.$mfield {
                        c.$mfield = v.clone();
                        changes.push(Change { field: stringify!($mfield), value: v.to_string() });
                    }
                )*
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

cinder_model::model_fields!(run_config! { run {
    // Optimisation.
    batch_size: usize = 12, "Windows per micro-batch";
    max_iters: u64 = 2000, "Optimiser steps in total";
    learning_rate: f64 = 1e-3, "Peak learning rate (with muon: of the gains and biases)";
    min_lr: f64 = 1e-4, "Learning rate at the end of the decay (each group falls to min_lr / learning_rate of its own peak)";
    warmup_iters: u64 = 100, "Linear warm-up steps";
    lr_decay_iters: u64 = 2000, "Step at which the decay reaches min_lr";
    weight_decay: f64 = 0.1, "Decoupled weight decay on matrices (AdamW's; with muon, Muon's, and AdamW's parameters get none)";
    beta1: f64 = 0.9, "AdamW beta1 (with muon, AdamW uses 0.8)";
    beta2: f64 = 0.99, "AdamW beta2 (with muon, AdamW uses 0.95)";
    grad_clip: f64 = 1.0, "Clip the global gradient norm to this; 0 disables";
    gradient_accumulation_steps: usize = 1, "Micro-batches per optimiser step";
    lr_schedule: LrSchedule = LrSchedule::Cosine, "After the warm-up: cosine decay, or trapezoid (the peak held, then a linear cool-down)";
    cooldown_fraction: f64 = 0.5, "With trapezoid: the last fraction of lr_decay_iters spent cooling down to min_lr";
    optimizer: OptimizerKind = OptimizerKind::Adamw, "adamw, or muon (Muon on the blocks' matrices, AdamW on the rest)";
    muon_lr: f64 = 0.02, "Muon's peak learning rate";
    muon_momentum: f64 = 0.95, "Muon's momentum";
    muon_beta2: f64 = 0.0, "NorMuon: each of Muon's updates divided, neuron by neuron, by the root of a running mean of its squares with this decay, the matrix's norm kept (the speedrun's 0.9); 0: plain Muon";
    embedding_lr: f64 = 0.01, "With muon: the embeddings' (and a tied head's) peak learning rate";
    head_lr: f64 = 0.004, "With muon and an untied head: the head's peak learning rate";
    // Evaluation, logging, checkpoints.
    eval_interval: u64 = 250, "Evaluate every this many steps (and at the end)";
    eval_iters: usize = 200, "Batches averaged per evaluation";
    log_interval: u64 = 10, "Log the training loss every this many steps";
    checkpoint_interval: u64 = 250, "Write latest/ every this many steps";
    sample_tokens: usize = 200, "Tokens sampled into samples.jsonl at each evaluation (generate's default prompt, temperature and top-k, the run's seed); 0 disables";
    early_stop: u64 = 0, "Stop after this many evaluations in a row without a new best validation loss (best/ keeps the best weights); 0 never stops early";
    // The time a new run may take (`train --time`).
    time_budget: TimeBudget = TimeBudget::OFF, "Wall time for the whole run, from start to exit (90s, 10m, 1h): the shape and schedule are then chosen to fit it, on this text and this machine; off: the config's own";
    // Data.
    train_fraction: f64 = 0.9, "Leading fraction of the text used for training";
    seed: u64 = 1337, "Seed of the weights, batches and dropout";
    tokenizer: String = tokenizer::CHAR.into(), "char, bpe (trained on the training text), or the path of a Hugging Face tokenizer.json";
    vocab_size: usize = 0, "Tokens of the BPE that --tokenizer bpe trains (0: its default size), or the model's vocabulary padded beyond a tokenizer.json's (0: the file's)";
}});

/// How long a new run may take, start to exit (`train --time 10m`), or no limit (`off`). A run
/// with a budget has its shape and schedule chosen for it once, when it starts
/// ([`crate::run::plan`]); written into the run's config, they fix its iterations, so a resumed
/// run goes on exactly as it would have.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TimeBudget(pub Option<std::time::Duration>);

impl TimeBudget {
    /// No budget: the config's own shape and schedule.
    pub const OFF: TimeBudget = TimeBudget(None);

    /// The budget in seconds, if there is one.
    pub fn seconds(&self) -> Option<f64> {
        self.0.map(|d| d.as_secs_f64())
    }
}

impl std::fmt::Display for TimeBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            None => f.write_str("off"),
            Some(d) => write!(f, "{}", humantime::format_duration(d)),
        }
    }
}

impl std::str::FromStr for TimeBudget {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s == "off" || s == "0" {
            return Ok(Self::OFF);
        }
        let d = humantime::parse_duration(s).map_err(|e| {
            format!("`{s}` is not a duration ({e}): write it as 90s, 10m, 1h or 1h 30m, or off")
        })?;
        if d.is_zero() {
            return Err(format!(
                "`{s}` is no time: give a budget such as 90s or 10m, or off"
            ));
        }
        Ok(Self(Some(d)))
    }
}

impl Serialize for TimeBudget {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TimeBudget {
    /// `"10m"`, `"off"`, or a number of seconds.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Text(String),
            Seconds(u64),
        }
        match Written::deserialize(d)? {
            Written::Text(text) => text.parse().map_err(serde::de::Error::custom),
            Written::Seconds(s) => Ok(Self((s > 0).then(|| std::time::Duration::from_secs(s)))),
        }
    }
}

/// The context of nanoGPT's CPU recipe, the built-in default (a model has none of its own).
pub const DEFAULT_BLOCK_SIZE: usize = 64;

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
/// model with the same values of all of them (and the same tokenizer). They are the model's own
/// fields ([`MODEL_FIELDS`]) but `dropout`, which holds no weights, so a new model option joins
/// them by being declared.
pub fn architecture() -> Vec<String> {
    MODEL_FIELDS
        .iter()
        .filter(|&&f| f != "dropout")
        .chain(&["tokenizer", "vocab_size"])
        .map(|f| f.to_string())
        .collect()
}

named! {
    /// How the learning rate moves after the linear warm-up.
    pub enum LrSchedule ("a learning-rate schedule") {
        /// Cosine decay from the peak to `min_lr` at `lr_decay_iters` (nanoGPT's).
        #[default]
        Cosine = "cosine",
        /// The peak held, then a linear cool-down to `min_lr` over the last `cooldown_fraction`
        /// of `lr_decay_iters` (warmup-stable-decay, as the nanoGPT speedrun uses).
        Trapezoid = "trapezoid",
    }
}

named! {
    /// Which optimizer trains the model.
    pub enum OptimizerKind ("an optimizer") {
        /// AdamW on every parameter, weight decay on matrices (nanoGPT's).
        #[default]
        Adamw = "adamw",
        /// Muon on the matrices inside the blocks (`muon_lr`, `muon_momentum`, `weight_decay`);
        /// AdamW with betas (0.8, 0.95) and no weight decay on the rest: the embeddings (and so
        /// the tied head) at `embedding_lr`, gains and biases at `learning_rate`.
        Muon = "muon",
    }
}

/// What a config's `tokenizer` names (with `vocab_size`, a BPE's size).
#[derive(Debug, Clone, PartialEq)]
pub enum TokenizerKind {
    /// The characters of the training text.
    Char,
    /// A byte-level BPE of this many tokens, trained on the training part of the text.
    Bpe(usize),
    /// An existing Hugging Face `tokenizer.json`.
    File(PathBuf),
}

/// Tokens of a BPE trained with `tokenizer = "bpe"` and no `vocab_size`.
pub const DEFAULT_BPE_VOCAB: usize = 2048;

/// `configs/tiny_cpu.toml`, the default run's recipe, as built into the program (`train` uses it
/// when the file is not there).
const DEFAULT_RUN: &str = include_str!("../../../../configs/tiny_cpu.toml");

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

    /// What `tokenizer` names: the one place that reads it.
    pub fn tokenizer_kind(&self) -> TokenizerKind {
        match self.tokenizer.as_str() {
            tokenizer::CHAR => TokenizerKind::Char,
            tokenizer::BPE if self.vocab_size == 0 => TokenizerKind::Bpe(DEFAULT_BPE_VOCAB),
            tokenizer::BPE => TokenizerKind::Bpe(self.vocab_size),
            path => TokenizerKind::File(path.into()),
        }
    }

    /// Whether `tokenizer` names a tokenizer.json (not `char` or `bpe`).
    pub fn tokenizer_is_file(&self) -> bool {
        matches!(self.tokenizer_kind(), TokenizerKind::File(_))
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
        self.model_of(vocab_size)
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
