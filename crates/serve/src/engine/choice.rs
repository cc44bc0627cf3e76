//! One choice of a request: the text of its row's tokens, sent as it settles, held back while
//! it may be the start of a stop string.

use tokio::sync::mpsc::UnboundedSender;

use cinder_data::{TextStream, Tokenizer};

use super::job::{Event, Finish};
use super::stop::StopMatcher;

/// The client went away: its events have nowhere to go.
pub(super) struct Gone;

/// One choice being generated: its text decoded so far, held back from a stop string.
pub(super) struct Choice<'a> {
    index: usize,
    stream: TextStream<'a>,
    held: StopMatcher,
    finished: bool,
}

impl<'a> Choice<'a> {
    /// Choice `index` of its request (prompt by prompt, `n` each), ending at any of `stop`.
    pub(super) fn new(index: usize, tokenizer: &'a Tokenizer, stop: &[String]) -> Self {
        Self {
            index,
            stream: TextStream::new(tokenizer),
            held: StopMatcher::new(stop),
            finished: false,
        }
    }

    /// Whether it met a stop string: its row's later tokens are not its text.
    pub(super) fn finished(&self) -> bool {
        self.finished
    }

    fn send(events: &UnboundedSender<Event>, event: Event) -> Result<(), Gone> {
        events.send(event).map_err(|_| Gone)
    }

    /// Sends `text` of choice `index`, if there is any, as of the request's `written` tokens.
    fn send_text(
        index: usize,
        text: String,
        written: usize,
        events: &UnboundedSender<Event>,
    ) -> Result<(), Gone> {
        if text.is_empty() {
            return Ok(());
        }
        Self::send(
            events,
            Event::Text {
                index,
                text,
                written,
            },
        )
    }

    /// Decodes `token`, the request's `written`th, and sends the text it settles.
    pub(super) fn push(
        &mut self,
        token: u32,
        written: usize,
        events: &UnboundedSender<Event>,
    ) -> Result<(), Gone> {
        let (text, stopped) = self.held.push(&self.stream.push(token));
        Self::send_text(self.index, text, written, events)?;
        if stopped {
            self.finished = true;
            let (index, reason) = (self.index, Finish::Stop);
            Self::send(events, Event::Finished { index, reason })?;
        }
        Ok(())
    }

    /// Ends a choice that met no stop string: what was held back is text after all (`written`:
    /// the request's tokens).
    pub(super) fn finish(
        mut self,
        written: usize,
        events: &UnboundedSender<Event>,
    ) -> Result<(), Gone> {
        if self.finished {
            return Ok(());
        }
        let (mut text, stopped) = self.held.push(&self.stream.finish());
        if !stopped {
            text.push_str(&self.held.release());
        }
        let index = self.index;
        Self::send_text(index, text, written, events)?;
        let reason = if stopped {
            Finish::Stop
        } else {
            Finish::Length
        };
        Self::send(events, Event::Finished { index, reason })
    }
}
