//! Command-line pieces shared by the binaries: the config overrides of `train`.

pub use crate::config::{Change, Overrides, flag_defaults};
use crate::config::{TrainConfig, architecture};

/// Fields a resumed run may change; the others come from the checkpoint.
pub const RESUMABLE_FIELDS: &[&str] = &[
    "max_iters",
    "eval_interval",
    "eval_iters",
    "log_interval",
    "checkpoint_interval",
    "sample_tokens",
    "early_stop",
];

/// Applies `overrides` to a checkpoint's `config` for a resumed run. Fields that may change are
/// set and returned; a flag that contradicts any other field is an error naming it.
pub fn apply_on_resume(
    overrides: &Overrides,
    config: &mut TrainConfig,
) -> Result<Vec<Change>, String> {
    let saved = config.clone();
    let changes = overrides.apply(config);
    let (before, after) = (saved.to_table(), config.to_table());
    for change in &changes {
        if RESUMABLE_FIELDS.contains(&change.field) {
            continue;
        }
        let was = before
            .get(change.field)
            .map(|v| v.to_string())
            .unwrap_or_default();
        if after.get(change.field) != before.get(change.field) {
            return Err(format!(
                "--{} {} contradicts the checkpoint, which has {} = {was}: a resumed run keeps \
                 its architecture, data and optimisation settings; only {} may change",
                change.field.replace('_', "-"),
                change.value,
                change.field,
                RESUMABLE_FIELDS
                    .iter()
                    .map(|f| format!("--{}", f.replace('_', "-")))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    Ok(changes
        .into_iter()
        .filter(|c| RESUMABLE_FIELDS.contains(&c.field))
        .collect())
}

/// Gives a new run that starts from a checkpoint's weights (`--init-from`) the checkpoint's
/// architecture (`from`); the other fields stay as the config file and `overrides` set them.
/// A flag that contradicts the checkpoint's architecture is an error naming it. The one
/// exception is a shorter context: `crop_to`, the block size the config file or a flag asked
/// for, may be below the checkpoint's, and the run then trains the model cropped to it (as
/// nanoGPT's `crop_block_size`).
pub fn adopt_architecture(
    overrides: &Overrides,
    config: &mut TrainConfig,
    from: &TrainConfig,
    crop_to: Option<usize>,
) -> Result<(), String> {
    let crop_to = crop_to.filter(|&b| b > 0 && b < from.block_size);
    let adopted = config.with_architecture_of(from);
    let (given, theirs) = (config.to_table(), adopted.to_table());
    let flags = overrides.apply(&mut TrainConfig::default());
    let fields = architecture();
    for change in flags.iter().filter(|c| fields.iter().any(|f| f == c.field)) {
        let cropped = change.field == "block_size" && crop_to.is_some();
        if given.get(change.field) != theirs.get(change.field) && !cropped {
            let theirs = theirs
                .get(change.field)
                .map(|v| v.to_string())
                .unwrap_or_default();
            return Err(format!(
                "--{} {} contradicts the checkpoint to start from, which has {} = {theirs}: a \
                 fine-tuned model keeps the architecture ({}) and the vocabulary of its checkpoint",
                change.field.replace('_', "-"),
                change.value,
                change.field,
                fields.join(", ")
            ));
        }
    }
    *config = adopted;
    if let Some(block_size) = crop_to {
        config.block_size = block_size;
    }
    Ok(())
}

/// Runs a binary's `main`, printing an error as `error: <message>: <cause>...` with exit status 1
/// (no backtrace: a user's mistake is not a crash). A cause already quoted by the message before
/// it is not repeated.
pub fn exit_on_error(result: anyhow::Result<()>) {
    if let Err(e) = result {
        let mut line = String::new();
        for cause in e.chain().map(|c| c.to_string()) {
            if !line.contains(&cause) {
                if !line.is_empty() {
                    line.push_str(": ");
                }
                line.push_str(&cause);
            }
        }
        eprintln!("error: {line}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        overrides: Overrides,
    }

    #[test]
    fn help_shows_the_built_in_defaults() {
        let help = Flags::command().render_help().to_string();
        let defaults = flag_defaults();
        let fields = TrainConfig::default().to_table(); // init_from, None, is left out
        assert_eq!(
            defaults.len(),
            fields.len(),
            "every field but init_from has a flag"
        );
        for (field, value) in defaults {
            let flag = format!("--{}", field.replace('_', "-"));
            // clap wraps long help: the flag's entry runs to the next flag.
            let entry = help
                .split("  --")
                .find(|e| e.starts_with(&flag[2..]) && e[flag.len() - 2..].starts_with(' '))
                .unwrap_or_else(|| panic!("{flag} is in the help:\n{help}"));
            let entry = entry.split_whitespace().collect::<Vec<_>>().join(" ");
            assert!(
                entry.contains(&format!("[default: {value}]")),
                "{flag}: {entry}"
            );
        }
        let d = TrainConfig::default();
        assert!(help.contains(&format!("[default: {}]", d.max_iters)));
        assert!(help.contains(&format!("[default: {}]", d.learning_rate)));
    }

    #[test]
    fn flags_override_config_and_are_reported() {
        let mut c = TrainConfig::default();
        let o = Overrides {
            n_layer: Some(2),
            learning_rate: Some(3e-4),
            ..Default::default()
        };
        let changes = o.apply(&mut c);
        assert_eq!((c.n_layer, c.learning_rate), (2, 3e-4));
        assert_eq!(changes.len(), 2);
        assert_eq!(changes[0].field, "n_layer");
    }

    #[test]
    fn resume_accepts_schedule_fields_and_refuses_architecture() {
        let mut c = TrainConfig::default();
        let o = Overrides {
            max_iters: Some(4000),
            n_layer: Some(4), // same as the checkpoint: fine
            ..Default::default()
        };
        let changes = apply_on_resume(&o, &mut c).unwrap();
        assert_eq!(c.max_iters, 4000);
        assert_eq!(
            changes,
            vec![Change {
                field: "max_iters",
                value: "4000".into()
            }]
        );

        let mut c = TrainConfig::default();
        let o = Overrides {
            n_layer: Some(6),
            ..Default::default()
        };
        let err = apply_on_resume(&o, &mut c).unwrap_err();
        assert!(
            err.contains("--n-layer 6") && err.contains("n_layer = 4"),
            "{err}"
        );
    }

    #[test]
    fn fine_tuning_takes_the_checkpoints_architecture_and_refuses_contradicting_flags() {
        let ckpt = TrainConfig {
            n_layer: 2,
            n_embd: 64,
            ..TrainConfig::default()
        };
        // The config file says 4 layers (not a flag): the checkpoint wins.
        let o = Overrides {
            learning_rate: Some(1e-4),
            n_embd: Some(64), // agrees: fine
            ..Default::default()
        };
        let mut c = TrainConfig::default();
        o.apply(&mut c);
        adopt_architecture(&o, &mut c, &ckpt, None).unwrap();
        assert_eq!((c.n_layer, c.n_embd, c.learning_rate), (2, 64, 1e-4));
        assert_eq!(c.block_size, ckpt.block_size);

        let o = Overrides {
            n_layer: Some(6),
            ..Default::default()
        };
        let mut c = TrainConfig::default();
        o.apply(&mut c);
        let err = adopt_architecture(&o, &mut c, &ckpt, None).unwrap_err();
        assert!(
            err.contains("--n-layer 6") && err.contains("n_layer = 2"),
            "{err}"
        );

        // A shorter context crops; a longer one contradicts the checkpoint.
        for (block, ok) in [(32, true), (128, false)] {
            let o = Overrides {
                block_size: Some(block),
                ..Default::default()
            };
            let mut c = TrainConfig::default();
            o.apply(&mut c);
            let result = adopt_architecture(&o, &mut c, &ckpt, Some(block));
            match ok {
                true => assert_eq!(c.block_size, 32, "{result:?}"),
                false => assert!(result.unwrap_err().contains("--block-size 128")),
            }
        }
    }
}

/// `--ops`: which version of the model's layers runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OpsArg {
    /// cinder's fused CPU kernels on the flex backend (Burn operations with their own backward
    /// passes); Burn's composite operations on other backends
    #[default]
    Fused,
    /// Burn's composite operations everywhere (slower; for comparisons and tests)
    Composite,
}

/// Where a command runs: `--device` and `--ops`, the same flags in every binary that runs a model.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct RunOn {
    /// Where to run
    #[arg(long, value_enum, default_value_t)]
    pub device: crate::device::DeviceChoice,
    /// Which layers run: cinder's fused CPU kernels (on the flex backend) or Burn's composite
    /// operations
    #[arg(long, value_enum, default_value_t)]
    pub ops: OpsArg,
}

impl From<OpsArg> for cinder_model::Ops {
    fn from(o: OpsArg) -> Self {
        match o {
            OpsArg::Fused => cinder_model::Ops::Fused,
            OpsArg::Composite => cinder_model::Ops::Composite,
        }
    }
}
