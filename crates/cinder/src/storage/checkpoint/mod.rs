//! Checkpoints that survive crashes: what one holds ([`Meta`]), how it is written ([`save`], the
//! atomic protocol below) and read ([`load`] and the `load_*` functions), and which folder a path
//! names ([`resolve`]).
//!
//! A checkpoint is a folder: `model.bpk` (weights) and `optimizer.bpk` (AdamW moments and step
//! counts), both in Burn's burnpack format, which keeps parameter ids so the optimizer state
//! lines up with the weights in a new process; and `meta.json`, human-readable, with the format
//! version, the crate version, the backend, the full run configuration, the vocabulary, the
//! iteration, the best validation loss, and the size and CRC-32 of each weights file, so that a
//! truncated or corrupted file is refused by name instead of loading garbage.
//!
//! Writes are atomic: the folder is written beside its target as `.<name>.tmp` and every file
//! and the folder are fsynced (the moment `checkpoint-written`); the old checkpoint is renamed to
//! `.<name>.old` (`checkpoint-swapped`), the new one renamed into place (`checkpoint-installed`),
//! and the old one removed. A crash at any point leaves either the old or the new checkpoint
//! loadable ([`resolve`] falls back to `.<name>.old` when the crash fell between the two renames),
//! and a half-written `.tmp` folder is never taken for a checkpoint. A write that fails (a full
//! disk) removes its `.tmp` folder and leaves the previous checkpoint as it was.
//!
//! Readers ([`load`]) may run while a trainer writes: one that meets a checkpoint mid-swap (a
//! file renamed away between two reads) tries again.
//!
//! Random streams need no saving: batches and dropout are derived from (seed, iteration).

mod meta;
mod read;
mod write;

use std::path::{Path, PathBuf};

pub use meta::{FORMAT_VERSION, FileSum, Meta, ValTrend};
pub use read::{Loaded, load, load_meta, load_model, load_optimizer, load_tokenizer, load_weights};
pub use write::save;

use crate::storage::hf::{self, HfError};
use crate::storage::names::{self, META};

/// Why a checkpoint could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(
        "cannot write checkpoint {}: {source}; the previous checkpoint there, if any, is intact",
        path.display()
    )]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("checkpoint folder {} does not exist", .0.display())]
    NotFound(PathBuf),
    #[error(
        "{} is not a checkpoint: it has no {META}, and no best/ or latest/ checkpoint inside",
        .0.display()
    )]
    NotACheckpoint(PathBuf),
    #[error("checkpoint file {} is missing", .0.display())]
    MissingFile(PathBuf),
    #[error("cannot read checkpoint file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("checkpoint file {} is damaged: {reason}", path.display())]
    Corrupt { path: PathBuf, reason: String },
    #[error(
        "checkpoint {} has format version {found}, but this cinder reads versions up to \
         {FORMAT_VERSION}: upgrade cinder to load it",
        path.display()
    )]
    NewerFormat { path: PathBuf, found: u32 },
    #[error(
        "{} is a Hugging Face folder: it holds weights but no training state to resume; \
         start a new run from it with --init-from",
        .0.display()
    )]
    NoTrainingState(PathBuf),
    #[error(transparent)]
    Hf(#[from] HfError),
}

/// The checkpoint folder that `path` names: the folder itself if it holds a checkpoint, else its
/// `best/` or (failing that) `latest/` checkpoint, as `generate` and `evaluate` take them.
/// `prefer` orders the two names inside a run folder.
pub fn resolve(path: &Path, prefer: &[&str]) -> Result<PathBuf, CheckpointError> {
    if let Some(dir) = checkpoint_at(path) {
        return Ok(dir);
    }
    if !path.exists() {
        return Err(CheckpointError::NotFound(path.to_path_buf()));
    }
    prefer
        .iter()
        .find_map(|name| checkpoint_at(&path.join(name)))
        .ok_or_else(|| CheckpointError::NotACheckpoint(path.to_path_buf()))
}

/// Whether `dir` is a Hugging Face folder (GPT-2 or NanoChat, see [`hf`]) rather than a checkpoint: the
/// functions here read its weights and tokenizer as a checkpoint's, at iteration 0.
pub fn is_hugging_face(dir: &Path) -> bool {
    !dir.join(META).exists() && hf::is_folder(dir)
}

/// `dir` if it holds a checkpoint (or is a Hugging Face folder), or the previous checkpoint that a
/// crash between the two renames of [`save`] left as `.<name>.old`.
fn checkpoint_at(dir: &Path) -> Option<PathBuf> {
    if dir.join(META).is_file() || is_hugging_face(dir) {
        return Some(dir.to_path_buf());
    }
    let old = names::old(dir);
    old.join(META).is_file().then_some(old)
}
