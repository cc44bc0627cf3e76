//! Writing a checkpoint atomically (the protocol in the module docs of [`super`]), each file
//! serialised straight to disk and summed.

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

use burn::optim::ModuleOptimizer;
use burn::prelude::*;
use cinder_data::Tokenizer;
use cinder_data::tokenizer::TOKENIZER_JSON;
use cinder_model::Gpt;

use crate::faults;
use crate::storage::names::{self, META, MODEL, OPTIMIZER};

use super::*;

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
    let (tmp, old) = (names::tmp(dir), names::old(dir));
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
    use crate::config::TrainConfig;
    use crate::storage::checkpoint::read::{read_checked, with_retries};

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
            assert!(!names::old(&dir).exists() && !names::tmp(&dir).exists());
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
        assert!(!names::tmp(&dir).exists());
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
