//! The files of a Hugging Face folder, and the one tensor name both architectures share.

/// The model's shape and settings.
pub const CONFIG: &str = "config.json";
/// The weights.
pub const WEIGHTS: &str = "model.safetensors";
/// What `AutoTokenizer` reads besides `tokenizer.json`.
pub const TOKENIZER_CONFIG: &str = "tokenizer_config.json";
/// The special tokens `generate` starts and stops at.
pub const GENERATION_CONFIG: &str = "generation_config.json";
/// The untied head's name: outside the transformer's module in both architectures' files.
pub(super) const HEAD: &str = "lm_head.weight";
