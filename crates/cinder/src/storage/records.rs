//! The run's record files, `metrics.csv` and `samples.jsonl`: rewritten whole when a run starts
//! or resumes (keeping the lines up to its checkpoint), then appended to a line at a time.

use std::fs::{self, File, OpenOptions};
use std::path::Path;

use crate::storage::names;

/// Replaces `path` with `text` atomically (written beside it, then renamed: a crash leaves the
/// old file or the new one) and opens it for appending.
pub fn rewrite_for_appending(path: &Path, text: &str) -> std::io::Result<File> {
    let tmp = names::tmp(path);
    fs::write(&tmp, text)?;
    fs::rename(&tmp, path)?;
    OpenOptions::new().append(true).open(path)
}
