//! The name of everything cinder writes into a run folder and a checkpoint folder, and of the
//! siblings its atomic writes and `--overwrite` use: the one place these names are spelled.
//!
//! A run folder holds [`LATEST`] and [`BEST`] (checkpoint folders), [`METRICS`], [`SAMPLES`],
//! [`CONFIG`], [`PLOT`], [`LOCK`] and, for a run that prepares its own token files,
//! [`PREPARED`]. A checkpoint folder holds [`META`], [`MODEL`], [`OPTIMIZER`] and, for a BPE model,
//! `tokenizer.json` (`cinder_data::tokenizer::TOKENIZER_JSON`).

use std::path::{Path, PathBuf};

/// The newest checkpoint of a run.
pub const LATEST: &str = "latest";
/// The checkpoint with the lowest validation loss so far.
pub const BEST: &str = "best";
/// The checkpoint of a run folder that the commands reading a run take (`generate`, `evaluate`,
/// `inspect`, `export`, `serve`): its best, else its latest.
pub const READ: [&str; 2] = [BEST, LATEST];
/// One row per logged step (`crate::run::metrics`).
pub const METRICS: &str = "metrics.csv";
/// The run's resolved configuration, written when it starts and when it resumes.
pub const CONFIG: &str = "config.toml";
/// A short text sampled at each evaluation, a JSON object a line (`crate::storage::samples`).
pub const SAMPLES: &str = "samples.jsonl";
/// The loss curve, redrawn at each evaluation.
pub const PLOT: &str = "loss.png";
/// The lock file that keeps a second trainer out (`crate::storage::run_folder`).
pub const LOCK: &str = "train.lock";
/// The folder where a run prepares its token files when it needs them.
pub const PREPARED: &str = "data";
/// The scratch folder where `--time` measures shapes, removed when it is done.
pub const MEASURING: &str = ".measuring";

/// A checkpoint's metadata: configuration, vocabulary, iteration, file sums.
pub const META: &str = "meta.json";
/// A checkpoint's weights.
pub const MODEL: &str = "model.bpk";
/// A checkpoint's optimizer state.
pub const OPTIMIZER: &str = "optimizer.bpk";

/// `.<name>.tmp` beside `path`: where an atomic write builds `path` before renaming it.
pub fn tmp(path: &Path) -> PathBuf {
    hidden_sibling(path, "tmp")
}

/// `.<name>.tmp.png` beside the picture `path`: [`tmp`] for a PNG, whose encoder is chosen by
/// the extension.
pub fn tmp_png(path: &Path) -> PathBuf {
    hidden_sibling(path, "tmp.png")
}

/// `.<name>.old` beside `path`: where a checkpoint write keeps the previous one meanwhile.
pub fn old(path: &Path) -> PathBuf {
    hidden_sibling(path, "old")
}

/// `<dir>.old-<n>` for the first `n` from 1 that does not exist yet: where `--overwrite` moves
/// an old run.
pub fn free_aside(dir: &Path) -> PathBuf {
    let name = file_name(dir, "run");
    (1..)
        .map(|n| dir.with_file_name(format!("{name}.old-{n}")))
        .find(|p| p.symlink_metadata().is_err())
        .expect("some n is free")
}

/// What a run writes into its folder, with the siblings of what it writes atomically: what
/// `--overwrite` moves aside.
pub fn run_entries() -> Vec<String> {
    let mut names = Vec::new();
    for name in [LATEST, BEST, METRICS, SAMPLES] {
        names.push(name.to_string());
        for sibling in [tmp, old] {
            names.push(file_name(&sibling(Path::new(name)), name));
        }
    }
    names.push(file_name(&tmp_png(Path::new(PLOT)), PLOT));
    names.extend([CONFIG, PLOT, PREPARED].map(String::from));
    names
}

fn hidden_sibling(path: &Path, suffix: &str) -> PathBuf {
    let name = file_name(path, "checkpoint");
    path.with_file_name(format!(".{name}.{suffix}"))
}

fn file_name(path: &Path, fallback: &str) -> String {
    path.file_name()
        .map_or_else(|| fallback.into(), |n| n.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn siblings_are_hidden_beside_their_target() {
        let p = Path::new("runs/a/latest");
        assert_eq!(tmp(p), Path::new("runs/a/.latest.tmp"));
        assert_eq!(old(p), Path::new("runs/a/.latest.old"));
        assert!(run_entries().contains(&".metrics.csv.tmp".to_string()));
        assert!(run_entries().contains(&".best.old".to_string()));
    }
}
