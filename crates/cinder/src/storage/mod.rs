//! What cinder keeps on disk: the names of a run's files, checkpoints and their crash-safe
//! writes, the run's record files, Hugging Face GPT-2 folders, and the test-only fault hooks of
//! those writes.

pub mod checkpoint;
pub mod faults;
pub mod gpt2;
pub mod names;
pub mod records;
