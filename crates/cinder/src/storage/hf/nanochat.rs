//! NanoChat folders (`NanoChatForCausalLM`, `model_type: "nanochat"`): the default recipe.
//!
//! NanoChat is Karpathy's nanochat in `transformers`: rotary embeddings pairing each head's
//! halves, RMSNorm without gains after the embedding, before attention and the MLP and before
//! the head, a per-head QK-norm, a ReLU² MLP (`fc1`, `fc2`), no biases, grouped key/value heads,
//! an optional soft-cap and an optional tie. That is cinder's model with `position = "rope"`,
//! `norm = "rmsnorm"`, `qk_norm = true`, `activation = "relu2"` and `bias = false`, with two
//! differences of form, both exact:
//! - NanoChat's `rotate_half` is `cat(x2, -x1)`: it turns each pair by -θ where cinder turns by
//!   +θ. With F negating the second half of a head, `R(-θ) F = F R(θ)`, so F applied to the
//!   rows of each query and key head maps one onto the other: NanoChat's queries and keys are F
//!   times cinder's, and their dot products are equal. F is its own inverse, so export and
//!   import apply the same map ([`flip`]).
//! - NanoChat normalises queries and keys after the rotation, cinder before. Without gains an
//!   RMSNorm commutes with a rotation (and with F), which keep each head's mean square: the same
//!   values up to rounding.
//!
//! PyTorch's `nn.Linear` stores `[out, in]` where Burn's `Linear` stores `[in, out]`: each
//! projection is transposed, and cinder's fused `[C, q | k | v]` is cut into `q_proj`, `k_proj`
//! and `v_proj` by the model's [`QkvLayout`]. Names carry `model.` or not; the untied head is
//! `lm_head.weight`.

use burn::module::Param;
use burn::prelude::*;
use cinder_model::{Activation, Gpt, Norm, Position, QkvLayout, ROPE_BASE};
use serde_json::{Value, json};

use super::error::{HfError, Refusal};
use super::fields::Fields;
use super::files::HEAD;
use super::weights::{Named, Reader};
use crate::config::TrainConfig;

/// The prefix of `NanoChatForCausalLM`'s transformer's parameter names.
pub(super) const PREFIX: &str = "model.";

/// NanoChat's defaults where `config.json` leaves a field out (`NanoChatConfig`'s, not
/// cinder's).
const SOFTCAP: f64 = 15.0;
const RMS_NORM_EPS: f64 = 1e-6;

/// What NanoChat's architecture cannot express of `config`.
pub(super) fn refusals(config: &TrainConfig) -> Vec<Refusal> {
    let mut out = Vec::new();
    let mut refuse = |field, value: String, allowed: &str| {
        out.push(Refusal::new(field, value, allowed));
    };
    if config.position != Position::Rope {
        refuse(
            "position",
            config.position.to_string(),
            "rope (NanoChat has no position table)",
        );
    }
    if config.norm != Norm::Rmsnorm {
        let allowed = "rmsnorm (NanoChat's norms have no gains or shifts)";
        refuse("norm", config.norm.to_string(), allowed);
    }
    if !config.qk_norm {
        refuse(
            "qk_norm",
            "false".into(),
            "true (NanoChat always normalises queries and keys)",
        );
    }
    if config.activation != Activation::Relu2 {
        let allowed = "relu2 (NanoChat's MLP is ReLU²)";
        refuse("activation", config.activation.to_string(), allowed);
    }
    if config.bias {
        refuse(
            "bias",
            "true".into(),
            "false (NanoChat's MLP has no biases)",
        );
    }
    out
}

/// A NanoChat `config.json`'s architecture as a run configuration. A missing field takes
/// `NanoChatConfig`'s default (a soft-cap of 15, an epsilon of 1e-6, an untied head).
pub(super) fn config(hf: &Fields) -> Result<TrainConfig, HfError> {
    let act = hf.string("hidden_act", "relu2")?;
    if act != "relu2" {
        return Err(hf.unsupported("hidden_act", format!("\"{act}\""), "\"relu2\""));
    }
    if hf.bool("attention_bias", false)? {
        return Err(hf.unsupported("attention_bias", "true".into(), "false"));
    }
    let n_embd = hf.usize("hidden_size", 768)?;
    let n_head = hf.usize("num_attention_heads", 6)?;
    let intermediate = hf.usize("intermediate_size", 8192)?;
    if intermediate != 4 * n_embd {
        let allowed = format!("4 * hidden_size = {}", 4 * n_embd);
        return Err(hf.unsupported("intermediate_size", intermediate.to_string(), &allowed));
    }
    if let Some(head_dim) = hf.raw("head_dim").filter(|v| !v.is_null())
        && (n_head == 0 || head_dim.as_u64() != Some((n_embd / n_head) as u64))
    {
        let allowed = "hidden_size / num_attention_heads";
        return Err(hf.unsupported("head_dim", head_dim.to_string(), allowed));
    }
    // transformers 5 writes `rope_parameters`; 4 wrote `rope_theta` and `rope_scaling`.
    let rope = match hf.raw("rope_parameters") {
        Some(v) if !v.is_null() => hf.object("rope_parameters")?,
        _ => hf.object("rope_scaling")?,
    };
    let rope_type = match rope.raw("type") {
        Some(_) => rope.string("type", "default")?,
        None => rope.string("rope_type", "default")?,
    };
    if rope_type != "default" {
        let value = format!("\"{rope_type}\"");
        return Err(hf.unsupported("rope_type", value, "\"default\" (no scaling)"));
    }
    let theta = rope.f64("rope_theta", hf.f64("rope_theta", ROPE_BASE)?)?;
    if theta != ROPE_BASE {
        return Err(hf.unsupported("rope_theta", theta.to_string(), &ROPE_BASE.to_string()));
    }
    let softcap = hf.nullable_f64("final_logit_softcapping", Some(SOFTCAP))?;
    if let Some(cap) = softcap.filter(|c| *c <= 0.0) {
        let allowed = "a positive number, or null for none";
        return Err(hf.unsupported("final_logit_softcapping", cap.to_string(), allowed));
    }
    let n_kv_head = hf.usize("num_key_value_heads", n_head)?;
    Ok(TrainConfig {
        n_layer: hf.usize("num_hidden_layers", 12)?,
        n_head,
        n_kv_head,
        n_embd,
        block_size: hf.usize("max_position_embeddings", 2048)?,
        bias: false,
        activation: Activation::Relu2,
        layer_norm_epsilon: hf.f64("rms_norm_eps", RMS_NORM_EPS)?,
        position: Position::Rope,
        norm: Norm::Rmsnorm,
        qk_norm: true,
        logit_softcap: softcap.unwrap_or(0.0),
        tie_embeddings: hf.bool("tie_word_embeddings", false)?,
        ..TrainConfig::default()
    })
}

/// The `config.json` field that holds cinder's `field`.
pub(super) fn hf_field(field: &'static str) -> &'static str {
    match field {
        "block_size" => "max_position_embeddings",
        "n_layer" => "num_hidden_layers",
        "n_head" => "num_attention_heads",
        "n_kv_head" => "num_key_value_heads",
        "n_embd" => "hidden_size",
        "layer_norm_epsilon" => "rms_norm_eps",
        "logit_softcap" => "final_logit_softcapping",
        other => other,
    }
}

/// NanoChat's `config.json` for `config`, every value stated (NanoChat's defaults are not
/// cinder's), without what [`super::export`] adds for every architecture.
pub(super) fn config_json(config: &TrainConfig) -> Value {
    let softcap = (config.logit_softcap != 0.0).then_some(config.logit_softcap);
    json!({
        "hidden_size": config.n_embd,
        "intermediate_size": 4 * config.n_embd,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": config.model(1).kv_heads(),
        "max_position_embeddings": config.block_size,
        "hidden_act": "relu2",
        "rms_norm_eps": config.layer_norm_epsilon,
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_BASE},
        "final_logit_softcapping": softcap,
        "attention_bias": false,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": true,
    })
}

/// One parameter of the model as NanoChat stores it.
enum Slot<'a> {
    /// `[rows, cols]` in both: the embedding and the untied head.
    Same(&'a mut Param<Tensor<2>>),
    /// A Burn `Linear`'s `[in, out]`, stored as PyTorch's `[out, in]`.
    Linear(&'a mut Param<Tensor<2>>),
    /// Attention's fused `[C, q | k | v]`, stored as three `[out, C]` projections, the
    /// queries' and keys' heads [`flip`]ped.
    Qkv(&'a mut Param<Tensor<2>>, QkvLayout),
}

/// Every parameter of `model` with its NanoChat name (without [`PREFIX`]; for [`Slot::Qkv`],
/// the attention's prefix), in NanoChat's order. The one place where the two namings meet.
fn slots(model: &mut Gpt) -> Vec<(String, Slot<'_>)> {
    use Slot::*;
    let layout = model.config.qkv_layout();
    let mut slots = vec![(
        "embed_tokens.weight".to_string(),
        Same(&mut model.wte.weight),
    )];
    for (i, b) in model.blocks.iter_mut().enumerate() {
        let at = |name: &str| format!("layers.{i}.{name}");
        slots.extend([
            (at("self_attn."), Qkv(&mut b.attn.c_attn.weight, layout)),
            (
                at("self_attn.o_proj.weight"),
                Linear(&mut b.attn.c_proj.weight),
            ),
            (at("mlp.fc1.weight"), Linear(&mut b.mlp.c_fc.weight)),
            (at("mlp.fc2.weight"), Linear(&mut b.mlp.c_proj.weight)),
        ]);
    }
    if let Some(head) = &mut model.lm_head {
        slots.push((HEAD.to_string(), Same(head)));
    }
    slots
}

/// The three projections of a [`Slot::Qkv`]: name, columns of the fused weight, and whether
/// their heads are [`flip`]ped.
fn projections(layout: QkvLayout) -> [(&'static str, std::ops::Range<usize>, bool); 3] {
    [
        ("q_proj.weight", layout.q(), true),
        ("k_proj.weight", layout.k(), true),
        ("v_proj.weight", layout.v(), false),
    ]
}

/// The sign F gives row `row` of a flipped projection of heads `head_size` wide: -1 in the
/// second half of each head.
fn flip(row: usize, head_size: usize) -> f32 {
    if row % head_size >= head_size / 2 {
        -1.0
    } else {
        1.0
    }
}

/// `m`, `[rows, cols]` row-major, transposed.
fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0; m.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = m[r * cols + c];
        }
    }
    t
}

fn values(p: &Param<Tensor<2>>) -> (Vec<usize>, Vec<f32>) {
    let v = p.val();
    let dims = v.dims().to_vec();
    (
        dims,
        v.into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .expect("f32"),
    )
}

/// The model's tensors by NanoChat's names, with the prefix `NanoChatForCausalLM` writes.
pub(super) fn tensors(model: &Gpt) -> Vec<Named> {
    let mut model = model.clone();
    let full = |name: String| {
        if name == HEAD {
            name
        } else {
            format!("{PREFIX}{name}")
        }
    };
    let mut out = Vec::new();
    for (name, slot) in slots(&mut model) {
        match slot {
            Slot::Same(p) => {
                let (dims, v) = values(p);
                out.push((full(name), dims, v));
            }
            Slot::Linear(p) => {
                let (dims, v) = values(p);
                let t = transpose(&v, dims[0], dims[1]);
                out.push((full(name), vec![dims[1], dims[0]], t));
            }
            Slot::Qkv(p, layout) => {
                let (dims, w) = values(p);
                let (c, width) = (dims[0], dims[1]);
                for (part, cols, flipped) in projections(layout) {
                    // [C, W] columns `cols` -> [cols.len(), C]
                    let mut t = Vec::with_capacity(cols.len() * c);
                    for (j, col) in cols.clone().enumerate() {
                        let sign = if flipped {
                            flip(j, layout.head_size)
                        } else {
                            1.0
                        };
                        t.extend((0..c).map(|i| sign * w[i * width + col]));
                    }
                    out.push((full(format!("{name}{part}")), vec![cols.len(), c], t));
                }
            }
        }
    }
    out
}

/// Sets every parameter of `model` from `file`.
pub(super) fn load(model: &mut Gpt, file: &Reader, device: &Device) -> Result<(), HfError> {
    let set = |p: &mut Param<Tensor<2>>, v: Vec<f32>, dims: [usize; 2]| {
        *p = Param::from_data(TensorData::new(v, dims), device);
    };
    for (name, slot) in slots(model) {
        match slot {
            Slot::Same(p) => {
                let dims: [usize; 2] = p.lazy_shape().dims();
                set(p, file.tensor(&name, &dims)?, dims);
            }
            Slot::Linear(p) => {
                let [i, o] = p.lazy_shape().dims();
                let t = file.tensor(&name, &[o, i])?;
                set(p, transpose(&t, o, i), [i, o]);
            }
            Slot::Qkv(p, layout) => {
                let [c, width] = p.lazy_shape().dims();
                let mut w = vec![0.0; c * width];
                for (part, cols, flipped) in projections(layout) {
                    let t = file.tensor(&format!("{name}{part}"), &[cols.len(), c])?;
                    for (j, col) in cols.enumerate() {
                        let sign = if flipped {
                            flip(j, layout.head_size)
                        } else {
                            1.0
                        };
                        for i in 0..c {
                            w[i * width + col] = sign * t[j * c + i];
                        }
                    }
                }
                set(p, w, [c, width]);
            }
        }
    }
    // A tied head is the embedding; PyTorch's rotary buffers are not parameters.
    let ignored = |name: &str| name == HEAD || name.ends_with("rotary_emb.inv_freq");
    file.finish(ignored, "NanoChat")
}
