//! `train`: trains a GPT on a text file, or resumes a run from its checkpoint.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use burn::module::Module;
use cinder::cli::{Overrides, RunOn, exit_on_error};
use cinder::device::Backend;
use cinder::run::metrics::{self, MetricsLog};
use cinder::run::plot::LossPlot;
use cinder::run::progress::{ConsoleObserver, Verbosity};
use cinder::run::samples::SampleLog;
use cinder::run::start::{self, StartRequest};
use cinder::run::trainer::Outcome;
use cinder::storage::names::{self, BEST, LATEST};
use clap::{CommandFactory, FromArgMatches, Parser};

/// Train a GPT on a text file, or resume a run from its checkpoint.
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
    /// Run configuration (TOML); fields it leaves out take the built-in defaults, nanoGPT's
    /// recipe (configs/nanogpt_cpu.toml), so that an old config keeps its meaning [default:
    /// configs/tiny_cpu.toml; with --init-from, nanoGPT's recipe]
    #[arg(long, conflicts_with = "resume")]
    config: Option<PathBuf>,
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
    /// Face folder (GPT-2, NanoChat): fine-tuning. The architecture and vocabulary come from it
    /// (a smaller --block-size crops its context); the training settings from the config and
    /// flags; the optimizer and schedule start afresh [config: init_from]
    #[arg(long, value_name = "CKPT", conflicts_with = "resume")]
    init_from: Option<PathBuf>,
    /// If the run folder already holds a run, move that run aside into <folder>.old-<n>
    /// (never deleted) and start afresh
    #[arg(long, conflicts_with = "resume")]
    overwrite: bool,
    #[command(flatten)]
    run_on: RunOn,
    /// Print only errors and the final summary
    #[arg(long, short, conflicts_with = "verbose")]
    quiet: bool,
    /// Print every step and every checkpoint written
    #[arg(long, short)]
    verbose: bool,
    #[command(flatten)]
    overrides: Overrides,
}

fn ops_description(ops: cinder_model::Ops) -> &'static str {
    match ops {
        cinder_model::Ops::Fused => "cinder's fused CPU kernels, trained by Burn's autodiff",
        cinder_model::Ops::Composite => "Burn's composite operations, trained by Burn's autodiff",
    }
}

fn main() {
    let started = std::time::Instant::now();
    // The config field time_budget's flag is --time (--time-budget too), for a new run only.
    let matches = Args::command()
        .mut_arg("time_budget", |a| {
            a.long("time")
                .visible_alias("time-budget")
                .value_name("DURATION")
                .conflicts_with("resume")
                .long_help(TIME_HELP)
        })
        .get_matches();
    let args = Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    exit_on_error(run(args, started));
}

const TIME_HELP: &str = "Train for this long, start to exit (90s, 10m, 1h): measures this machine \
    briefly, then chooses the model's shape, the steps, the schedule and dropout for this text \
    and this time, and writes them into the run's config.toml. Flags for those fields fix them; \
    --max-iters and --lr-decay-iters cannot go with it [config: time_budget; default: off]";

fn run(args: Args, started: std::time::Instant) -> anyhow::Result<()> {
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
    let backend = Backend::select(args.run_on.device)?;
    say(format!(
        "cinder {}: {}",
        env!("CARGO_PKG_VERSION"),
        backend.describe()
    ));

    let request = StartRequest {
        config: args.config.clone(),
        data: args.data.clone(),
        out: args.out.clone(),
        resume: args.resume.clone(),
        init_from: args.init_from.clone(),
        overwrite: args.overwrite,
        overrides: args.overrides.clone(),
        ops: args.run_on.ops.into(),
        started,
    };
    // Ctrl-C (or SIGTERM) from here on: before training begins (reading the text, training a
    // BPE, measuring for --time) it ends the program at once, saying so; once it has begun, the
    // first finishes the step and saves latest/, and a second ends the program at once.
    let stop = Arc::new(AtomicBool::new(false));
    let training = Arc::new(AtomicBool::new(false));
    let (flag, begun) = (stop.clone(), training.clone());
    ctrlc::set_handler(move || {
        if !begun.load(Ordering::SeqCst) {
            eprintln!("\ninterrupt before training began: stopped, nothing trained or saved");
            std::process::exit(130);
        }
        if flag.swap(true, Ordering::SeqCst) {
            eprintln!("\nsecond interrupt: exiting now (the last checkpoint is intact)");
            std::process::exit(130);
        }
        eprintln!("\ninterrupt: finishing this step and saving latest/ (Ctrl-C again to quit now)");
    })
    .context("cannot install the Ctrl-C handler")?;
    // The lock is held until the process ends.
    let (mut trainer, _lock) = start::open(&request, backend, &say)?;
    say(format!("layers: {}", ops_description(trainer.ops())));
    let (tokens, rows) = (
        trainer.tokenizer().vocab_size(),
        trainer.model().vocab_size(),
    );
    let padded = if rows > tokens {
        format!(" (padded to {rows} in the model)")
    } else {
        String::new()
    };
    say(format!(
        "model: {} parameters, vocabulary {tokens} {}{padded}; run folder {}",
        trainer.model().num_params(),
        trainer.tokenizer().unit(),
        trainer.out_dir().display()
    ));

    let c = trainer.config();
    let out = trainer.out_dir().to_path_buf();
    let console = ConsoleObserver::new(verbosity, trainer.iter(), c.max_iters, c.log_interval);
    let metrics = MetricsLog::open(&out, trainer.iter(), c.log_interval)?;
    let plot = LossPlot {
        metrics: metrics.path().to_path_buf(),
        png: out.join(names::PLOT),
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
    let samples = SampleLog::open(&out, trainer.iter())?;
    let mut observer = (console, (metrics, (plot, samples)));
    let start_iter = trainer.iter();
    training.store(true, Ordering::SeqCst);
    let outcome = trainer.run(&mut observer, &stop);
    let (console, (metrics, (plot, samples))) = observer;
    console.finish();
    let outcome = outcome.context("training failed")?;
    match outcome {
        Outcome::Interrupted { iter } => println!(
            "stopped at iteration {iter}; saved {}. Resume with: train --resume {}",
            out.join(LATEST).display(),
            out.display()
        ),
        Outcome::Finished | Outcome::EarlyStopped { .. } => {
            if let Outcome::EarlyStopped { iter } = outcome {
                println!(
                    "stopped early at iteration {iter} of {}: {} evaluations in a row without a \
                     new best validation loss (early_stop; --resume with a larger --early-stop, \
                     or 0, goes on)",
                    trainer.config().max_iters,
                    trainer.config().early_stop
                );
            }
            let rows = metrics::read(metrics.path()).unwrap_or_default();
            let best = rows
                .iter()
                .filter_map(|r| r.val_loss.map(|v| (v, r.iter)))
                .min_by(|a, b| a.0.total_cmp(&b.0))
                .map_or("-".into(), |(v, i)| format!("{v:.4} at iteration {i}"));
            let iters = trainer.iter() - start_iter;
            let epochs = trainer.epochs();
            println!(
                "done: {iters} iterations in {:.1} s ({} tokens seen, {epochs:.2} epochs of the \
                 training split); best val loss {best}",
                console.elapsed(),
                iters as usize * trainer.config().tokens_per_iter(),
            );
            // (A resumed run's process is only part of the run's wall time.)
            if let Some(budget) = trainer
                .config()
                .time_budget
                .seconds()
                .filter(|_| start_iter == 0)
            {
                let wall = started.elapsed().as_secs_f64();
                println!(
                    "wall time {} of the {} budget ({:.0}%), from start to exit",
                    cinder::run::plan::seconds(wall),
                    trainer.config().time_budget,
                    100.0 * wall / budget
                );
            }
            println!(
                "checkpoints: {} and {}; metrics: {}; loss curve: {}; samples: {}",
                out.join(BEST).display(),
                out.join(LATEST).display(),
                metrics.path().display(),
                plot.png.display(),
                samples.path().display()
            );
        }
    }
    Ok(())
}
