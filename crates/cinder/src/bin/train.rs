//! `train`: trains a GPT on a text file, or resumes a run from its checkpoint.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, bail};
use burn::module::Module;
use cinder::checkpoint;
use cinder::cli::{OpsArg, Overrides, adopt_architecture, apply_on_resume, exit_on_error};
use cinder::config::TrainConfig;
use cinder::data::{TokenizerChoice, TrainingData};
use cinder::device::{Backend, DeviceChoice};
use cinder::metrics::{self, MetricsLog};
use cinder::plot::LossPlot;
use cinder::progress::{ConsoleObserver, Verbosity};
use cinder::run_folder::{self, RunLock};
use cinder::train::{BEST, LATEST, Outcome, Trainer};
use clap::Parser;

const DEFAULT_CONFIG: &str = "configs/tiny_cpu.toml";
const DEFAULT_DATA: &str = "data/tinyshakespeare.txt";

/// Train a character-level GPT on a text file, or resume a run from its checkpoint.
///
/// With no arguments: trains configs/tiny_cpu.toml on data/tinyshakespeare.txt and writes
/// checkpoints/tiny_cpu/ (best/ and latest/). Ctrl-C stops after the current step and saves
/// latest/; a second Ctrl-C exits at once.
///
/// One train process at a time uses a run folder (it holds a lock on train.lock inside). A new
/// run never replaces an old one silently: a folder that holds a run is refused unless
/// --overwrite moves the old run aside. A resumed run checks that its text is the one it was
/// trained on.
#[derive(Debug, Parser)]
#[command(version, about, long_about)]
struct Args {
    /// Run configuration (TOML); fields it leaves out take the built-in tiny_cpu values
    #[arg(long, default_value = DEFAULT_CONFIG, conflicts_with = "resume")]
    config: PathBuf,
    /// Training data: UTF-8 text files, folders of .txt files (documents), or a folder made by
    /// `prepare` [default: data/tinyshakespeare.txt, or the resumed run's data]
    #[arg(long, num_args = 1.., value_name = "PATH")]
    data: Vec<PathBuf>,
    /// Run folder for checkpoints [default: checkpoints/<config file name>, or the resumed run's]
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue the run in this run folder (its latest/) or checkpoint folder
    #[arg(long, value_name = "DIR")]
    resume: Option<PathBuf>,
    /// Start a new run from the weights of this checkpoint, run folder (its best/) or Hugging
    /// Face GPT-2 folder: fine-tuning. The architecture and vocabulary come from it (a smaller
    /// --block-size crops its context); the training settings from the config and flags; the
    /// optimizer and schedule start afresh [config: init_from]
    #[arg(long, value_name = "CKPT", conflicts_with = "resume")]
    init_from: Option<PathBuf>,
    /// If the run folder already holds a run, move that run aside into <folder>.old-<n>
    /// (never deleted) and start afresh
    #[arg(long, conflicts_with = "resume")]
    overwrite: bool,
    /// Where to run
    #[arg(long, value_enum, default_value_t)]
    device: DeviceChoice,
    /// Which layers run: cinder's fused CPU kernels (on the flex backend) or Burn's composite
    /// operations
    #[arg(long, value_enum, default_value_t)]
    ops: OpsArg,
    /// Print only errors and the final summary
    #[arg(long, short, conflicts_with = "verbose")]
    quiet: bool,
    /// Print every step and every checkpoint written
    #[arg(long, short)]
    verbose: bool,
    #[command(flatten)]
    overrides: Overrides,
}

fn ops_description(name: &str) -> &'static str {
    match name {
        "fused" => "cinder's fused CPU kernels, trained by Burn's autodiff",
        _ => "Burn's composite operations, trained by Burn's autodiff",
    }
}

fn main() {
    exit_on_error(run(Args::parse()));
}

fn run(args: Args) -> anyhow::Result<()> {
    let verbosity = match (args.quiet, args.verbose) {
        (true, _) => Verbosity::Quiet,
        (_, true) => Verbosity::Verbose,
        _ => Verbosity::Normal,
    };
    let say = |line: String| {
        if verbosity != Verbosity::Quiet {
            println!("{line}");
        }
    };
    let backend = Backend::select(args.device)?;
    say(format!(
        "cinder {}: {}",
        env!("CARGO_PKG_VERSION"),
        backend.describe()
    ));

    // The lock is held until the process ends.
    let (trainer, _lock) = match &args.resume {
        Some(from) => resume(&args, from, backend, &say)?,
        None => start(&args, backend, &say)?,
    };
    let mut trainer = trainer.with_ops(args.ops.into());
    say(format!("layers: {}", ops_description(trainer.ops_name())));
    let (tokens, rows) = (trainer.tokenizer.vocab_size(), trainer.model().vocab_size());
    let padded = if rows > tokens {
        format!(" (padded to {rows} in the model)")
    } else {
        String::new()
    };
    say(format!(
        "model: {} parameters, vocabulary {tokens} {}{padded}; run folder {}",
        trainer.model().num_params(),
        trainer.tokenizer.unit(),
        trainer.out_dir.display()
    ));

    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc::set_handler(move || {
        if flag.swap(true, Ordering::SeqCst) {
            eprintln!("\nsecond interrupt: exiting now (the last checkpoint is intact)");
            std::process::exit(130);
        }
        eprintln!("\ninterrupt: finishing this step and saving latest/ (Ctrl-C again to quit now)");
    })
    .context("cannot install the Ctrl-C handler")?;

    let c = &trainer.config;
    let out = trainer.out_dir.clone();
    let console = ConsoleObserver::new(verbosity, trainer.iter, c.max_iters, c.log_interval);
    let metrics = MetricsLog::open(&out, trainer.iter, c.log_interval)?;
    let plot = LossPlot {
        metrics: metrics.path().to_path_buf(),
        png: out.join(run_folder::PLOT),
        title: format!(
            "cinder {}: {} layers, {} heads, {} wide, context {}",
            out.file_name()
                .map_or("run".into(), |n| n.to_string_lossy()),
            c.n_layer,
            c.n_head,
            c.n_embd,
            c.block_size
        ),
    };
    let mut observer = (console, (metrics, plot));
    let start_iter = trainer.iter;
    let outcome = trainer.run(&mut observer, &stop);
    let (console, (metrics, plot)) = observer;
    console.finish();
    let outcome = outcome.context("training failed")?;
    match outcome {
        Outcome::Interrupted { iter } => println!(
            "stopped at iteration {iter}; saved {}. Resume with: train --resume {}",
            out.join(LATEST).display(),
            out.display()
        ),
        Outcome::Finished => {
            let rows = metrics::read(metrics.path()).unwrap_or_default();
            let best = rows
                .iter()
                .filter_map(|r| r.val_loss.map(|v| (v, r.iter)))
                .min_by(|a, b| a.0.total_cmp(&b.0))
                .map_or("-".into(), |(v, i)| format!("{v:.4} at iteration {i}"));
            let iters = trainer.iter - start_iter;
            println!(
                "done: {iters} iterations in {:.1} s ({} tokens seen); best val loss {best}",
                console.elapsed(),
                iters as usize * trainer.config.tokens_per_iter(),
            );
            println!(
                "checkpoints: {} and {}; metrics: {}; loss curve: {}",
                out.join(cinder::train::BEST).display(),
                out.join(LATEST).display(),
                metrics.path().display(),
                plot.png.display()
            );
        }
    }
    Ok(())
}

/// A new run from the config file and flags, or from a checkpoint's weights (`--init-from`).
fn start(
    args: &Args,
    backend: Backend,
    say: &dyn Fn(String),
) -> anyhow::Result<(Trainer, RunLock)> {
    let mut config = if args.config == Path::new(DEFAULT_CONFIG) && !args.config.exists() {
        say(format!(
            "{DEFAULT_CONFIG} not found: using the built-in tiny_cpu configuration"
        ));
        TrainConfig::default()
    } else {
        TrainConfig::load(&args.config)?
    };
    args.overrides.apply(&mut config);
    if let Some(from) = &args.init_from {
        config.init_from = Some(from.clone());
    }
    let name = args
        .config
        .file_stem()
        .map_or("run".into(), |s| s.to_string_lossy().into_owned());
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| Path::new("checkpoints").join(name));
    let data_paths = if args.data.is_empty() {
        vec![PathBuf::from(DEFAULT_DATA)]
    } else {
        args.data.clone()
    };

    // The checkpoint to start from, if any, gives the architecture and the vocabulary.
    let init = match &config.init_from {
        Some(from) => {
            let dir = checkpoint::resolve(from, &[BEST, LATEST])
                .with_context(|| format!("cannot start from {}", from.display()))?;
            let meta = checkpoint::load_meta(&dir)?;
            // A block size given by a flag or the config file may crop the model's context.
            let crop_to = args
                .overrides
                .block_size
                .or(config_file_block_size(&args.config));
            adopt_architecture(&args.overrides, &mut config, &meta.config, crop_to)
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

    let lock = RunLock::acquire(&out)?;
    // Refuse an old run (or move it aside) before the data is read: a BPE run prepares its
    // token files in the run folder.
    if let Some(aside) = lock.clear_for_new_run(args.overwrite)? {
        say(format!(
            "moved the old run in {} aside into {}",
            out.display(),
            aside.display()
        ));
    }
    say(format!(
        "configuration ({}):\n{}",
        args.config.display(),
        indent(&config.to_toml())
    ));
    let mut progress = progress_lines(say);
    let data = match &init {
        Some((dir, meta)) => {
            let tokenizer = checkpoint::load_tokenizer(dir, meta)?;
            TrainingData::open(
                &data_paths,
                Some(&tokenizer),
                &TokenizerChoice::of(&config),
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
            None,
            &TokenizerChoice::of(&config),
            &config,
            Some(&out),
            &mut progress,
        )?,
    };
    report_data(&data, say);
    let config_path = out.join(run_folder::CONFIG);
    std::fs::write(&config_path, config.to_toml())
        .with_context(|| format!("cannot write {}", config_path.display()))?;
    let trainer = match &init {
        Some((dir, meta)) => Trainer::fine_tune(dir, meta, config, backend, data, out)?,
        None => Trainer::new(config, backend, data, out)?,
    };
    Ok((trainer, lock))
}

/// The `block_size` the config file at `path` sets, if it sets one.
fn config_file_block_size(path: &Path) -> Option<usize> {
    let table: toml::Table = std::fs::read_to_string(path).ok()?.parse().ok()?;
    let value = table.get("block_size")?.as_integer()?;
    usize::try_from(value).ok()
}

/// A run continued from a checkpoint.
fn resume(
    args: &Args,
    from: &Path,
    backend: Backend,
    say: &dyn Fn(String),
) -> anyhow::Result<(Trainer, RunLock)> {
    if checkpoint::is_gpt2(from) {
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
    let out = args.out.clone().unwrap_or_else(|| run.clone());
    let lock = RunLock::acquire(&out)?;
    if !same_folder(&out, &run) {
        lock.clear_for_new_run(false)?;
    }
    // Read after locking: a trainer that held the folder may have written a newer one.
    let dir = checkpoint::resolve(from, &[LATEST, BEST])?;
    let meta = checkpoint::load_meta(&dir)?;
    let mut config = meta.config.clone();
    let changes = apply_on_resume(&args.overrides, &mut config).map_err(anyhow::Error::msg)?;
    config.validate()?;
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
    let data_paths = if args.data.is_empty() {
        meta.data_paths()
    } else {
        args.data.clone()
    };
    let saved = checkpoint::load_tokenizer(&dir, &meta)?;
    // A character run rebuilds its vocabulary from the text, to compare; a BPE run reads its
    // prepared token files with its own tokenizer.
    let imposed = match &saved {
        cinder_data::Tokenizer::Char(_) => None,
        other => Some(other),
    };
    let data = TrainingData::open(
        &data_paths,
        imposed,
        &TokenizerChoice::Char,
        &config,
        Some(&out),
        &mut progress_lines(say),
    )
    .with_context(|| {
        if args.data.is_empty() && data_paths.iter().any(|p| !p.exists()) {
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
    let trainer = Trainer::resume(&dir, &meta, config, backend, data, out)?;
    Ok((trainer, lock))
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
