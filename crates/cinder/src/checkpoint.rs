//! Checkpoints that survive crashes.
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

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use burn::optim::ModuleOptimizer;
use burn::prelude::*;
use burn::store::ModuleRecord;
use burn::tensor::Bytes;
use cinder_data::tokenizer::{TOKENIZER_JSON, TokenizerRecord};
use cinder_data::{TextIdentity, Tokenizer};
use cinder_model::{Gpt, GptConfig};
use serde::{Deserialize, Serialize};

use crate::config::TrainConfig;
use crate::faults;
use crate::gpt2::{self, Gpt2Error};

/// The checkpoint layout this build writes; it reads this version and older ones.
/// Version 2 added `data_identity`; version 3 BPE tokenizers (`vocab` naming `tokenizer.json`)
/// and `data_paths`.
pub const FORMAT_VERSION: u32 = 3;
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
    #[error(
        "{} is a Hugging Face GPT-2 folder: it holds weights but no training state to resume; \
         start a new run from it with --init-from",
        .0.display()
    )]
    NoTrainingState(PathBuf),
    #[error(transparent)]
    Gpt2(#[from] Gpt2Error),
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
    /// The tokenizer: the characters inline, or a BPE in `tokenizer.json` beside.
    pub vocab: TokenizerRecord,
    /// The training text (the first, where there are several), as given to `train`.
    pub data_path: PathBuf,
    /// Every path of the training data (text files, folders, or a prepared folder); absent
    /// before version 3, where `data_path` is the one text.
    #[serde(default)]
    pub data_paths: Vec<PathBuf>,
    /// Size and checksum of the training text when the run read it (absent before version 2).
    #[serde(default)]
    pub data_identity: Option<TextIdentity>,
    pub files: Vec<FileSum>,
}

impl Meta {
    pub fn new(config: &TrainConfig, tokenizer: &Tokenizer, backend: &str, iter: u64) -> Self {
        Self {
            format_version: FORMAT_VERSION,
            cinder_version: env!("CARGO_PKG_VERSION").into(),
            backend: backend.into(),
            iter,
            best_val_loss: None,
            val_loss: None,
            config: config.clone(),
            vocab: tokenizer.record(),
            data_path: PathBuf::new(),
            data_paths: Vec::new(),
            data_identity: None,
            files: Vec::new(),
        }
    }

    /// The training data's paths, as the run was given them.
    /// None for a GPT-2 folder.
    pub fn data_paths(&self) -> Vec<PathBuf> {
        if self.data_paths.is_empty() && self.data_path.as_os_str().is_empty() {
            Vec::new()
        } else if self.data_paths.is_empty() {
            vec![self.data_path.clone()]
        } else {
            self.data_paths.clone()
        }
    }
}

/// Writes `model` (and `optim`, for resuming) with `meta` and `tokenizer` (the one `meta.vocab`
/// records) to the folder `dir`, atomically.
pub fn save(
    dir: &Path,
    meta: &Meta,
    tokenizer: &Tokenizer,
    model: &Gpt,
    optim: Option<&ModuleOptimizer>,
) -> Result<(), CheckpointError> {
    // The weights and the optimizer state are each serialised straight into their file when
    // their turn comes, so that only one copy of one of them is in memory at a time.
    let record_err = |e: burn::store::RecordError| std::io::Error::other(e.to_string());
    let tokenizer_json = tokenizer.file_json();
    let mut files: Vec<(&str, Content)> = vec![(
        MODEL,
        Content::Written(Box::new(move |path: &Path| {
            model.clone().into_record().save(path).map_err(record_err)
        })),
    )];
    if let Some(optim) = optim {
        files.push((
            OPTIMIZER,
            Content::Written(Box::new(move |path: &Path| {
                optim.to_record().save(path).map_err(record_err)
            })),
        ));
    }
    if let Some(json) = &tokenizer_json {
        files.push((TOKENIZER_JSON, Content::Bytes(json.as_bytes())));
    }
    write_atomically(dir, meta, files, &mut |moment| {
        faults::reached(moment.name());
        Ok(())
    })
    .map_err(|e| write_err(dir, e))
}

/// The moments of a checkpoint write after which a crash leaves a different state on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Moment {
    /// `.<name>.tmp` is complete and synced; nothing else has changed.
    Written,
    /// The previous checkpoint, if any, is `.<name>.old`; the new one is still `.tmp`.
    Swapped,
    /// The new checkpoint is in place; `.<name>.old` is not yet removed.
    Installed,
}

impl Moment {
    fn name(self) -> &'static str {
        match self {
            Moment::Written => "checkpoint-written",
            Moment::Swapped => "checkpoint-swapped",
            Moment::Installed => "checkpoint-installed",
        }
    }
}

/// What one file of a checkpoint holds.
enum Content<'a> {
    Bytes(&'a [u8]),
    /// Written by the function, given the file's path.
    Written(WriteFile<'a>),
}

/// Writes a file at the path it is given.
type WriteFile<'a> = Box<dyn FnOnce(&Path) -> std::io::Result<()> + 'a>;

/// Writes `files` and `meta` (with the files' sums) into `dir` through `.<name>.tmp` and the
/// swap described in the module docs, calling `at` at each [`Moment`]: an error there stops the
/// write as a crash would (no clean-up), which is how the tests crash it.
fn write_atomically(
    dir: &Path,
    meta: &Meta,
    files: Vec<(&str, Content)>,
    at: &mut dyn FnMut(Moment) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let (tmp, old) = (sibling(dir, "tmp"), sibling(dir, "old"));
    let parent = dir.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(parent)?;
    remove_if_present(&tmp)?;
    fs::create_dir(&tmp)?;
    let written = (|| {
        let mut meta = meta.clone();
        meta.files = files
            .into_iter()
            .map(|(name, content)| match content {
                Content::Bytes(bytes) => write_synced(&tmp, name, bytes),
                Content::Written(write) => {
                    write(&tmp.join(name))?;
                    seal(&tmp, name)
                }
            })
            .collect::<std::io::Result<_>>()?;
        let json = serde_json::to_vec_pretty(&meta).expect("metadata always serialises");
        write_synced(&tmp, META, &json)?;
        sync_dir(&tmp)
    })();
    if let Err(e) = written {
        // A full disk, say: free what was written; the previous checkpoint is untouched.
        let _ = remove_if_present(&tmp);
        return Err(e);
    }
    at(Moment::Written)?;

    // Swap. Whichever of `dir` and `.old` holds the valid checkpoint is kept until the new one
    // is in place: `.old` is removed before `dir` moves onto it only when `dir` is valid, and
    // after a crash between the renames (`dir` gone, `.old` the only checkpoint) it stays.
    if dir.join(META).is_file() {
        remove_if_present(&old)?;
        fs::rename(dir, &old)?;
    } else if dir.exists() {
        return Err(std::io::Error::other(format!(
            "{} exists but holds no checkpoint ({META} is missing): move it away",
            dir.display()
        )));
    }
    at(Moment::Swapped)?;
    fs::rename(&tmp, dir)?;
    sync_dir(parent)?;
    at(Moment::Installed)?;
    remove_if_present(&old)?;
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

/// Whether `dir` is a Hugging Face GPT-2 folder (see [`gpt2`]) rather than a checkpoint: the
/// functions here read its weights and tokenizer as a checkpoint's, at iteration 0.
pub fn is_gpt2(dir: &Path) -> bool {
    !dir.join(META).exists() && gpt2::is_folder(dir)
}

/// `dir` if it holds a checkpoint (or is a GPT-2 folder), or the previous checkpoint that a
/// crash between the two renames of [`save`] left as `.<name>.old`.
fn checkpoint_at(dir: &Path) -> Option<PathBuf> {
    if dir.join(META).is_file() || is_gpt2(dir) {
        return Some(dir.to_path_buf());
    }
    let old = sibling(dir, "old");
    old.join(META).is_file().then_some(old)
}

/// A checkpoint read by [`load`].
pub struct Loaded {
    /// The checkpoint folder read (inside the run folder given, or that folder itself).
    pub dir: PathBuf,
    pub meta: Meta,
    pub tokenizer: Tokenizer,
    pub model: Gpt,
}

/// Resolves `path` as [`resolve`] does and loads its metadata and model, for the commands that
/// read a run (`generate`, `evaluate`, `inspect`) while a trainer may be writing it. A read that
/// meets a checkpoint mid-swap is tried again ([`with_retries`]).
pub fn load(path: &Path, prefer: &[&str], device: &Device) -> Result<Loaded, CheckpointError> {
    with_retries(|| {
        let dir = resolve(path, prefer)?;
        let meta = load_meta(&dir)?;
        let tokenizer = load_tokenizer(&dir, &meta)?;
        let model = load_model(&dir, &meta, device)?;
        Ok(Loaded {
            dir,
            meta,
            tokenizer,
            model,
        })
    })
}

/// Runs `read` until it succeeds or fails in a way a concurrent swap cannot explain, at most
/// 5 times over about half a second. A swap can rename a file away between two reads, or put a
/// file of the new checkpoint beside the old one's metadata.
fn with_retries<T>(
    mut read: impl FnMut() -> Result<T, CheckpointError>,
) -> Result<T, CheckpointError> {
    const ATTEMPTS: u32 = 5;
    let mut attempt = 1;
    loop {
        match read() {
            Err(e) if attempt < ATTEMPTS && e.may_be_a_swap() => {
                std::thread::sleep(std::time::Duration::from_millis(15 << attempt));
                attempt += 1;
            }
            other => return other,
        }
    }
}

impl CheckpointError {
    /// Whether a writer swapping checkpoints at the same moment can explain this error.
    fn may_be_a_swap(&self) -> bool {
        matches!(
            self,
            CheckpointError::NotACheckpoint(_)
                | CheckpointError::MissingFile(_)
                | CheckpointError::Read { .. }
                | CheckpointError::Corrupt { .. }
        )
    }
}

/// Reads and checks `meta.json` of the checkpoint folder `dir`.
pub fn load_meta(dir: &Path) -> Result<Meta, CheckpointError> {
    if is_gpt2(dir) {
        let (config, tokenizer) = gpt2::read_config(dir)?;
        return Ok(Meta::new(&config, &tokenizer, "huggingface", 0));
    }
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

/// The tokenizer of the checkpoint `dir` (reading its `tokenizer.json`, checked, for BPE).
pub fn load_tokenizer(dir: &Path, meta: &Meta) -> Result<Tokenizer, CheckpointError> {
    if is_gpt2(dir) {
        // Its meta (from `gpt2::read_config`) names its tokenizer.json, which has no checksum.
        return meta
            .vocab
            .load_from(dir)
            .map_err(|reason| CheckpointError::Corrupt {
                path: dir.join(TOKENIZER_JSON),
                reason,
            });
    }
    let json =
        match meta.vocab.file() {
            Some(name) => Some(String::from_utf8(read_checked(dir, meta, name)?).map_err(
                |_| CheckpointError::Corrupt {
                    path: dir.join(name),
                    reason: "it is not UTF-8".into(),
                },
            )?),
            None => None,
        };
    meta.vocab
        .load(json.as_deref())
        .map_err(|reason| CheckpointError::Corrupt {
            path: dir.join(meta.vocab.file().unwrap_or(META)),
            reason,
        })
}

/// Loads the weights of the checkpoint `dir` into a model of the checkpoint's architecture.
pub fn load_model(dir: &Path, meta: &Meta, device: &Device) -> Result<Gpt, CheckpointError> {
    load_weights(
        dir,
        meta,
        &meta.config.model(meta.vocab.vocab_size()),
        device,
    )
}

/// Loads the weights of the checkpoint `dir` into a model made from `config`, which has the
/// checkpoint's architecture but may differ in what holds no weights (dropout, for fine-tuning).
pub fn load_weights(
    dir: &Path,
    meta: &Meta,
    config: &GptConfig,
    device: &Device,
) -> Result<Gpt, CheckpointError> {
    if is_gpt2(dir) {
        return Ok(gpt2::load_weights(dir, config, device)?);
    }
    let path = dir.join(MODEL);
    let bytes = read_checked(dir, meta, MODEL)?;
    let corrupt = |reason: String| CheckpointError::Corrupt {
        path: path.clone(),
        reason,
    };
    let model = config
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
    if is_gpt2(dir) {
        return Err(CheckpointError::NoTrainingState(dir.to_path_buf()));
    }
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
    match faults::take_write_budget(bytes.len()) {
        Ok(_) => file.write_all(bytes)?,
        Err((fits, full)) => {
            file.write_all(&bytes[..fits])?;
            return Err(full);
        }
    }
    file.sync_all()?;
    Ok(FileSum {
        name: name.into(),
        bytes: bytes.len() as u64,
        crc32: crc32fast::hash(bytes),
    })
}

/// Syncs the file `name` that a writer wrote into `dir` and sums it, reading it back in blocks.
/// Its bytes count against the write budget of the fault tests: past it, the file is cut where
/// the budget ends and a full disk's error is returned, as [`write_synced`] does.
fn seal(dir: &Path, name: &str) -> std::io::Result<FileSum> {
    use std::io::Read;
    let path = dir.join(name);
    let mut file = fs::OpenOptions::new().read(true).write(true).open(&path)?;
    let len = file.metadata()?.len();
    if let Err((fits, full)) = faults::take_write_budget(len as usize) {
        file.set_len(fits as u64)?;
        return Err(full);
    }
    file.sync_all()?;
    let mut crc = crc32fast::Hasher::new();
    let mut block = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut block)?;
        if n == 0 {
            break;
        }
        crc.update(&block[..n]);
    }
    Ok(FileSum {
        name: name.into(),
        bytes: len,
        crc32: crc.finalize(),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(iter: u64) -> Meta {
        let vocab = Tokenizer::Char(cinder_data::CharTokenizer::from_chars("abc".chars()));
        Meta::new(&TrainConfig::default(), &vocab, "test", iter)
    }

    /// The iteration of the checkpoint `path` resolves to, checking its weights file.
    fn loadable(path: &Path) -> Result<u64, CheckpointError> {
        let dir = resolve(path, &[])?;
        let meta = load_meta(&dir)?;
        let weights = read_checked(&dir, &meta, MODEL)?;
        assert_eq!(weights, format!("weights {}", meta.iter).into_bytes());
        Ok(meta.iter)
    }

    fn write(dir: &Path, iter: u64, crash_at: Option<Moment>) -> std::io::Result<()> {
        let weights = format!("weights {iter}");
        let files = vec![(MODEL, Content::Bytes(weights.as_bytes()))];
        write_atomically(dir, &meta(iter), files, &mut |m| {
            if Some(m) == crash_at {
                Err(std::io::Error::other("crash"))
            } else {
                Ok(())
            }
        })
    }

    #[test]
    fn a_crash_at_any_moment_leaves_the_old_or_the_new_checkpoint() {
        for crash_at in [Moment::Written, Moment::Swapped, Moment::Installed] {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path().join("latest");
            write(&dir, 1, None).unwrap();
            write(&dir, 2, Some(crash_at)).unwrap_err();
            let iter = loadable(&dir).unwrap();
            assert!(iter == 1 || iter == 2, "{crash_at:?}");
            // And the next write after the crash succeeds.
            write(&dir, 3, None).unwrap();
            assert_eq!(loadable(&dir).unwrap(), 3, "{crash_at:?}");
            assert!(!sibling(&dir, "old").exists() && !sibling(&dir, "tmp").exists());
        }
    }

    #[test]
    fn a_crash_while_recovering_from_a_crash_still_leaves_a_checkpoint() {
        for crash_at in [Moment::Written, Moment::Swapped, Moment::Installed] {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path().join("latest");
            write(&dir, 1, None).unwrap();
            write(&dir, 2, Some(Moment::Swapped)).unwrap_err();
            // The recovered state: only `.latest.old` holds a checkpoint.
            assert!(!dir.exists());
            assert_eq!(loadable(&dir).unwrap(), 1);
            write(&dir, 3, Some(crash_at)).unwrap_err();
            let iter = loadable(&dir).unwrap_or_else(|e| panic!("{crash_at:?}: {e}"));
            assert!(iter == 1 || iter == 3, "{crash_at:?}");
        }
    }

    #[test]
    fn a_failed_write_removes_its_temporary_folder_and_keeps_the_old_checkpoint() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("latest");
        write(&dir, 1, None).unwrap();
        let bad = tmp.path().join("no-such-folder").join("x");
        let err = write_atomically(
            &dir,
            &meta(2),
            vec![(&*bad.to_string_lossy(), Content::Bytes(b"x"))],
            &mut |_| Ok(()),
        );
        assert!(err.is_err());
        assert!(!sibling(&dir, "tmp").exists());
        assert_eq!(loadable(&dir).unwrap(), 1);
    }

    #[test]
    fn a_reader_never_fails_while_a_writer_swaps() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("latest");
        write(&dir, 0, None).unwrap();
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                for iter in 1..=300 {
                    write(&dir, iter, None).unwrap();
                }
                done.store(true, std::sync::atomic::Ordering::SeqCst);
            });
            let mut reads = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                with_retries(|| loadable(&dir)).unwrap();
                reads += 1;
            }
            assert!(reads > 0);
        });
    }
}
