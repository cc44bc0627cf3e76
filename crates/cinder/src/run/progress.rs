//! How `train` shows a run: a progress bar on a terminal, plain log lines elsewhere.

use std::io::IsTerminal;
use std::path::Path;
use std::time::{Duration, Instant};

use cinder_data::Split;
use indicatif::{ProgressBar, ProgressStyle};

use crate::run::report::{EvalReport, Observer, StepReport};

/// How much `train` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verbosity {
    Quiet,
    Normal,
    Verbose,
}

/// Reports a run on the terminal.
pub struct ConsoleObserver {
    bar: Option<ProgressBar>,
    verbosity: Verbosity,
    log_interval: u64,
    started: Instant,
    smoothed: Option<f32>,
    last_val: Option<f32>,
    tokens_per_s: f64,
}

impl ConsoleObserver {
    /// A bar when stderr is a terminal (and not quiet), else log lines every `log_interval`.
    pub fn new(verbosity: Verbosity, start_iter: u64, max_iters: u64, log_interval: u64) -> Self {
        let bar = (verbosity != Verbosity::Quiet && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::new(max_iters).with_position(start_iter);
            bar.set_style(
                ProgressStyle::with_template(
                    "{bar:30.cyan/blue} {pos}/{len} {msg} [{elapsed_precise} < {eta_precise}]",
                )
                .expect("valid template"),
            );
            bar.enable_steady_tick(Duration::from_millis(250));
            bar
        });
        Self {
            bar,
            verbosity,
            log_interval,
            started: Instant::now(),
            smoothed: None,
            last_val: None,
            tokens_per_s: 0.0,
        }
    }

    /// Prints a line above the bar (or plainly).
    pub fn println(&self, line: impl AsRef<str>) {
        match &self.bar {
            Some(bar) => bar.println(line.as_ref()),
            None => println!("{}", line.as_ref()),
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }

    /// Seconds since the observer was made.
    pub fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}

impl Observer for ConsoleObserver {
    fn step(&mut self, s: &StepReport, eval: Option<&EvalReport>) {
        self.smoothed = Some(match self.smoothed {
            Some(prev) => 0.9 * prev + 0.1 * s.loss,
            None => s.loss,
        });
        let tps = s.tokens as f64 / s.seconds.max(1e-9);
        self.tokens_per_s = if self.tokens_per_s == 0.0 {
            tps
        } else {
            0.9 * self.tokens_per_s + 0.1 * tps
        };
        let val = self.last_val.map_or("-".into(), |v| format!("{v:.4}"));
        if let Some(bar) = &self.bar {
            bar.set_position(s.iter + 1);
            bar.set_message(format!(
                "loss {:.4} val {val} lr {:.2e} epoch {:.2} {:.0} tok/s",
                self.smoothed.unwrap_or(s.loss),
                s.lr,
                s.epochs,
                self.tokens_per_s
            ));
        }
        let log_now = self.verbosity == Verbosity::Verbose
            || (self.verbosity == Verbosity::Normal
                && self.bar.is_none()
                && s.iter.is_multiple_of(self.log_interval));
        if log_now {
            self.println(format!(
                "iter {:>6}: loss {:.4}, lr {:.3e}, epoch {:.2}, {:.1} ms, {:.0} tokens/s",
                s.iter,
                s.loss,
                s.lr,
                s.epochs,
                s.seconds * 1e3,
                tps
            ));
        }
        if let Some(e) = eval {
            self.eval(e);
        }
    }

    fn checkpoint(&mut self, kind: &str, path: &Path, iter: u64) {
        if self.verbosity == Verbosity::Verbose {
            self.println(format!(
                "saved {kind} checkpoint at iteration {iter} to {}",
                path.display()
            ));
        }
    }

    fn eval_progress(&mut self, split: Split, done: usize, total: usize) {
        if let Some(bar) = &self.bar {
            bar.set_message(format!("evaluating {} {done}/{total}", split.name()));
        }
    }
}

/// Evaluations in a row with a rising validation loss after which `train` warns of
/// overfitting.
pub const RISES_BEFORE_WARNING: u64 = 3;

impl ConsoleObserver {
    fn eval(&mut self, e: &EvalReport) {
        self.last_val = Some(e.val_loss);
        if self.verbosity != Verbosity::Quiet {
            self.println(format!(
                "step {:>6}: train loss {:.4}, val loss {:.4}{}",
                e.iter,
                e.train_loss,
                e.val_loss,
                if e.improved { " (best so far)" } else { "" }
            ));
        }
        // Once per streak, even when quiet: the run may be wasting its time.
        if e.trend.rises == RISES_BEFORE_WARNING {
            self.println(format!(
                "warning: the validation loss has risen for {RISES_BEFORE_WARNING} evaluations in \
                 a row (now {:.4}, {} evaluations since the best): the model is overfitting its \
                 text. best/ keeps the best weights; a smaller model, --dropout 0.1 or more text \
                 helps, and --early-stop N stops a run after N evaluations without a new best",
                e.val_loss, e.trend.since_best
            ));
        }
    }
}
