//! The architecture of a GPT, and the checks that make an invalid one impossible to build.

use burn::prelude::*;
use cinder_kernels::QkvLayout;

/// The LayerNorms' epsilon unless a config says otherwise: GPT-2's, Hugging Face's default for
/// GPT-2 folders, and Burn's.
pub const LAYER_NORM_EPSILON: f64 = 1e-5;

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

/// Calls the macro `$then` with every field of the model's configuration but `vocab_size`, in
/// the order config files list them: `name: type = default, "help";`, the default in Burn's
/// `#[config(default = ..)]` form, and none for `block_size` (a model has no default context).
/// The one declaration of the model's options: [`GptConfig`] is made from it here, and `cinder`'s
/// run configuration, its flags and their `--help` from it there. A new option is a line here.
///
/// The arguments given are passed on first, then `model { fields }`.
#[macro_export]
macro_rules! model_fields {
    ($then:ident! { $($args:tt)* }) => {
        $then! {
            $($args)*
            model {
                n_layer: usize = 4, "Transformer blocks";
                n_head: usize = 4, "Attention heads per block; must divide n_embd";
                n_kv_head: usize = 0,
                    "Key/value heads per block, each shared by n_head / n_kv_head query heads (grouped-query attention); must divide n_head; 0: n_head (multi-head attention)";
                n_embd: usize = 128, "Width of the residual stream (embedding size)";
                block_size: usize, "Context length in tokens";
                dropout: f64 = 0.0, "Dropout probability while training, in [0, 1)";
                bias: bool = true, "Biases in linear layers and LayerNorms";
                activation: Activation = "Activation::Gelu",
                    "The MLP's activation: gelu, gelu_tanh (GPT-2's weights') or relu2 (max(0, x)²)";
                layer_norm_epsilon: f64 = "LAYER_NORM_EPSILON",
                    "The epsilon of every LayerNorm or RMSNorm (QK-norm's too)";
                position: Position = "Position::Learned",
                    "Positions: learned (an embedding per position) or rope (rotary embeddings on queries and keys)";
                norm: Norm = "Norm::Layernorm", "layernorm, or rmsnorm (no gain; also after the embedding)";
                qk_norm: bool = false, "RMS-normalise each head's queries and keys (before RoPE)";
                logit_softcap: f64 = 0.0, "Soft-cap the logits at this (c·tanh(logits/c)); 0 disables";
                tie_embeddings: bool = true, "The head is the token embedding (false: a matrix of its own)";
                zero_init: bool = false, "Residual output projections and an untied head start at zero";
            }
        }
    };
}

/// [`GptConfig`] from the fields of [`model_fields!`].
macro_rules! gpt_config {
    (model { $($field:ident: $ty:ty $(= $default:tt)?, $help:literal;)* }) => {
        /// The architecture of a [`crate::Gpt`] (see [`model_fields!`]).
        #[derive(Config, Debug, PartialEq)]
        pub struct GptConfig {
            /// Number of distinct tokens the model reads and predicts.
            pub vocab_size: usize,
            $(
                #[doc = $help]
                $(#[config(default = $default)])?
                pub $field: $ty,
            )*
        }
    };
}

model_fields!(gpt_config! {});

/// An enum of a config field whose values are names (`activation = "gelu_tanh"`): serde and
/// `Display`/`FromStr` use the same names, listed in `ALL` (as `--help` and errors list them).
/// Every such enum of cinder's configuration is declared with it (`cinder_model::named!`).
#[macro_export]
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
        /// `max(0, x)²` (the nanoGPT speedrun's; NanoChat's, not GPT-2's).
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
        if !self.n_head.is_multiple_of(self.kv_heads()) {
            return Err(ConfigError {
                field: "n_kv_head",
                value: self.n_kv_head.to_string(),
                allowed: format!("0 or a divisor of n_head ({})", self.n_head),
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

    /// Key/value heads per block (`n_kv_head`, or `n_head` when it is 0).
    pub fn kv_heads(&self) -> usize {
        if self.n_kv_head == 0 {
            self.n_head
        } else {
            self.n_kv_head
        }
    }

    /// Where attention's queries, keys and values sit in its fused projection.
    pub fn qkv_layout(&self) -> QkvLayout {
        QkvLayout::new(self.n_head, self.kv_heads(), self.head_size())
    }
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
            (valid().with_n_kv_head(3), "n_kv_head"),
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
