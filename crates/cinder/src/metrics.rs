//! The run's metrics file, `metrics.csv`: one row per logged iteration, appended to on resume.

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use crate::train::{EvalReport, Observer, StepReport};

/// The file's name inside a run folder.
pub const FILE: &str = "metrics.csv";
const HEADER: &str = "iter,train_loss,val_loss,eval_train_loss,lr,tokens_per_s,elapsed_s";

/// One row: the state after `iter` iterations.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Iterations completed.
    pub iter: u64,
    /// Loss of the step that completed this iteration.
    pub train_loss: f32,
    /// Validation loss, where evaluated.
    pub val_loss: Option<f32>,
    /// Loss on the training split measured like the validation loss, where evaluated.
    pub eval_train_loss: Option<f32>,
    pub lr: f64,
    pub tokens_per_s: f64,
    /// Seconds of training since the run began (across resumes).
    pub elapsed_s: f64,
}

impl Row {
    fn to_csv(&self) -> String {
        let opt = |v: Option<f32>| v.map_or(String::new(), |v| v.to_string());
        format!(
            "{},{},{},{},{:.4e},{:.1},{:.3}",
            self.iter,
            self.train_loss,
            opt(self.val_loss),
            opt(self.eval_train_loss),
            self.lr,
            self.tokens_per_s,
            self.elapsed_s
        )
    }

    fn parse(line: &str) -> Option<Self> {
        let f: Vec<&str> = line.split(',').collect();
        let opt = |s: &str| {
            if s.is_empty() {
                Ok(None)
            } else {
                s.parse().map(Some)
            }
        };
        (f.len() == 7).then_some(())?;
        Some(Self {
            iter: f[0].parse().ok()?,
            train_loss: f[1].parse().ok()?,
            val_loss: opt(f[2]).ok()?,
            eval_train_loss: opt(f[3]).ok()?,
            lr: f[4].parse().ok()?,
            tokens_per_s: f[5].parse().ok()?,
            elapsed_s: f[6].parse().ok()?,
        })
    }
}

/// Reads every well-formed row of a metrics file.
pub fn read(path: &Path) -> std::io::Result<Vec<Row>> {
    let file = File::open(path)?;
    Ok(BufReader::new(file)
        .lines()
        .skip(1)
        .map_while(Result::ok)
        .filter_map(|l| Row::parse(&l))
        .collect())
}

/// Appends rows to `metrics.csv` of a run folder as training goes.
pub struct MetricsLog {
    path: PathBuf,
    file: File,
    log_interval: u64,
    /// Elapsed seconds carried over from before a resume.
    offset_s: f64,
    started: std::time::Instant,
}

impl MetricsLog {
    /// Opens the metrics file of `run_dir` for a run at iteration `iter`. Rows beyond `iter`
    /// (logged after the checkpoint a run resumes from) are dropped, so no iteration appears
    /// twice; a new run (`iter` 0) starts the file afresh.
    pub fn open(run_dir: &Path, iter: u64, log_interval: u64) -> std::io::Result<Self> {
        let path = run_dir.join(FILE);
        let kept: Vec<Row> = match read(&path) {
            Ok(rows) if iter > 0 => rows.into_iter().filter(|r| r.iter <= iter).collect(),
            _ => Vec::new(),
        };
        let offset_s = kept.last().map_or(0.0, |r| r.elapsed_s);
        // Rewrite the kept rows atomically, then append.
        let tmp = run_dir.join(format!(".{FILE}.tmp"));
        let mut text = format!("{HEADER}\n");
        for r in &kept {
            text.push_str(&r.to_csv());
            text.push('\n');
        }
        fs::write(&tmp, text)?;
        fs::rename(&tmp, &path)?;
        let file = OpenOptions::new().append(true).open(&path)?;
        Ok(Self {
            path,
            file,
            log_interval,
            offset_s,
            started: std::time::Instant::now(),
        })
    }

    /// Where the rows go.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one row.
    pub fn append(&mut self, row: &Row) -> std::io::Result<()> {
        writeln!(self.file, "{}", row.to_csv())
    }

    /// Seconds since the run began, across resumes.
    pub fn elapsed_s(&self) -> f64 {
        self.offset_s + self.started.elapsed().as_secs_f64()
    }
}

impl Observer for MetricsLog {
    fn step(&mut self, s: &StepReport, eval: Option<&EvalReport>) {
        let iter = s.iter + 1;
        if !iter.is_multiple_of(self.log_interval) && eval.is_none() {
            return;
        }
        let row = Row {
            iter,
            train_loss: s.loss,
            val_loss: eval.map(|e| e.val_loss),
            eval_train_loss: eval.map(|e| e.train_loss),
            lr: s.lr,
            tokens_per_s: s.tokens as f64 / s.seconds.max(1e-9),
            elapsed_s: self.elapsed_s(),
        };
        // Metrics are a record, not the run: a failed write must not stop training.
        if let Err(e) = self.append(&row) {
            eprintln!("warning: cannot append to {}: {e}", self.path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip() {
        let row = Row {
            iter: 250,
            train_loss: 2.5,
            val_loss: Some(2.25),
            eval_train_loss: None,
            lr: 1.25e-3,
            tokens_per_s: 6000.0,
            elapsed_s: 12.5,
        };
        assert_eq!(Row::parse(&row.to_csv()), Some(row));
        assert_eq!(Row::parse("1,2,3"), None);
    }
}
