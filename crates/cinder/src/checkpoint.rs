//! Checkpoints that survive crashes.
//!
//! A checkpoint is a folder: `model.bpk` (weights) and `optimizer.bpk` (AdamW moments and step
//! counts), both in Burn's burnpack format, which keeps parameter ids so the optimizer state
//! lines up with the weights in a new process; and `meta.json`, human-readable, with the format
//! version, the crate version, the backend, the full run configuration, the vocabulary, the
//! iteration, the best validation loss, and the size and CRC-32 of each weights file, so that a
//! truncated or corrupted file is refused by name instead of loading garbage.
//!
//! Writes are atomic: the folder is written beside its target as `.<name>.tmp`, every file and
//! the folder are fsynced, the old checkpoint is renamed to `.<name>.old`, the new one renamed into
//! place, and the old one removed. A crash at any point leaves either the old or the new
//! checkpoint loadable ([`resolve`] falls back to `.<name>.old` when the crash fell between the
//! two renames), and a half-written `.tmp` folder is never taken for a checkpoint.
//!
//! Random streams need no saving: batches and dropout are derived from (seed, iteration).

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use burn::optim::ModuleOptimizer;
use burn::prelude::*;
use burn::store::ModuleRecord;
use burn::tensor::Bytes;
use cinder_data::CharTokenizer;
use cinder_model::Gpt;
use serde::{Deserialize, Serialize};

use crate::config::TrainConfig;

/// The checkpoint layout this build writes; it reads this version and older ones.
pub const FORMAT_VERSION: u32 = 1;
const META: &str = "meta.json";
const MODEL: &str = "model.bpk";
const OPTIMIZER: &str = "optimizer.bpk";

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
}

/// Size and checksum of one file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileSum {
    pub name: String,
    pub bytes: u64,
    pub crc32: u32,
}

/// Everything in a checkpoint besides the tensors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    pub format_version: u32,
    pub cinder_version: String,
    /// Backend the checkpoint was written with (`flex`, `ndarray`, `wgpu`).
    pub backend: String,
    /// Iterations completed: a resumed run continues with this iteration.
    pub iter: u64,
    /// Best validation loss seen so far, if any evaluation ran.
    pub best_val_loss: Option<f32>,
    /// Validation loss of this checkpoint's model at its iteration, if it was evaluated.
    pub val_loss: Option<f32>,
    pub config: TrainConfig,
    pub vocab: CharTokenizer,
    /// The training text, as given to `train`.
    pub data_path: PathBuf,
    pub files: Vec<FileSum>,
}

impl Meta {
    pub fn new(config: &TrainConfig, vocab: &CharTokenizer, backend: &str, iter: u64) -> Self {
        Self {
            format_version: FORMAT_VERSION,
            cinder_version: env!("CARGO_PKG_VERSION").into(),
            backend: backend.into(),
            iter,
            best_val_loss: None,
            val_loss: None,
            config: config.clone(),
            vocab: vocab.clone(),
            data_path: PathBuf::new(),
            files: Vec::new(),
        }
    }
}

/// Writes `model` (and `optim`, for resuming) with `meta` to the folder `dir`, atomically.
pub fn save(
    dir: &Path,
    meta: &Meta,
    model: &Gpt,
    optim: Option<&ModuleOptimizer>,
) -> Result<(), CheckpointError> {
    let model_bytes = model
        .clone()
        .into_record()
        .into_bytes()
        .map_err(|e| write_err(dir, std::io::Error::other(e.to_string())))?;
    let optim_bytes = optim
        .map(|o| o.into_bytes())
        .transpose()
        .map_err(|e| write_err(dir, std::io::Error::other(e.to_string())))?;

    let (tmp, old) = (sibling(dir, "tmp"), sibling(dir, "old"));
    let parent = dir.parent().unwrap_or(Path::new("."));
    let io = |e| write_err(dir, e);
    fs::create_dir_all(parent).map_err(io)?;
    remove_if_present(&tmp).map_err(io)?;
    fs::create_dir(&tmp).map_err(io)?;

    let mut meta = meta.clone();
    meta.files = vec![write_synced(&tmp, MODEL, &model_bytes).map_err(io)?];
    if let Some(bytes) = &optim_bytes {
        meta.files
            .push(write_synced(&tmp, OPTIMIZER, bytes).map_err(io)?);
    }
    let json = serde_json::to_vec_pretty(&meta).expect("metadata always serialises");
    write_synced(&tmp, META, &json).map_err(io)?;
    sync_dir(&tmp).map_err(io)?;

    // Swap: the previous checkpoint stays loadable (as .old) until the new one is in place.
    remove_if_present(&old).map_err(io)?;
    if dir.exists() {
        fs::rename(dir, &old).map_err(io)?;
    }
    fs::rename(&tmp, dir).map_err(io)?;
    sync_dir(parent).map_err(io)?;
    remove_if_present(&old).map_err(io)?;
    Ok(())
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

/// `dir` if it holds a checkpoint, or the previous checkpoint that a crash between the two
/// renames of [`save`] left as `.<name>.old`.
fn checkpoint_at(dir: &Path) -> Option<PathBuf> {
    if dir.join(META).is_file() {
        return Some(dir.to_path_buf());
    }
    let old = sibling(dir, "old");
    old.join(META).is_file().then_some(old)
}

/// Reads and checks `meta.json` of the checkpoint folder `dir`.
pub fn load_meta(dir: &Path) -> Result<Meta, CheckpointError> {
    let path = dir.join(META);
    let bytes = read(&path)?;
    let corrupt = |reason: String| CheckpointError::Corrupt {
        path: path.clone(),
        reason,
    };
    let value: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| corrupt(format!("not valid JSON ({e})")))?;
    let version = value
        .get("format_version")
        .and_then(|v| v.as_u64())
        .ok_or_else(|| corrupt("it has no format_version".into()))?;
    if version > u64::from(FORMAT_VERSION) {
        return Err(CheckpointError::NewerFormat {
            path: dir.to_path_buf(),
            found: version as u32,
        });
    }
    serde_json::from_value(value).map_err(|e| corrupt(e.to_string()))
}

/// Loads the weights of the checkpoint `dir` into a model of the checkpoint's architecture.
pub fn load_model(dir: &Path, meta: &Meta, device: &Device) -> Result<Gpt, CheckpointError> {
    let path = dir.join(MODEL);
    let bytes = read_checked(dir, meta, MODEL)?;
    let corrupt = |reason: String| CheckpointError::Corrupt {
        path: path.clone(),
        reason,
    };
    let model = meta
        .config
        .model(meta.vocab.vocab_size())
        .init(device)
        .map_err(|e| corrupt(format!("its configuration is invalid: {e}")))?;
    let record = ModuleRecord::from_bytes(Bytes::from_bytes_vec(bytes))
        .map_err(|e| corrupt(e.to_string()))?;
    model
        .try_load_record(record)
        .map_err(|e| corrupt(e.to_string()))
}

/// Loads the optimizer state of the checkpoint `dir` into `optim`.
pub fn load_optimizer(
    dir: &Path,
    meta: &Meta,
    optim: ModuleOptimizer,
) -> Result<ModuleOptimizer, CheckpointError> {
    let bytes = read_checked(dir, meta, OPTIMIZER)?;
    optim
        .from_bytes(Bytes::from_bytes_vec(bytes))
        .map_err(|e| CheckpointError::Corrupt {
            path: dir.join(OPTIMIZER),
            reason: e.to_string(),
        })
}

/// The contents of `name`, checked against the size and CRC-32 recorded in `meta`.
fn read_checked(dir: &Path, meta: &Meta, name: &str) -> Result<Vec<u8>, CheckpointError> {
    let path = dir.join(name);
    let Some(sum) = meta.files.iter().find(|f| f.name == name) else {
        return Err(CheckpointError::MissingFile(path));
    };
    let bytes = read(&path)?;
    let reason = if bytes.len() as u64 != sum.bytes {
        format!(
            "it has {} bytes, {} expected (truncated?)",
            bytes.len(),
            sum.bytes
        )
    } else if crc32fast::hash(&bytes) != sum.crc32 {
        "its checksum does not match (the file was changed or corrupted)".into()
    } else {
        return Ok(bytes);
    };
    Err(CheckpointError::Corrupt { path, reason })
}

fn read(path: &Path) -> Result<Vec<u8>, CheckpointError> {
    fs::read(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => CheckpointError::MissingFile(path.to_path_buf()),
        _ => CheckpointError::Read {
            path: path.to_path_buf(),
            source,
        },
    })
}

/// `.<name>.<suffix>` beside `dir`.
fn sibling(dir: &Path, suffix: &str) -> PathBuf {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "checkpoint".into());
    dir.with_file_name(format!(".{name}.{suffix}"))
}

fn write_synced(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<FileSum> {
    let mut file = File::create(dir.join(name))?;
    file.write_all(bytes)?;
    file.sync_all()?;
    Ok(FileSum {
        name: name.into(),
        bytes: bytes.len() as u64,
        crc32: crc32fast::hash(bytes),
    })
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    // Directories can be opened and fsynced on Unix; elsewhere this is a no-op.
    #[cfg(unix)]
    File::open(dir)?.sync_all()?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

fn remove_if_present(dir: &Path) -> std::io::Result<()> {
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn write_err(dir: &Path, source: std::io::Error) -> CheckpointError {
    CheckpointError::Write {
        path: dir.to_path_buf(),
        source,
    }
}
