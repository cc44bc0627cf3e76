//! Each evaluation's sample, appended to the run's samples file ([`crate::storage::samples`]).

use std::path::Path;

use crate::run::report::{EvalReport, Observer, StepReport};
use crate::storage::samples::{Sample, SamplesError, SamplesFile};

/// Appends each evaluation's sample to `samples.jsonl` of a run folder.
pub struct SampleLog(SamplesFile);

impl SampleLog {
    /// Opens the samples file of `run_dir` for a run at iteration `iter`
    /// ([`SamplesFile::open`]: samples after `iter` are dropped).
    pub fn open(run_dir: &Path, iter: u64) -> Result<Self, SamplesError> {
        SamplesFile::open(run_dir, iter).map(Self)
    }

    /// Where the samples go.
    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Observer for SampleLog {
    fn step(&mut self, _s: &StepReport, eval: Option<&EvalReport>) {
        let Some((e, text)) = eval.and_then(|e| Some((e, e.sample.clone()?))) else {
            return;
        };
        // Samples are a record, not the run: a failed write must not stop training.
        if let Err(err) = self.0.append(&Sample { iter: e.iter, text }) {
            eprintln!("warning: cannot append to {}: {err}", self.path().display());
        }
    }
}
