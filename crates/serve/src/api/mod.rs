//! OpenAI's completions API as cinder speaks it:
//!
//! - [`request`]: the request, and what is checked in it;
//! - [`response`]: the completion and stream chunk objects;
//! - [`error`]: errors in OpenAI's shape (`{"error": {"message", "type", "param", "code"}}`),
//!   the engine's and the models' included.

mod error;
mod request;
mod response;

pub use error::ApiError;
pub use request::{Limits, MAX_PROMPTS, StreamUsage, parse_completion, parse_json};
pub use response::{Choice, Header, Usage, now};
