//! The run folder: where run folders go by default, one trainer at a time, and no run replaced
//! by accident.
//!
//! `train` takes an OS advisory lock on `train.lock` inside the run folder before it writes
//! anything there, and writes its process id into that file. The OS releases the lock when the
//! process ends in any way (`kill -9` too), so a stale lock file never blocks a later run. Readers
//! (`generate`, `evaluate`, `inspect`) take no lock: they read a run while it trains.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use crate::storage::names::{self, LOCK};

/// Where run folders go when `train` is not given `--out`: `<RUNS>/<config file name>`; and
/// where `serve` looks for runs unless given `--runs`.
pub const RUNS: &str = "checkpoints";

/// Why a run folder cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RunFolderError {
    #[error(
        "run folder {} is in use by another train process ({holder}): wait for it to finish, \
         stop it, or choose another --out",
        dir.display()
    )]
    Locked { dir: PathBuf, holder: String },
    #[error("cannot write to the run folder {}: {source}; choose another with --out", dir.display())]
    Unwritable {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{} already holds a run ({found}): continue it with `train --resume {}`, choose another \
         --out, or pass --overwrite to move the old run aside (into {})",
        dir.display(),
        dir.display(),
        aside.display()
    )]
    HoldsARun {
        dir: PathBuf,
        found: String,
        aside: PathBuf,
    },
    #[error("cannot move the old run in {} aside into {}: {source}", dir.display(), aside.display())]
    MoveAside {
        dir: PathBuf,
        aside: PathBuf,
        source: std::io::Error,
    },
}

/// The lock on a run folder, held until dropped (or the process ends).
#[derive(Debug)]
pub struct RunLock {
    dir: PathBuf,
    _file: File,
    /// Whether [`RunLock::acquire`] made the folder and the run has not yet started in it.
    made_for_a_start: bool,
}

impl RunLock {
    /// Creates `dir` if needed and locks it for this process, or fails at once, touching
    /// nothing, if another process holds it (the error names that process's id).
    pub fn acquire(dir: &Path) -> Result<Self, RunFolderError> {
        let unwritable = |source| RunFolderError::Unwritable {
            dir: dir.to_path_buf(),
            source,
        };
        let made_for_a_start = !dir.exists();
        std::fs::create_dir_all(dir).map_err(unwritable)?;
        // Opened without truncating: the holder's process id stays readable until we hold it.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(LOCK))
            .map_err(unwritable)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                let holder = match pid.trim() {
                    "" => "process id not yet written".to_string(),
                    pid => format!("process id {pid}"),
                };
                return Err(RunFolderError::Locked {
                    dir: dir.to_path_buf(),
                    holder,
                });
            }
            Err(TryLockError::Error(e)) => return Err(unwritable(e)),
        }
        file.set_len(0).map_err(unwritable)?;
        file.rewind().map_err(unwritable)?;
        writeln!(file, "{}", std::process::id()).map_err(unwritable)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            _file: file,
            made_for_a_start,
        })
    }

    /// The run has started in the folder: from now on it stays whatever happens.
    pub fn started(&mut self) {
        self.made_for_a_start = false;
    }

    /// The folder locked.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Refuses a new run in a folder that holds one, unless `overwrite`: then the old run's
    /// files are moved into a sibling folder `<name>.old-<n>` (the first free `n`), never deleted.
    /// Returns that folder when something was moved.
    pub fn clear_for_new_run(&self, overwrite: bool) -> Result<Option<PathBuf>, RunFolderError> {
        let dir = &self.dir;
        let present: Vec<String> = names::run_entries()
            .into_iter()
            .filter(|name| dir.join(name).symlink_metadata().is_ok())
            .collect();
        if present.is_empty() {
            return Ok(None);
        }
        let aside = names::free_aside(dir);
        if !overwrite {
            return Err(RunFolderError::HoldsARun {
                dir: dir.clone(),
                found: present.join(", "),
                aside,
            });
        }
        let move_err = |source| RunFolderError::MoveAside {
            dir: dir.clone(),
            aside: aside.clone(),
            source,
        };
        std::fs::create_dir(&aside).map_err(move_err)?;
        for name in present {
            std::fs::rename(dir.join(&name), aside.join(&name)).map_err(move_err)?;
        }
        Ok(Some(aside))
    }
}

/// A run that failed to start (its text missing, say) leaves no folder that its lock made: the
/// lock, the start's own scratch (`.measuring/`, an empty `data/`) and the folder go, where
/// nothing else is in it. A folder that was there before stays as it is.
impl Drop for RunLock {
    fn drop(&mut self) {
        if self.made_for_a_start {
            let _ = std::fs::remove_file(self.dir.join(LOCK));
            let _ = std::fs::remove_dir_all(self.dir.join(names::MEASURING));
            let _ = std::fs::remove_dir(self.dir.join(names::PREPARED));
            let _ = std::fs::remove_dir(&self.dir);
        }
    }
}

/// The process id of the trainer that holds `dir`'s lock now, found without taking the lock
/// (`train` refuses to start while anyone holds it, so a reader must not): the id written in the
/// lock file, if that process lives and, where the system shows it (Linux), has the lock file
/// open. A lock file left by a finished run names a process that is gone, or another one.
pub fn trainer_pid(dir: &Path) -> Option<u32> {
    let lock = dir.join(LOCK);
    let pid: u32 = std::fs::read_to_string(&lock).ok()?.trim().parse().ok()?;
    holds_open(pid, &lock).then_some(pid)
}

#[cfg(target_os = "linux")]
fn holds_open(pid: u32, lock: &Path) -> bool {
    let Ok(lock) = std::fs::canonicalize(lock) else {
        return false;
    };
    match std::fs::read_dir(format!("/proc/{pid}/fd")) {
        Ok(fds) => fds
            .filter_map(Result::ok)
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == lock)),
        // Another user's process: that it lives is all there is to see.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => true,
        Err(_) => false,
    }
}

#[cfg(all(unix, not(target_os = "linux")))]
fn holds_open(pid: u32, _lock: &Path) -> bool {
    // `kill -0` asks whether the process lives, sending nothing.
    std::process::Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[cfg(not(unix))]
fn holds_open(_pid: u32, _lock: &Path) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_with_the_holders_pid_until_the_first_is_dropped() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        let first = RunLock::acquire(&dir).unwrap();
        let err = RunLock::acquire(&dir).unwrap_err().to_string();
        assert!(err.contains("in use by another train process"), "{err}");
        assert!(
            err.contains(&format!("process id {}", std::process::id())),
            "{err}"
        );
        drop(first);
        RunLock::acquire(&dir).unwrap();
    }

    #[test]
    fn the_trainer_is_seen_while_it_holds_the_lock_and_not_after() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        let mut lock = RunLock::acquire(&dir).unwrap();
        lock.started();
        let seen = trainer_pid(&dir);
        drop(lock);
        // The file still names this process, which lives but holds it no longer.
        let after = trainer_pid(&dir);
        if cfg!(target_os = "linux") {
            assert_eq!((seen, after), (Some(std::process::id()), None));
        }
        std::fs::write(dir.join(LOCK), "4294967295\n").unwrap(); // no such process
        assert_eq!(trainer_pid(&dir), None);
        assert_eq!(trainer_pid(&tmp.path().join("none")), None);
    }

    #[test]
    fn an_old_run_is_refused_or_moved_aside_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        let lock = RunLock::acquire(&dir).unwrap();
        assert_eq!(lock.clear_for_new_run(false).unwrap(), None);
        std::fs::create_dir(dir.join("latest")).unwrap();
        std::fs::write(dir.join("latest/meta.json"), "{}").unwrap();
        std::fs::write(dir.join("metrics.csv"), "old rows").unwrap();
        std::fs::write(dir.join("notes.txt"), "the user's").unwrap();
        let err = lock.clear_for_new_run(false).unwrap_err().to_string();
        assert!(err.contains("latest, metrics.csv"), "{err}");
        assert!(
            err.contains("--resume") && err.contains("--overwrite"),
            "{err}"
        );
        assert!(
            dir.join("metrics.csv").exists(),
            "a refusal touches nothing"
        );

        std::fs::create_dir(tmp.path().join("run.old-1")).unwrap(); // taken: the next is used
        let aside = lock.clear_for_new_run(true).unwrap().unwrap();
        assert_eq!(aside, tmp.path().join("run.old-2"));
        assert_eq!(
            std::fs::read_to_string(aside.join("metrics.csv")).unwrap(),
            "old rows"
        );
        assert!(aside.join("latest/meta.json").exists());
        assert!(!dir.join("latest").exists() && !dir.join("metrics.csv").exists());
        assert!(
            dir.join("notes.txt").exists(),
            "files that are not the run's stay"
        );
        assert!(dir.join(LOCK).exists());
    }
}
