//! The checks of a run configuration: each field against its allowed range, named in the error.

use super::{ConfigError, TrainConfig};

impl TrainConfig {
    /// Checks every field; the error names the field and its allowed range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        fn check(
            ok: bool,
            field: &'static str,
            value: String,
            allowed: &'static str,
        ) -> Result<(), ConfigError> {
            if ok {
                Ok(())
            } else {
                Err(ConfigError::OutOfRange {
                    field,
                    value,
                    allowed,
                })
            }
        }
        let c = self;
        check(
            c.batch_size > 0,
            "batch_size",
            c.batch_size.to_string(),
            "at least 1",
        )?;
        check(
            c.max_iters > 0,
            "max_iters",
            c.max_iters.to_string(),
            "at least 1",
        )?;
        check(
            c.learning_rate > 0.0 && c.learning_rate.is_finite(),
            "learning_rate",
            c.learning_rate.to_string(),
            "a positive number",
        )?;
        check(
            c.min_lr >= 0.0 && c.min_lr <= c.learning_rate,
            "min_lr",
            c.min_lr.to_string(),
            "between 0 and learning_rate",
        )?;
        check(
            c.weight_decay >= 0.0,
            "weight_decay",
            c.weight_decay.to_string(),
            "0 or more",
        )?;
        check(
            (0.0..1.0).contains(&c.beta1),
            "beta1",
            c.beta1.to_string(),
            "in [0, 1)",
        )?;
        check(
            (0.0..1.0).contains(&c.beta2),
            "beta2",
            c.beta2.to_string(),
            "in [0, 1)",
        )?;
        check(
            c.grad_clip >= 0.0,
            "grad_clip",
            c.grad_clip.to_string(),
            "0 (off) or more",
        )?;
        check(
            c.gradient_accumulation_steps > 0,
            "gradient_accumulation_steps",
            c.gradient_accumulation_steps.to_string(),
            "at least 1",
        )?;
        check(
            c.eval_interval > 0,
            "eval_interval",
            c.eval_interval.to_string(),
            "at least 1",
        )?;
        check(
            c.eval_iters > 0,
            "eval_iters",
            c.eval_iters.to_string(),
            "at least 1",
        )?;
        check(
            c.log_interval > 0,
            "log_interval",
            c.log_interval.to_string(),
            "at least 1",
        )?;
        check(
            c.checkpoint_interval > 0,
            "checkpoint_interval",
            c.checkpoint_interval.to_string(),
            "at least 1",
        )?;
        check(
            c.train_fraction > 0.0 && c.train_fraction < 1.0,
            "train_fraction",
            c.train_fraction.to_string(),
            "in (0, 1)",
        )?;
        check(
            (0.0..=1.0).contains(&c.cooldown_fraction),
            "cooldown_fraction",
            c.cooldown_fraction.to_string(),
            "in [0, 1]",
        )?;
        let rates = [
            ("muon_lr", c.muon_lr),
            ("embedding_lr", c.embedding_lr),
            ("head_lr", c.head_lr),
        ];
        for (field, value) in rates {
            check(
                value > 0.0 && value.is_finite(),
                field,
                value.to_string(),
                "a positive number",
            )?;
        }
        check(
            (0.0..1.0).contains(&c.muon_momentum),
            "muon_momentum",
            c.muon_momentum.to_string(),
            "in [0, 1)",
        )?;
        check(
            (0.0..1.0).contains(&c.muon_beta2),
            "muon_beta2",
            c.muon_beta2.to_string(),
            "in [0, 1) (0: plain Muon)",
        )?;
        let is_bpe = matches!(c.tokenizer_kind(), super::TokenizerKind::Bpe(_));
        check(
            c.vocab_size == 0 || (is_bpe && c.vocab_size >= 257) || c.tokenizer_is_file(),
            "vocab_size",
            c.vocab_size.to_string(),
            "0 (the default) or, with tokenizer = \"bpe\", at least 257 (256 bytes and \
             <|endoftext|>); a char vocabulary is the text's characters, and with a \
             tokenizer.json it pads the model's vocabulary beyond the file's tokens",
        )?;
        check(
            !c.tokenizer.is_empty(),
            "tokenizer",
            "\"\"".into(),
            "\"char\", \"bpe\" or the path of a tokenizer.json",
        )?;
        self.model(1).validate()?;
        Ok(())
    }
}
