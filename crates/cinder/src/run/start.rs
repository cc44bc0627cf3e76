//! Starting a run: a new one from a config file and flags (or from a checkpoint's weights,
//! `--init-from`), or a resumed one from its checkpoint. The policy lives here: which config
//! and data, which run folder (locked first), what a resume may change, that a resumed run reads
//! its own text; `train` only parses its flags and reports.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};

use crate::cli::{Overrides, adopt_architecture, apply_on_resume};
use crate::config::{TokenizerKind, TrainConfig};
use crate::data::{TokenizerChoice, TrainingData};
use crate::device::Backend;
use crate::run::plan;
use crate::run::trainer::Trainer;
use crate::storage::checkpoint;
use crate::storage::names::{self, BEST, LATEST, READ};
use crate::storage::run_folder::{RUNS, RunLock};

/// The config file a run uses when none is named.
pub const DEFAULT_CONFIG: &str = "configs/tiny_cpu.toml";
/// The text a run trains on when none is named.
pub const DEFAULT_DATA: &str = "data/tinyshakespeare.txt";
/// The default run's folder, which the readers (`generate`, `evaluate`, ...) take by default:
/// the default config's under [`RUNS`].
pub const DEFAULT_RUN: &str = "checkpoints/tiny_cpu";

/// What `train` was asked for.
#[derive(Debug, Clone)]
pub struct StartRequest {
    /// The config file of a new run; none for the default: [`DEFAULT_CONFIG`] (its built-in
    /// copy when the file is not there), or nanoGPT's recipe for a fine-tuning (`init_from`).
    pub config: Option<PathBuf>,
    /// Text files, folders of them, or a prepared folder; empty for the default (or, when
    /// resuming, the run's own).
    pub data: Vec<PathBuf>,
    /// The run folder, if not the default.
    pub out: Option<PathBuf>,
    /// A run folder or checkpoint to continue.
    pub resume: Option<PathBuf>,
    /// A checkpoint whose weights a new run starts from.
    pub init_from: Option<PathBuf>,
    /// Move an old run in the folder aside instead of refusing.
    pub overwrite: bool,
    /// Config fields set by flags.
    pub overrides: Overrides,
    /// Which layers the run uses (and measures, with a time budget).
    pub ops: cinder_model::Ops,
    /// When the program started: a time budget counts from there.
    pub started: Instant,
}

/// The trainer of the run `req` asks for, and the lock on its folder (held until dropped).
/// `say` prints a line of what is being done.
pub fn open(
    req: &StartRequest,
    backend: Backend,
    say: &dyn Fn(String),
) -> anyhow::Result<(Trainer, RunLock)> {
    match &req.resume {
        Some(from) => resume(req, from, backend, say),
        None => start_new(req, backend, say),
    }
}

/// A new run from the config file and flags, or from a checkpoint's weights (`--init-from`).
fn start_new(
    req: &StartRequest,
    backend: Backend,
    say: &dyn Fn(String),
) -> anyhow::Result<(Trainer, RunLock)> {
    // The config, the file it came from (if any) and the run's name.
    let (mut config, file, name) = match &req.config {
        Some(path) => (TrainConfig::load(path)?, Some(path.clone()), stem(path)),
        None if req.init_from.is_some() => {
            // The default run's recipe (Muon at a high rate) is for training from scratch: a
            // fine-tuning without a config of its own takes nanoGPT's AdamW recipe.
            say(
                "fine-tuning without --config: nanoGPT's AdamW recipe (configs/nanogpt_cpu.toml)"
                    .into(),
            );
            (TrainConfig::default(), None, "finetune".to_string())
        }
        None => {
            let path = PathBuf::from(DEFAULT_CONFIG);
            if path.exists() {
                (TrainConfig::load(&path)?, Some(path.clone()), stem(&path))
            } else {
                say(format!(
                    "{DEFAULT_CONFIG} not found: using the copy built into this program"
                ));
                (TrainConfig::default_run(), None, stem(&path))
            }
        }
    };
    req.overrides.apply(&mut config);
    if let Some(from) = &req.init_from {
        config.init_from = Some(from.clone());
    }
    if config.time_budget.seconds().is_some() {
        // Before a folder is touched: a plan's flags that contradict it are refused first.
        plan::check(&config, &req.overrides)?;
    }
    let out = req
        .out
        .clone()
        .unwrap_or_else(|| Path::new(RUNS).join(name));
    let data_paths = if req.data.is_empty() {
        vec![PathBuf::from(DEFAULT_DATA)]
    } else {
        req.data.clone()
    };

    // The checkpoint to start from, if any, gives the architecture and the vocabulary.
    let init = match &config.init_from {
        Some(from) => {
            let dir = checkpoint::resolve(from, &READ)
                .with_context(|| format!("cannot start from {}", from.display()))?;
            let meta = checkpoint::load_meta(&dir)?;
            // A block size given by a flag or the config file may crop the model's context.
            let crop_to = req
                .overrides
                .block_size
                .or(file.as_deref().and_then(config_file_block_size));
            adopt_architecture(&req.overrides, &mut config, &meta.config, crop_to)
                .map_err(anyhow::Error::msg)?;
            if config.block_size < meta.config.block_size {
                say(format!(
                    "cropping the model's context from {} to block_size = {} positions",
                    meta.config.block_size, config.block_size
                ));
            }
            say(format!(
                "starting from the weights of {} (iteration {}); its architecture and vocabulary \
                 are kept, the optimizer and schedule start afresh",
                dir.display(),
                meta.iter
            ));
            Some((dir, meta))
        }
        None => None,
    };
    config.validate()?;
    // (A time budget's plan measures the shapes it may choose, from small ones up.)
    if backend.is_cpu() && config.time_budget.seconds().is_none() {
        crate::memory::check_training(&config, "lower --batch-size or --block-size")?;
    }

    // Until the run has started, what fails (the text, the plan) leaves no folder behind that
    // this start made (`RunLock::started`).
    let mut lock = RunLock::acquire(&out)?;
    // Refuse an old run (or move it aside) before the data is read: a BPE run prepares its
    // token files in the run folder.
    if let Some(aside) = lock.clear_for_new_run(req.overwrite)? {
        say(format!(
            "moved the old run in {} aside into {}",
            out.display(),
            aside.display()
        ));
    }
    let mut progress = progress_lines(say);
    let data = match &init {
        Some((dir, meta)) => {
            let tokenizer = checkpoint::load_tokenizer(dir, meta)?;
            TrainingData::open(
                &data_paths,
                &TokenizerChoice::Keep(Box::new(tokenizer.clone())),
                &config,
                Some(&out),
                &mut progress,
            )
            .with_context(|| {
                format!(
                    "cannot fine-tune {} on {}: a fine-tuned model keeps its checkpoint's \
                     tokenizer ({}, {} tokens); remove what it cannot encode from the text, or \
                     train a new model on it without --init-from",
                    dir.display(),
                    show(&data_paths),
                    tokenizer.name(),
                    tokenizer.vocab_size()
                )
            })?
        }
        None => TrainingData::open(
            &data_paths,
            &TokenizerChoice::of(&config),
            &config,
            Some(&out),
            &mut progress,
        )?,
    };
    data.settle(&mut config);
    report_data(&data, say);
    if config.time_budget.seconds().is_some() {
        plan::fit(
            &mut config,
            &req.overrides,
            &data,
            req.started,
            &backend,
            req.ops,
            &out,
            say,
        )?;
    }
    let source = file.map_or("built in".into(), |f| f.display().to_string());
    let planned = if config.time_budget.seconds().is_some() {
        ", with the shape and schedule chosen for the time budget"
    } else {
        ""
    };
    say(format!(
        "configuration ({source}{planned}):\n{}",
        indent(&config.to_toml())
    ));
    write_config(&out, &config)?;
    let trainer = match &init {
        Some((dir, meta)) => Trainer::fine_tune(dir, meta, config, backend, data, out)?,
        None => Trainer::new(config, backend, data, out)?,
    };
    lock.started();
    Ok((trainer.with_ops(req.ops), lock))
}

/// A run's name from its config file's: `configs/tiny_cpu.toml` -> `tiny_cpu`.
fn stem(path: &Path) -> String {
    path.file_stem()
        .map_or("run".into(), |s| s.to_string_lossy().into_owned())
}

/// The `block_size` the config file at `path` sets, if it sets one.
fn config_file_block_size(path: &Path) -> Option<usize> {
    let table: toml::Table = std::fs::read_to_string(path).ok()?.parse().ok()?;
    let value = table.get("block_size")?.as_integer()?;
    usize::try_from(value).ok()
}

/// A run continued from a checkpoint.
fn resume(
    req: &StartRequest,
    from: &Path,
    backend: Backend,
    say: &dyn Fn(String),
) -> anyhow::Result<(Trainer, RunLock)> {
    if checkpoint::is_hugging_face(from) {
        return Err(checkpoint::CheckpointError::NoTrainingState(from.to_path_buf()).into());
    }
    // The run folder: the checkpoint's parent, or the folder named while it has no checkpoint
    // yet (a run just started, which its lock then reports).
    let run = match checkpoint::resolve(from, &[LATEST, BEST]) {
        Ok(dir) => dir
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf),
        Err(_) if from.is_dir() => from.to_path_buf(),
        Err(e) => return Err(e.into()),
    };
    // The run folder is the checkpoint's unless --out says otherwise; lock it before anything.
    let out = req.out.clone().unwrap_or_else(|| run.clone());
    let mut lock = RunLock::acquire(&out)?;
    if !same_folder(&out, &run) {
        lock.clear_for_new_run(false)?;
    }
    // Read after locking: a trainer that held the folder may have written a newer one.
    let dir = checkpoint::resolve(from, &[LATEST, BEST])?;
    let meta = checkpoint::load_meta(&dir)?;
    let mut config = meta.config.clone();
    let changes = apply_on_resume(&req.overrides, &mut config).map_err(anyhow::Error::msg)?;
    config.validate()?;
    if backend.is_cpu() {
        let advice = "resume it where more memory is free (a run keeps its batch and context)";
        crate::memory::check_training(&config, advice)?;
    }
    say(format!(
        "resuming {} at iteration {} of {} (written by cinder {} on {})",
        dir.display(),
        meta.iter,
        config.max_iters,
        meta.cinder_version,
        meta.backend
    ));
    for c in &changes {
        say(format!("  changed on resume: {} = {}", c.field, c.value));
    }
    if meta.iter >= config.max_iters {
        bail!(
            "the checkpoint is already at iteration {} of max_iters {}: pass a larger \
             --max-iters to train longer",
            meta.iter,
            config.max_iters
        );
    }
    let data_paths = if req.data.is_empty() {
        meta.data_paths()
    } else {
        req.data.clone()
    };
    let saved = checkpoint::load_tokenizer(&dir, &meta)?;
    // A character run rebuilds its vocabulary from the text, to compare; a BPE run reads its
    // prepared token files with its own tokenizer.
    let choice = match &saved {
        cinder_data::Tokenizer::Char(_) => TokenizerChoice::New(TokenizerKind::Char),
        other => TokenizerChoice::Keep(Box::new(other.clone())),
    };
    let data = TrainingData::open(
        &data_paths,
        &choice,
        &config,
        Some(&out),
        &mut progress_lines(say),
    )
    .with_context(|| {
        if req.data.is_empty() && data_paths.iter().any(|p| !p.exists()) {
            format!(
                "the run's data {} is gone: if it moved, pass its new path with --data",
                show(&data_paths)
            )
        } else {
            format!("cannot read the run's data {}", show(&data_paths))
        }
    })?;
    if let Some(trained_on) = meta.data_identity
        && data.identity != trained_on
    {
        bail!(
            "{} is not the text this run was trained on: the run read {trained_on}, the file now \
             has {}. Resume with the original text (--data PATH if it moved), or start a new run \
             from these weights on the new text: train --init-from {} --data {} --out NEW_FOLDER",
            show(&data_paths),
            data.identity,
            dir.display(),
            show(&data_paths)
        );
    }
    if data.tokenizer != saved {
        bail!(
            "{} has a different vocabulary ({} {}) from the checkpoint's ({}): resume with the \
             text the run was started on",
            show(&data_paths),
            data.tokenizer.vocab_size(),
            data.tokenizer.unit(),
            saved.vocab_size()
        );
    }
    if meta.data_identity.is_none() {
        say("  this checkpoint predates text checksums: only the vocabulary was checked".into());
    }
    report_data(&data, say);
    let settings = config.clone();
    let trainer = Trainer::resume(&dir, &meta, config, backend, data, out.clone())?;
    // Once the checkpoint has loaded (a folder that fails to resume into stays empty): a run
    // continued elsewhere carries its history (the rows past the checkpoint are dropped as the
    // logs open, as in place), and its settings in effect, with those changed on resume.
    if !same_folder(&out, &run) {
        for name in [names::METRICS, names::SAMPLES] {
            let (from, to) = (run.join(name), out.join(name));
            if from.exists() {
                std::fs::copy(&from, &to).with_context(|| {
                    format!("cannot copy {} to {}", from.display(), to.display())
                })?;
            }
        }
    }
    write_config(&out, &settings)?;
    lock.started();
    Ok((trainer.with_ops(req.ops), lock))
}

/// Writes the run's `config.toml`, the settings it trains with, atomically (`serve` reads it
/// while the run trains).
fn write_config(out: &Path, config: &TrainConfig) -> anyhow::Result<()> {
    let path = out.join(names::CONFIG);
    let tmp = names::tmp(&path);
    std::fs::write(&tmp, config.to_toml())
        .and_then(|()| std::fs::rename(&tmp, &path))
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Whether two paths name the same folder (both exist when this is asked).
fn same_folder(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

fn report_data(data: &TrainingData, say: &dyn Fn(String)) {
    use cinder_data::Split;
    let unit = data.tokenizer.unit();
    say(format!(
        "data: {} ({} {unit}: {} train, {} val; {} tokenizer of {} tokens; {})",
        show(&data.paths),
        data.splits.len(),
        data.tokens(Split::Train),
        data.tokens(Split::Val),
        data.tokenizer.name(),
        data.tokenizer.vocab_size(),
        data.identity
    ));
}

/// Paths for a message, comma-separated.
fn show(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Progress of a long data step (training a BPE, encoding) as a line every tenth.
fn progress_lines(say: &dyn Fn(String)) -> impl FnMut(&str, u64, u64) + '_ {
    let mut last = (String::new(), u64::MAX);
    move |what: &str, done: u64, total: u64| {
        let tenth = (done * 10).checked_div(total).unwrap_or(10);
        if (what, tenth) != (last.0.as_str(), last.1) {
            say(format!("{what}: {}%", tenth * 10));
            last = (what.to_string(), tenth);
        }
    }
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_run_folder_is_the_default_configs() {
        let stem = Path::new(DEFAULT_CONFIG).file_stem().unwrap();
        assert_eq!(Path::new(DEFAULT_RUN), Path::new(RUNS).join(stem));
    }
}
