//! Why a Hugging Face folder could not be read or written, and what an architecture refuses.

use std::path::PathBuf;

use cinder_data::tokenizer::TOKENIZER_JSON;

use super::files::{CONFIG, WEIGHTS};

/// Why a Hugging Face folder could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum HfError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{} is missing: a Hugging Face folder holds {CONFIG}, {WEIGHTS} and {TOKENIZER_JSON}",
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
    #[error(
        "this model fits no architecture that `transformers` loads without remote code:\n{0}\
         Train with configs/nanogpt_cpu.toml (GPT-2) or the default recipe (NanoChat), or \
         choose one with --architecture to see only its needs"
    )]
    NoArchitecture(String),
    #[error("this model cannot be written as asked: {0}")]
    NotThis(String),
}

/// One of the model's settings that an architecture cannot express: `field` is `value`, and the
/// architecture needs `allowed`.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub field: &'static str,
    pub value: String,
    pub allowed: String,
}

impl Refusal {
    pub(super) fn new(field: &'static str, value: impl ToString, allowed: &str) -> Self {
        Self {
            field,
            value: value.to_string(),
            allowed: allowed.into(),
        }
    }
}
