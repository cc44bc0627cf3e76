//! GPT-2 folders (`GPT2LMHeadModel`): nanoGPT's recipe.
//!
//! With GPT-2's options (learned positions, LayerNorm, no QK-norm or soft-cap) cinder's model is
//! GPT-2's, so the parameters map one to one ([`slots`]). GPT-2's `Conv1D` stores its weight
//! `[in, out]`, which is already the layout of Burn's `Linear`: nothing is transposed (nanoGPT's
//! transpose is for PyTorch's `nn.Linear`). A tied head is `wte` (a `lm_head.weight` in the file
//! is left unread); an untied one (`tie_word_embeddings: false`) is `lm_head.weight`. The
//! attention mask buffers (`attn.bias`, `attn.masked_bias`) are ignored. Names may carry
//! `GPT2LMHeadModel`'s `transformer.` prefix or not; `export` writes it.

use burn::module::Param;
use burn::nn::LayerNorm;
use burn::prelude::*;
use cinder_model::{Activation, Gpt, Norm, Position};
use serde_json::{Value, json};

use super::error::{HfError, Refusal};
use super::fields::Fields;
use super::files::HEAD;
use super::weights::{Named, Reader};
use crate::config::TrainConfig;

/// The prefix of `GPT2LMHeadModel`'s parameter names.
pub(super) const PREFIX: &str = "transformer.";

/// Hugging Face's `activation_function` names and the activation each means; `export` writes an
/// activation's first name. ReLU² has none.
const ACTIVATIONS: &[(&str, Activation)] = &[
    ("gelu", Activation::Gelu),
    ("gelu_new", Activation::GeluTanh),
    ("gelu_pytorch_tanh", Activation::GeluTanh),
];

/// What GPT-2's architecture cannot express of `config`.
pub(super) fn refusals(config: &TrainConfig) -> Vec<Refusal> {
    let mut out = Vec::new();
    let mut refuse = |field, value: String, allowed: &str| {
        out.push(Refusal::new(field, value, allowed));
    };
    if !ACTIVATIONS.iter().any(|(_, a)| *a == config.activation) {
        let allowed = "gelu or gelu_tanh (its config.json has no ReLU²)";
        refuse("activation", config.activation.to_string(), allowed);
    }
    if config.position != Position::Learned {
        let allowed = "learned (GPT-2 has no rotary embeddings)";
        refuse("position", config.position.to_string(), allowed);
    }
    if config.norm != Norm::Layernorm {
        let allowed = "layernorm (GPT-2 has no RMSNorm)";
        refuse("norm", config.norm.to_string(), allowed);
    }
    if config.model(1).kv_heads() != config.n_head {
        let allowed = format!(
            "0 or n_head ({}): GPT-2's heads each have their own keys and values",
            config.n_head
        );
        refuse("n_kv_head", config.n_kv_head.to_string(), &allowed);
    }
    if config.qk_norm {
        refuse("qk_norm", "true".into(), "false (GPT-2 has no QK-norm)");
    }
    if config.logit_softcap != 0.0 {
        let allowed = "0 (GPT-2's logits are not capped)";
        refuse("logit_softcap", config.logit_softcap.to_string(), allowed);
    }
    out
}

/// A GPT-2 `config.json`'s architecture as a run configuration (with `GPT2Config`'s defaults).
pub(super) fn config(hf: &Fields) -> Result<TrainConfig, HfError> {
    let name = hf.string("activation_function", "gelu_new")?;
    let Some(&(_, activation)) = ACTIVATIONS.iter().find(|(n, _)| *n == name) else {
        let names: Vec<String> = ACTIVATIONS
            .iter()
            .map(|(n, _)| format!("\"{n}\""))
            .collect();
        let allowed = format!("one of {}", names.join(", "));
        return Err(hf.unsupported("activation_function", format!("\"{name}\""), &allowed));
    };
    let n_embd = hf.usize("n_embd", 768)?;
    let n_inner = hf.raw("n_inner").filter(|v| !v.is_null());
    if let Some(n_inner) = n_inner.filter(|v| v.as_u64() != Some(4 * n_embd as u64)) {
        return Err(hf.unsupported(
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
            return Err(hf.unsupported(field, got.to_string(), &want.to_string()));
        }
    }
    Ok(TrainConfig {
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
        n_kv_head: 0,
        tie_embeddings: hf.bool("tie_word_embeddings", true)?,
        ..TrainConfig::default()
    })
}

/// The `config.json` field that holds cinder's `field`.
pub(super) fn hf_field(field: &'static str) -> &'static str {
    match field {
        "block_size" => "n_positions",
        other => other,
    }
}

/// GPT-2's `config.json` for `config`, without what [`super::export`] adds for every
/// architecture.
pub(super) fn config_json(config: &TrainConfig) -> Value {
    let (activation, _) = ACTIVATIONS
        .iter()
        .find(|(_, a)| *a == config.activation)
        .expect("refusals checked the activation");
    json!({
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
        "use_cache": true,
    })
}

/// One parameter of the model, as it is stored in a GPT-2 file.
enum Slot<'a> {
    Matrix(&'a mut Param<Tensor<2>>),
    Vector(&'a mut Param<Tensor<1>>),
    /// A bias the model may not have (`bias = false`); GPT-2 files always have it, written as
    /// zeros for such a model.
    Bias(&'a mut Option<Param<Tensor<1>>>, usize),
}

/// Every parameter of `model` with its GPT-2 name (without [`PREFIX`]), in GPT-2's order. The
/// one place where the two namings meet. A GPT-2 model has learned positions and LayerNorms
/// (export refuses the others); its head is `wte`, or `lm_head` when untied.
fn slots(model: &mut Gpt) -> Vec<(String, Slot<'_>)> {
    use Slot::*;
    fn ln(norm: &mut Option<LayerNorm>) -> &mut LayerNorm {
        norm.as_mut().expect("a GPT-2 model has LayerNorms")
    }
    let c = model.wte.weight.lazy_shape()[1];
    let qkv = model.config.qkv_layout().width();
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
            (at("attn.c_attn.bias"), Bias(&mut attn.c_attn.bias, qkv)),
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

/// The model's tensors by GPT-2's names, with the prefix `GPT2LMHeadModel` writes. A model
/// without biases gets zero biases.
pub(super) fn tensors(model: &Gpt) -> Vec<Named> {
    let mut model = model.clone();
    slots(&mut model)
        .into_iter()
        .map(|(name, slot)| {
            let (shape, values) = match slot {
                Slot::Matrix(p) => (p.val().dims().to_vec(), p.val().into_data()),
                Slot::Vector(p) => (p.val().dims().to_vec(), p.val().into_data()),
                Slot::Bias(Some(p), _) => (p.val().dims().to_vec(), p.val().into_data()),
                Slot::Bias(None, n) => (vec![n], TensorData::new(vec![0.0f32; n], [n])),
            };
            let values = values
                .convert::<f32>()
                .try_to_vec::<f32>()
                .expect("f32 values");
            let name = if name == HEAD {
                name
            } else {
                format!("{PREFIX}{name}")
            };
            (name, shape, values)
        })
        .collect()
}

/// Sets every parameter of `model` from `file`.
pub(super) fn load(model: &mut Gpt, file: &Reader, device: &Device) -> Result<(), HfError> {
    for (name, slot) in slots(model) {
        let shape = match &slot {
            Slot::Matrix(p) => p.lazy_shape().to_vec(),
            Slot::Vector(p) => p.lazy_shape().to_vec(),
            Slot::Bias(_, n) => vec![*n],
        };
        let data = TensorData::new(file.tensor(&name, &shape)?, shape);
        match slot {
            Slot::Matrix(p) => *p = Param::from_data(data, device),
            Slot::Vector(p) => *p = Param::from_data(data, device),
            Slot::Bias(p, _) => *p = Some(Param::from_data(data, device)),
        }
    }
    // The attention's mask buffers, and a tied head (the same values as `wte`).
    let ignored = |name: &str| {
        name == HEAD || name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias")
    };
    file.finish(ignored, "GPT-2")
}
