//! What the web page shows of a model's folder, read from disk at each request, never written:
//! a summary (architecture, iteration, best val, whether a trainer runs it now), its config, its
//! samples, and its metrics read on from where the page last stopped.

use std::path::Path;

use cinder::storage::checkpoint::{self, Meta};
use cinder::storage::names::{BEST, CONFIG, LATEST, METRICS, MODEL, SAMPLES};
use cinder::storage::run_folder::trainer_pid;
use cinder::storage::samples::{self, Sample};
use serde::Serialize;
use serde_json::{Value, json};

/// One model as the runs table lists it.
#[derive(Debug, Serialize)]
pub struct Summary {
    pub id: String,
    /// `run` (a run folder, read at its best/ or latest/) or `checkpoint` (a folder named).
    pub kind: &'static str,
    /// None when the checkpoint cannot be read now (mid-swap, damaged).
    pub arch: Option<Value>,
    /// Iterations of the newest checkpoint.
    pub iter: Option<u64>,
    pub best_val: Option<f32>,
    /// A trainer holds the run's lock now.
    pub training: bool,
}

/// The summary of the model `id`, whose folder is `path`.
pub fn summary(id: &str, path: &Path) -> Summary {
    let is_run = [BEST, LATEST].iter().any(|name| path.join(name).is_dir());
    // The newest checkpoint knows the best val so far; the best one may be older.
    let newest = checkpoint::resolve(path, &[LATEST, BEST]).ok();
    let meta = newest
        .as_deref()
        .and_then(|dir| checkpoint::load_meta(dir).ok());
    let params = newest.as_deref().and_then(approximate_params);
    Summary {
        id: id.to_string(),
        kind: if is_run { "run" } else { "checkpoint" },
        arch: meta.as_ref().map(|m| arch(m, params)),
        iter: meta.as_ref().map(|m| m.iter),
        best_val: meta.as_ref().and_then(|m| m.best_val_loss),
        training: is_run && trainer_pid(path).is_some(),
    }
}

fn arch(meta: &Meta, params: Option<u64>) -> Value {
    let c = &meta.config;
    json!({
        "n_layer": c.n_layer,
        "n_head": c.n_head,
        "n_embd": c.n_embd,
        "block_size": c.block_size,
        "vocab_size": meta.vocab.vocab_size(),
        // What a token is: how the page names a loss's unit, as `evaluate` does.
        "tokenizer": meta.vocab.file().map_or(cinder_data::tokenizer::CHAR, |_| cinder_data::tokenizer::BPE),
        "params": params,
    })
}

/// The weights' size in 4-byte floats: the parameter count to within the file's small header.
fn approximate_params(dir: &Path) -> Option<u64> {
    let bytes = std::fs::metadata(dir.join(MODEL))
        .or_else(|_| std::fs::metadata(dir.join("model.safetensors")))
        .ok()?
        .len();
    Some(bytes / 4)
}

/// The run's `config.toml`, if it has one.
pub fn config(path: &Path) -> Option<String> {
    std::fs::read_to_string(path.join(CONFIG)).ok()
}

/// The run's samples, oldest first (none when it has no samples file or it cannot be read).
pub fn samples(path: &Path) -> Vec<Sample> {
    samples::read(&path.join(SAMPLES)).unwrap_or_default()
}

/// Where a reader of `metrics.csv` stopped: which file (a resume rewrites it, under a new inode)
/// and how far into it. Written `<inode>-<bytes>`; `0` is the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cursor {
    file: u64,
    bytes: u64,
}

impl Cursor {
    pub fn parse(text: &str) -> Option<Self> {
        if text == "0" {
            return Some(Self::default());
        }
        let (file, bytes) = text.split_once('-')?;
        Some(Self {
            file: file.parse().ok()?,
            bytes: bytes.parse().ok()?,
        })
    }
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "{}-{}", self.file, self.bytes)
    }
}

/// The metrics rows written since `from`.
#[derive(Debug, Serialize)]
pub struct MetricsPage {
    /// Where to read on from next time.
    pub offset: String,
    /// The file was rewritten (a resume) or shrank: these rows replace all rows read before.
    pub reset: bool,
    /// The header's names: what each row's numbers are.
    pub columns: Vec<String>,
    /// One row per whole line, empty fields as null.
    pub rows: Vec<Vec<Option<f64>>>,
}

/// The complete lines of `metrics.csv` after `from` (all of them if the file is another than
/// `from`'s, or shorter). A line still being written is left for the next read.
pub fn metrics_since(path: &Path, from: Cursor) -> MetricsPage {
    let bytes = std::fs::read(path.join(METRICS)).unwrap_or_default();
    let file = file_id(&path.join(METRICS));
    let reset =
        from != Cursor::default() && (from.file != file || from.bytes as usize > bytes.len());
    let start = if reset || from == Cursor::default() {
        0
    } else {
        from.bytes as usize
    };
    let end = bytes[start..]
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(start, |at| start + at + 1);
    let text = String::from_utf8_lossy(&bytes[..end]);
    let mut lines = text.lines();
    let columns: Vec<String> = lines
        .next()
        .map(|header| header.split(',').map(String::from).collect())
        .unwrap_or_default();
    let new = String::from_utf8_lossy(&bytes[start..end]);
    let rows = new
        .lines()
        .filter(|line| !line.is_empty() && line.as_bytes()[0].is_ascii_digit())
        .map(|line| line.split(',').map(|f| f.parse().ok()).collect())
        .collect();
    MetricsPage {
        offset: Cursor {
            file,
            bytes: end as u64,
        }
        .to_string(),
        reset,
        columns,
        rows,
    }
}

/// What tells one `metrics.csv` from the next one written in its place.
#[cfg(unix)]
pub(crate) fn file_id(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).map_or(0, |m| m.ino())
}

#[cfg(not(unix))]
pub(crate) fn file_id(path: &Path) -> u64 {
    // No inode: the creation time, where the system keeps one.
    std::fs::metadata(path)
        .and_then(|m| m.created())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "iter,train_loss,val_loss\n";

    #[test]
    fn metrics_are_read_on_from_the_cursor_and_again_when_rewritten() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let write = |text: &str| {
            // As a resume does: a new file renamed over the old one.
            std::fs::write(dir.join("new.csv"), text).unwrap();
            std::fs::rename(dir.join("new.csv"), dir.join(METRICS)).unwrap();
        };
        let append = |text: &str| {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(dir.join(METRICS))
                .unwrap();
            f.write_all(text.as_bytes()).unwrap();
        };
        let page = metrics_since(dir, Cursor::default());
        assert!(page.rows.is_empty() && page.columns.is_empty());

        write(&format!("{HEADER}10,4.5,\n20,4.0,3.9\n30,3.5"));
        let first = metrics_since(dir, Cursor::default());
        assert_eq!(first.columns, ["iter", "train_loss", "val_loss"]);
        assert_eq!(
            first.rows,
            [
                vec![Some(10.0), Some(4.5), None],
                vec![Some(20.0), Some(4.0), Some(3.9)]
            ],
            "the line being written waits"
        );
        assert!(!first.reset);

        append(",\n40,3.0,\n");
        let cursor = Cursor::parse(&first.offset).unwrap();
        let next = metrics_since(dir, cursor);
        assert_eq!(next.columns, ["iter", "train_loss", "val_loss"]);
        assert_eq!(next.rows.len(), 2);
        assert_eq!(next.rows[0], [Some(30.0), Some(3.5), None]);
        assert!(!next.reset);
        let cursor = Cursor::parse(&next.offset).unwrap();
        assert!(metrics_since(dir, cursor).rows.is_empty());

        // A resume from iteration 20 rewrites the file, then appends past the old length.
        write(&format!(
            "{HEADER}10,4.5,\n20,4.0,3.9\n30,3.6,\n40,3.1,\n50,2.9,2.8\n"
        ));
        let again = metrics_since(dir, cursor);
        assert!(again.reset);
        assert_eq!(again.rows.len(), 5);
        assert_eq!(again.rows[2], [Some(30.0), Some(3.6), None]);

        // A file that shrank in place is read again too.
        let cursor = Cursor::parse(&again.offset).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join(METRICS))
            .unwrap()
            .set_len(HEADER.len() as u64)
            .unwrap();
        let shrunk = metrics_since(dir, cursor);
        assert!(shrunk.reset && shrunk.rows.is_empty());
    }

    #[test]
    fn cursors_round_trip_and_nonsense_is_refused() {
        let c = Cursor { file: 7, bytes: 42 };
        assert_eq!(Cursor::parse(&c.to_string()), Some(c));
        assert_eq!(Cursor::parse("0"), Some(Cursor::default()));
        for bad in ["", "x", "1-", "-1", "1-2-3", "../etc"] {
            assert_eq!(Cursor::parse(bad), None, "{bad}");
        }
    }
}
