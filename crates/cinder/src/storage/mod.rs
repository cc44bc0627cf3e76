//! What cinder keeps on disk: the names of a run's files, the run folder and its lock,
//! checkpoints and their crash-safe writes, the run's record files (rewritten on resume) and
//! its samples file, Hugging Face folders (GPT-2, NanoChat), and the test-only fault hooks of those writes.

pub mod checkpoint;
pub mod faults;
pub mod hf;
pub mod names;
pub mod records;
pub mod run_folder;
pub mod samples;
