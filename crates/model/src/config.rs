//! The architecture of a GPT, and the checks that make an invalid one impossible to build.

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::{
    DropoutConfig, EmbeddingConfig, Initializer, LayerNorm, LayerNormConfig, Linear, LinearConfig,
};
use burn::prelude::*;

use crate::attention::CausalSelfAttention;
use crate::block::Block;
use crate::gpt::Gpt;
use crate::mlp::Mlp;

/// The LayerNorms' epsilon unless a config says otherwise: GPT-2's, Hugging Face's default for
/// GPT-2 folders, and Burn's.
pub const LAYER_NORM_EPSILON: f64 = 1e-5;

/// GPT-2 initialisation: weights are drawn from normal(0, 0.02).
const INIT_STD: f64 = 0.02;

/// A configuration field whose value is outside its allowed range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid model configuration: `{field}` is {value}, but it must be {allowed}")]
pub struct ConfigError {
    /// The name of the field, as written in config files (`n_embd`).
    pub field: &'static str,
    /// The value that was given.
    pub value: String,
    /// The allowed range, in words.
    pub allowed: String,
}

/// The architecture of a [`Gpt`].
#[derive(Config, Debug, PartialEq)]
pub struct GptConfig {
    /// Number of distinct tokens the model reads and predicts.
    pub vocab_size: usize,
    /// Longest context the model sees (number of learned positions).
    pub block_size: usize,
    /// Number of transformer blocks.
    #[config(default = 4)]
    pub n_layer: usize,
    /// Number of attention heads per block; must divide `n_embd`.
    #[config(default = 4)]
    pub n_head: usize,
    /// Width of the residual stream (embedding size).
    #[config(default = 128)]
    pub n_embd: usize,
    /// Dropout probability during training, in [0, 1).
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Whether linear layers and LayerNorms have a bias.
    #[config(default = true)]
    pub bias: bool,
    /// The MLP's activation.
    #[config(default = "Activation::Gelu")]
    pub activation: Activation,
    /// The epsilon of every LayerNorm (or RMSNorm, QK-norm included).
    #[config(default = "LAYER_NORM_EPSILON")]
    pub layer_norm_epsilon: f64,
    /// Learned positions or rotary embeddings.
    #[config(default = "Position::Learned")]
    pub position: Position,
    /// LayerNorm or RMSNorm.
    #[config(default = "Norm::Layernorm")]
    pub norm: Norm,
    /// RMS-normalise each head's queries and keys (before RoPE).
    #[config(default = false)]
    pub qk_norm: bool,
    /// `c · tanh(logits / c)` before the loss and sampling, with `c` this; 0 is off.
    #[config(default = 0.0)]
    pub logit_softcap: f64,
    /// The head is the token embedding (GPT-2's), or a matrix of its own (`lm_head`).
    #[config(default = true)]
    pub tie_embeddings: bool,
    /// The residual output projections (and an untied head) start at zero, not random.
    #[config(default = false)]
    pub zero_init: bool,
}

/// An enum of a config field whose values are names (`activation = "gelu_tanh"`): serde and
/// `Display`/`FromStr` use the same names, listed in `ALL` (as `--help` and errors list them).
macro_rules! named {
    (
        $(#[$meta:meta])*
        pub enum $name:ident ($what:literal) {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
        pub enum $name {
            $( $(#[$vmeta])* #[serde(rename = $text)] $variant, )+
        }

        impl $name {
            /// Every value, in the order `--help` lists them.
            pub const ALL: &[$name] = &[$($name::$variant),+];

            /// The name config files use.
            pub fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;

            fn from_str(s: &str) -> Result<Self, String> {
                Self::ALL.iter().copied().find(|a| a.name() == s).ok_or_else(|| {
                    let names: Vec<&str> = Self::ALL.iter().map(|a| a.name()).collect();
                    format!("`{s}` is not {}: {}", $what, names.join(", "))
                })
            }
        }
    };
}

named! {
    /// The MLP's activation.
    pub enum Activation ("an activation") {
        /// The exact GELU, `x Φ(x)` (GPT-2's paper; nanoGPT; Hugging Face's `gelu`).
        #[default]
        Gelu = "gelu",
        /// GPT-2's tanh approximation (Hugging Face's `gelu_new`, the released GPT-2 weights').
        GeluTanh = "gelu_tanh",
        /// `max(0, x)²` (the nanoGPT speedrun's; no GPT-2 folder can express it).
        Relu2 = "relu2",
    }
}

named! {
    /// How the model knows where a token is.
    pub enum Position ("a position encoding") {
        /// A learned embedding per position, added to the token's (GPT-2's): `wpe`.
        #[default]
        Learned = "learned",
        /// Rotary embeddings: each head's queries and keys turned by their position (RoPE, base
        /// 10000, the head's two halves paired as in GPT-NeoX). No weights; the context length
        /// is then the configured `block_size`.
        Rope = "rope",
    }
}

named! {
    /// The normalisation before each block's halves and before the head.
    pub enum Norm ("a norm") {
        /// LayerNorm with a gain, and a shift when `bias` (GPT-2's).
        #[default]
        Layernorm = "layernorm",
        /// RMSNorm without a gain (the nanoGPT speedrun's), `x / sqrt(mean(x²) + eps)`: it also
        /// normalises the embeddings before the first block; `bias` does not apply to it.
        Rmsnorm = "rmsnorm",
    }
}

impl GptConfig {
    /// Checks every field; the error names the first field that is out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let positive = |field: &'static str, value: usize| {
            if value == 0 {
                Err(ConfigError {
                    field,
                    value: value.to_string(),
                    allowed: "at least 1".into(),
                })
            } else {
                Ok(())
            }
        };
        positive("vocab_size", self.vocab_size)?;
        positive("block_size", self.block_size)?;
        positive("n_layer", self.n_layer)?;
        positive("n_head", self.n_head)?;
        positive("n_embd", self.n_embd)?;
        if !self.n_embd.is_multiple_of(self.n_head) {
            return Err(ConfigError {
                field: "n_embd",
                value: self.n_embd.to_string(),
                allowed: format!("a multiple of n_head ({})", self.n_head),
            });
        }
        if !(self.layer_norm_epsilon > 0.0 && self.layer_norm_epsilon < 1.0) {
            return Err(ConfigError {
                field: "layer_norm_epsilon",
                value: self.layer_norm_epsilon.to_string(),
                allowed: "in (0, 1)".into(),
            });
        }
        if self.position == Position::Rope && !self.head_size().is_multiple_of(2) {
            return Err(ConfigError {
                field: "n_embd",
                value: self.n_embd.to_string(),
                allowed: format!(
                    "with position = \"rope\", n_head ({}) times an even head size",
                    self.n_head
                ),
            });
        }
        if !(self.logit_softcap >= 0.0 && self.logit_softcap.is_finite()) {
            return Err(ConfigError {
                field: "logit_softcap",
                value: self.logit_softcap.to_string(),
                allowed: "0 (off) or a positive number".into(),
            });
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(ConfigError {
                field: "dropout",
                value: self.dropout.to_string(),
                allowed: "in [0, 1)".into(),
            });
        }
        Ok(())
    }

    /// Size of one attention head.
    pub fn head_size(&self) -> usize {
        self.n_embd / self.n_head
    }

    /// Builds the model with GPT-2 initialisation: weights normal(0, 0.02), biases zero, and the
    /// two residual output projections of each block normal(0, 0.02 / sqrt(2 * n_layer)), or
    /// zero with `zero_init` (as an untied head then is).
    ///
    /// Random draws come from the device's generator: seed it first for a reproducible model.
    pub fn init(&self, device: &Device) -> Result<Gpt, ConfigError> {
        self.validate()?;
        let residual_std = if self.zero_init {
            0.0
        } else {
            INIT_STD / ((2 * self.n_layer) as f64).sqrt()
        };
        let embedding = |n: usize| {
            EmbeddingConfig::new(n, self.n_embd)
                .with_initializer(normal(INIT_STD))
                .init(device)
        };
        let blocks = (0..self.n_layer)
            .map(|_| Block {
                ln_1: self.layer_norm(device),
                attn: CausalSelfAttention {
                    c_attn: self.linear(self.n_embd, 3 * self.n_embd, INIT_STD, device),
                    c_proj: self.linear(self.n_embd, self.n_embd, residual_std, device),
                    attn_dropout: DropoutConfig::new(self.dropout).init(),
                    resid_dropout: DropoutConfig::new(self.dropout).init(),
                    n_head: self.n_head,
                    rope: self.position == Position::Rope,
                    qk_norm: self.qk_norm,
                },
                ln_2: self.layer_norm(device),
                mlp: Mlp {
                    c_fc: self.linear(self.n_embd, 4 * self.n_embd, INIT_STD, device),
                    activation: self.activation,
                    c_proj: self.linear(4 * self.n_embd, self.n_embd, residual_std, device),
                    dropout: DropoutConfig::new(self.dropout).init(),
                },
            })
            .collect();
        let model = Gpt {
            wte: embedding(self.vocab_size),
            wpe: (self.position == Position::Learned).then(|| embedding(self.block_size)),
            drop: DropoutConfig::new(self.dropout).init(),
            blocks,
            ln_f: self.layer_norm(device),
            lm_head: (!self.tie_embeddings).then(|| {
                let std = if self.zero_init { 0.0 } else { INIT_STD };
                normal(std).init([self.vocab_size, self.n_embd], device)
            }),
            config: self.clone(),
            ops: Default::default(),
        };
        Ok(drawn(model))
    }

    fn linear(&self, d_in: usize, d_out: usize, std: f64, device: &Device) -> Linear {
        let init = if std == 0.0 {
            Initializer::Zeros
        } else {
            normal(std)
        };
        let mut linear = LinearConfig::new(d_in, d_out)
            .with_bias(self.bias)
            .with_initializer(init)
            .init(device);
        if self.bias {
            linear.bias = Some(Initializer::Zeros.init([d_out], device));
        }
        linear
    }

    /// A LayerNorm, or nothing for an RMSNorm (it has no weights).
    fn layer_norm(&self, device: &Device) -> Option<LayerNorm> {
        (self.norm == Norm::Layernorm).then(|| {
            LayerNormConfig::new(self.n_embd)
                .with_epsilon(self.layer_norm_epsilon)
                .with_bias(self.bias)
                .init(device)
        })
    }
}

/// `model` with every weight drawn now, in the model's order. Burn draws a weight lazily, from
/// the device's generator as it is when the weight is first read: without this, the values would
/// depend on what ran in between (a training step reseeds the generator), and on the order in
/// which a pass first reads the weights (which differs between the fused and composite layers).
/// The order is the one in which a forward pass reads them, so the values are those of models
/// initialised before.
fn drawn(model: Gpt) -> Gpt {
    struct Draw;
    impl ModuleVisitor for Draw {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            let _ = p.val();
        }
    }
    model.visit(&mut Draw);
    model
}

fn normal(std: f64) -> Initializer {
    Initializer::Normal { mean: 0.0, std }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid() -> GptConfig {
        GptConfig::new(10, 8)
    }

    #[test]
    fn activation_names_are_the_config_files() {
        for &a in Activation::ALL {
            let serde_name = serde_json::to_value(a).unwrap();
            assert_eq!(serde_name.as_str(), Some(a.name()));
            assert_eq!(a.name().parse::<Activation>(), Ok(a));
        }
        for &p in Position::ALL {
            assert_eq!(serde_json::to_value(p).unwrap().as_str(), Some(p.name()));
        }
        for &n in Norm::ALL {
            assert_eq!(serde_json::to_value(n).unwrap().as_str(), Some(n.name()));
        }
        let err = "swish".parse::<Activation>().unwrap_err();
        assert!(
            err.contains("not an activation: gelu, gelu_tanh, relu2"),
            "{err}"
        );
        let err = "alibi".parse::<Position>().unwrap_err();
        assert!(err.contains("learned, rope"), "{err}");
    }

    #[test]
    fn rejects_each_invalid_field_by_name() {
        let cases = [
            (valid().with_n_head(3), "n_embd"),
            (valid().with_n_layer(0), "n_layer"),
            (valid().with_n_head(0), "n_head"),
            (valid().with_n_embd(0), "n_embd"),
            (GptConfig::new(10, 0), "block_size"),
            (GptConfig::new(0, 8), "vocab_size"),
            (valid().with_dropout(1.0), "dropout"),
            (valid().with_dropout(-0.1), "dropout"),
            (valid().with_layer_norm_epsilon(0.0), "layer_norm_epsilon"),
            (valid().with_logit_softcap(-1.0), "logit_softcap"),
            (
                valid()
                    .with_n_embd(12)
                    .with_n_head(4)
                    .with_position(Position::Rope),
                "n_embd",
            ),
        ];
        for (config, field) in cases {
            let err = config.validate().unwrap_err();
            assert_eq!(err.field, field, "{err}");
            assert!(err.to_string().contains(field), "{err}");
        }
        assert!(valid().validate().is_ok());
    }
}
