//! The run's samples file, `samples.jsonl`: a short text the model writes at each evaluation
//! ([`crate::sampling::sample`]), one JSON object a line (`{"iter":500,"text":"..."}`), so that a
//! reader sees what it learns. A run appends to it as it trains; readers (`serve`'s page) read it
//! at any time, a line cut short by a crash or by a write under way included.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

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

/// A run's samples file, open for appending.
pub struct SamplesFile {
    path: PathBuf,
    file: File,
}

impl SamplesFile {
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

    /// Appends `sample` as its line. One write call per line: a crash cuts at most the last
    /// line short, and [`read`] leaves that line out.
    pub fn append(&mut self, sample: &Sample) -> std::io::Result<()> {
        self.file.write_all(line(sample).as_bytes())
    }
}

/// A sample as its line of the file, newline included.
fn line(sample: &Sample) -> String {
    format!(
        "{}\n",
        serde_json::to_string(sample).expect("a sample serialises")
    )
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

        SamplesFile::open(dir.path(), 200).unwrap();
        assert_eq!(read(&path).unwrap(), [100, 200].map(sample));
        SamplesFile::open(dir.path(), 0).unwrap();
        assert_eq!(read(&path).unwrap(), []);
    }

    #[test]
    fn a_line_that_is_not_a_sample_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SAMPLES);
        fs::write(&path, format!("{}not json\n", line(&sample(1)))).unwrap();
        let err = SamplesFile::open(dir.path(), 5).err().unwrap().to_string();
        assert!(err.contains("line 2"), "{err}");
        assert_eq!(fs::read_to_string(&path).unwrap().lines().count(), 2);
    }
}
