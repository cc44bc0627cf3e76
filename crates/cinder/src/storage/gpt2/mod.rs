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
//!
//! Reading is in [`read`], writing in [`write`]; the names and the parameter map they share are
//! here.

use std::path::{Path, PathBuf};

use burn::module::Param;
use burn::nn::LayerNorm;
use burn::prelude::*;
use cinder_data::tokenizer::TOKENIZER_JSON;
use cinder_model::Gpt;

mod read;
mod write;

pub use read::{load_weights, read_config};
pub use write::export;

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
