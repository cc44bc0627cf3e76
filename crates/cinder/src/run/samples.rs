//! The run's samples file, `samples.jsonl`: a short text the model writes at each evaluation, one
//! JSON object a line (`{"iter":500,"text":"..."}`), so that a reader sees what it learns.
//!
//! The text comes from the same sampler as `generate` (its default prompt and temperature, the
//! run's seed), after the evaluation, on its own random stream: the run's losses do not change.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use burn::prelude::*;
use cinder_data::Tokenizer;
use cinder_model::Gpt;
use serde::{Deserialize, Serialize};

use crate::run::trainer::{EvalReport, Observer, StepReport};
use crate::sampling::generate::{GenerateOptions, generate};
use crate::sampling::{DEFAULT_PROMPT, DEFAULT_TEMPERATURE, DEFAULT_TOP_K, SamplingParams};
use crate::storage::names::SAMPLES;
use crate::storage::records;

/// One line of `samples.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Iterations completed when it was written.
    pub iter: u64,
    /// The prompt and what the model wrote after it.
    pub text: String,
}

/// A samples file that could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum SamplesError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} line {line} is not a sample: {message}", path.display())]
    Parse {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// `tokens` tokens of `model` after `generate`'s default prompt, with its default temperature
/// and top-k and with `seed`: the text `generate --seed <seed> --max-new-tokens <tokens>` prints.
pub fn sample(
    model: &Gpt,
    tokenizer: &Tokenizer,
    tokens: usize,
    seed: u64,
    device: &Device,
) -> String {
    // A vocabulary without the prompt's newline starts from its first token.
    let prompt = tokenizer
        .encode(DEFAULT_PROMPT)
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| vec![0]);
    let opts = GenerateOptions {
        max_new_tokens: tokens,
        num_samples: 1,
        sampling: SamplingParams {
            temperature: DEFAULT_TEMPERATURE,
            top_k: Some(DEFAULT_TOP_K),
            top_p: None,
        },
        seed,
        use_cache: true,
        tokens: tokenizer.vocab_size(),
    };
    let new = generate(model, &prompt, &opts, device, |_, _| {});
    let mut all = prompt;
    all.extend(&new[0]);
    tokenizer.decode(&all)
}

/// Every sample of a samples file, in order; none if there is no file. A last line cut short
/// (by a crash while it was written) is left out.
pub fn read(path: &Path) -> Result<Vec<Sample>, SamplesError> {
    let text = match fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(SamplesError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, line)| {
            serde_json::from_str(line).map_err(|e| SamplesError::Parse {
                path: path.to_path_buf(),
                line: i + 1,
                message: e.to_string(),
            })
        })
        .collect()
}

/// Appends each evaluation's sample to `samples.jsonl` of a run folder.
pub struct SampleLog {
    path: PathBuf,
    file: File,
}

impl SampleLog {
    /// Opens the samples file of `run_dir` for a run at iteration `iter`. As with the metrics
    /// file, samples beyond `iter` (written after the checkpoint a run resumes from) are dropped,
    /// and a new run (`iter` 0) starts the file afresh.
    pub fn open(run_dir: &Path, iter: u64) -> Result<Self, SamplesError> {
        let path = run_dir.join(SAMPLES);
        let kept: Vec<Sample> = read(&path)?
            .into_iter()
            .filter(|s| s.iter <= iter && iter > 0)
            .collect();
        let write_err = |source| SamplesError::Write {
            path: path.clone(),
            source,
        };
        let text: String = kept.iter().map(line).collect();
        let file = records::rewrite_for_appending(&path, &text).map_err(write_err)?;
        Ok(Self { path, file })
    }

    /// Where the samples go.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A sample as its line of the file, newline included.
fn line(sample: &Sample) -> String {
    format!(
        "{}\n",
        serde_json::to_string(sample).expect("a sample serialises")
    )
}

impl Observer for SampleLog {
    fn step(&mut self, _s: &StepReport, eval: Option<&EvalReport>) {
        let Some((e, text)) = eval.and_then(|e| Some((e, e.sample.clone()?))) else {
            return;
        };
        let sample = Sample { iter: e.iter, text };
        // Samples are a record, not the run: a failed write must not stop training. One write
        // call per line: a crash cuts at most the last line short.
        if let Err(err) = self.file.write_all(line(&sample).as_bytes()) {
            eprintln!("warning: cannot append to {}: {err}", self.path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(iter: u64) -> Sample {
        Sample {
            iter,
            text: format!("\"quoted\"\nline {iter} é"),
        }
    }

    #[test]
    fn resume_keeps_samples_up_to_its_iteration_and_drops_a_line_cut_short() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SAMPLES);
        let mut text: String = [100, 200, 300].map(sample).iter().map(line).collect();
        text.push_str("{\"iter\":40"); // a crash while writing
        fs::write(&path, text).unwrap();
        assert_eq!(read(&path).unwrap(), [100, 200, 300].map(sample));

        SampleLog::open(dir.path(), 200).unwrap();
        assert_eq!(read(&path).unwrap(), [100, 200].map(sample));
        SampleLog::open(dir.path(), 0).unwrap();
        assert_eq!(read(&path).unwrap(), []);
    }

    #[test]
    fn a_line_that_is_not_a_sample_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SAMPLES);
        fs::write(&path, format!("{}not json\n", line(&sample(1)))).unwrap();
        let err = SampleLog::open(dir.path(), 5).err().unwrap().to_string();
        assert!(err.contains("line 2"), "{err}");
        assert_eq!(fs::read_to_string(&path).unwrap().lines().count(), 2);
    }
}
