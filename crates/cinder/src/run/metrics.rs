//! The run's metrics file, `metrics.csv`: one row per logged iteration, appended to on resume.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::run::report::{EvalReport, Observer, StepReport};
use crate::storage::names::METRICS;
use crate::storage::records;

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

/// Why a metrics file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{}, line {line}, is not a metrics row (`{text}`): fix or delete that line, or move the \
         file aside to start its history afresh",
        path.display()
    )]
    BadLine {
        path: PathBuf,
        line: usize,
        text: String,
    },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Reads every row of a metrics file (none if it does not exist). A last line without its
/// newline is a row cut short by a crash, and is left out; any other line that is not a row is
/// an error naming it.
pub fn read(path: &Path) -> Result<Vec<Row>, MetricsError> {
    let text = match fs::read(path) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(MetricsError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let complete = match text.rfind('\n') {
        Some(end) => &text[..end],
        None => "", // not even the header is whole
    };
    let mut rows = Vec::new();
    for (i, line) in complete.lines().enumerate() {
        let bad = || MetricsError::BadLine {
            path: path.to_path_buf(),
            line: i + 1,
            text: line.chars().take(80).collect(),
        };
        if i == 0 {
            if line != HEADER {
                return Err(bad());
            }
            continue;
        }
        rows.push(Row::parse(line).ok_or_else(bad)?);
    }
    Ok(rows)
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
    /// twice; a new run (`iter` 0) starts the file afresh. A file that cannot be read is an
    /// error, not a reason to drop its history.
    pub fn open(run_dir: &Path, iter: u64, log_interval: u64) -> Result<Self, MetricsError> {
        let path = run_dir.join(METRICS);
        let kept: Vec<Row> = read(&path)?
            .into_iter()
            .filter(|r| r.iter <= iter)
            .collect();
        let offset_s = kept.last().map_or(0.0, |r| r.elapsed_s);
        let mut text = format!("{HEADER}\n");
        for r in &kept {
            text.push_str(&r.to_csv());
            text.push('\n');
        }
        let write_err = |source| MetricsError::Write {
            path: path.clone(),
            source,
        };
        let file = records::rewrite_for_appending(&path, &text).map_err(write_err)?;
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
        // One write call per row, newline included: a crash cuts at most the last row short.
        self.file
            .write_all(format!("{}\n", row.to_csv()).as_bytes())
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

    fn row(iter: u64) -> Row {
        Row {
            iter,
            train_loss: 2.0,
            val_loss: None,
            eval_train_loss: None,
            lr: 1e-3,
            tokens_per_s: 100.0,
            elapsed_s: iter as f64,
        }
    }

    #[test]
    fn resume_keeps_rows_up_to_its_iteration_and_drops_a_row_cut_short() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = MetricsLog::open(dir.path(), 0, 1).unwrap();
        for i in 1..=4 {
            log.append(&row(i)).unwrap();
        }
        // A crash mid-write leaves half a row.
        log.file.write_all(b"5,2.0,,").unwrap();
        drop(log);
        let path = dir.path().join(METRICS);
        assert_eq!(read(&path).unwrap().len(), 4);
        let mut log = MetricsLog::open(dir.path(), 3, 1).unwrap();
        log.append(&row(4)).unwrap();
        let iters: Vec<u64> = read(&path).unwrap().iter().map(|r| r.iter).collect();
        assert_eq!(iters, vec![1, 2, 3, 4]);
    }

    #[test]
    fn a_damaged_file_is_refused_with_its_line_not_emptied() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(METRICS);
        let text = format!(
            "{HEADER}\n{}\nthis is not a row\n{}\n",
            row(1).to_csv(),
            row(2).to_csv()
        );
        fs::write(&path, &text).unwrap();
        let err = MetricsLog::open(dir.path(), 2, 1)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("metrics.csv, line 3"), "{err}");
        assert!(
            err.contains("this is not a row") && err.contains("move the file aside"),
            "{err}"
        );
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            text,
            "the file is untouched"
        );

        fs::write(&path, "time,loss\n1,2\n").unwrap();
        let err = MetricsLog::open(dir.path(), 2, 1)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("line 1"), "{err}");
    }
}
