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

use super::{Command, Scheduler};
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

/// The scheduler's side: copying what arrived into the reserved slots.
impl Scheduler {
    /// Copies the remote K/V that arrived into the slots of every request waiting for it.
    pub(super) fn receive_remote(&mut self) {
        for i in 0..self.running.len() {
            if self.running[i].receiving {
                self.receive(i);
            }
        }
    }

    /// Running sequence `i` (waiting for its prompt's K/V, its slots reserved up to the last
    /// prompt token): the chunks that arrived go into its slots (copied in before the next pass)
    /// and into the cache, as loaded ones. Once every position has arrived or the feed is over
    /// (ended, or a chunk that does not continue the prompt), it gives back the slots nothing
    /// arrived for and computes the rest.
    pub(super) fn receive(&mut self, i: usize) {
        let seq = &mut self.running[i];
        let Some(remote) = seq.req.remote_kv.clone() else {
            seq.receiving = false;
            return;
        };
        let limit = seq.prompt_len - 1;
        let before = seq.computed;
        let mut inbox = remote.lock();
        let mut over = inbox.finished && inbox.records.is_empty();
        while let Some(record) = inbox.records.pop_front() {
            let start = inbox.next;
            let end = start + record.tokens.len();
            inbox.next = end;
            if end <= seq.computed {
                continue;
            }
            if start > seq.computed || end > limit || record.tokens[..] != seq.tokens[start..end] {
                // A gap (the cache lost what came before), or not this prompt's rows.
                over = true;
                break;
            }
            let skip = seq.computed - start;
            self.kv.receive(seq, record, skip, end);
            over |= inbox.finished && inbox.records.is_empty();
        }
        drop(inbox);
        let got = seq.computed - before;
        if got > 0 {
            metrics::counter!("cachet:kv_remote_received_tokens_total").increment(got as u64);
        }
        let mut seq = self.running.swap_remove(i);
        // Cached as it arrives (not inside a public prefix, whose key would be the tenant's, nor
        // under a prefix a push doomed meanwhile).
        let public = seq.req.public.as_ref().map_or(0, |p| p.tokens);
        if got > 0 && seq.computed >= public && seq.node.is_some() && !self.kv.doomed(&seq) {
            let n = seq.computed;
            self.kv.cache_prefix(&mut seq, n);
        }
        if over || seq.computed >= limit {
            seq.receiving = false;
            let computed = seq.computed;
            self.kv.unreserve(&mut seq, computed);
            seq.req.span.in_scope(|| {
                tracing::debug!(received_to = seq.computed, prompt_tokens = seq.prompt_len, "remote K/V in")
            });
        }
        self.running.push(seq);
        let last = self.running.len() - 1;
        self.running.swap(i, last);
    }
}
