//! K/V computed elsewhere (a prefill server's) arriving for a request the engine has already
//! admitted: SGLang's `early` reservation of destination slots.
//!
//! The caller makes a pair with [`super::EngineHandle::remote_kv`]: the [`RemoteKv`] goes into
//! the [`super::Request`], the [`RemoteFeed`] stays with whatever receives the chunks. When the
//! engine admits the request it reserves slots for every prompt position before the last token,
//! and computes nothing while the feed is open: each step it copies the chunks that arrived
//! straight into those slots (and caches them), in order. Once every position has arrived, or
//! the feed ends (finished, dropped, or a chunk that does not continue the prompt), the request
//! gives back the slots nothing arrived for and computes the rest itself, as any request.

use super::Command;
use crate::kv_transfer::KvRecord;
use std::collections::VecDeque;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, MutexGuard};

#[derive(Debug)]
pub(super) struct Inbox {
    /// The prompt position of the first row of the next chunk in `records`.
    pub next: usize,
    pub records: VecDeque<KvRecord>,
    /// No more chunks will come.
    pub finished: bool,
}

/// The engine's side of a request's remote K/V (see the module's doc).
#[derive(Clone, Debug)]
pub struct RemoteKv {
    inbox: Arc<Mutex<Inbox>>,
}

impl RemoteKv {
    pub(super) fn lock(&self) -> MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The receiver's side of a request's remote K/V: chunks go in, in prompt order; dropping it
/// ends the feed.
#[derive(Debug)]
pub struct RemoteFeed {
    inbox: Arc<Mutex<Inbox>>,
    wake: Arc<Mutex<Sender<Command>>>,
}

impl RemoteFeed {
    pub(super) fn pair(from: usize, wake: Arc<Mutex<Sender<Command>>>) -> (RemoteFeed, RemoteKv) {
        let inbox = Arc::new(Mutex::new(Inbox { next: from, records: VecDeque::new(), finished: false }));
        (RemoteFeed { inbox: inbox.clone(), wake }, RemoteKv { inbox })
    }

    fn lock(&self) -> MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn wake(&self) {
        let _ = self.wake.lock().unwrap_or_else(std::sync::PoisonError::into_inner).send(Command::Wake);
    }

    /// Hands the engine the next chunk of the prompt (checked by the caller: this model's, the
    /// chain key expected). A chunk that does not continue the prompt ends the feed there.
    pub fn push(&self, record: KvRecord) {
        self.lock().records.push_back(record);
        self.wake();
    }

    /// No more chunks: the request computes what did not arrive.
    pub fn finish(self) {}
}

impl Drop for RemoteFeed {
    fn drop(&mut self) {
        self.lock().finished = true;
        self.wake();
    }
}
