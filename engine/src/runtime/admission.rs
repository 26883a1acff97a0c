//! Refusing at the door: the engine thread decides admission between forward passes, and a pass
//! can take seconds (a 512-token prefill chunk on a 2-core CPU); a request that is going to be
//! refused should not wait that long to hear it. The engine publishes, after every step, what
//! its admission control needs — its prompt throughput (now, and with more requests decoding)
//! and the uncached prompt work it holds, split as its prediction splits it — and
//! [`super::EngineHandle::submit`] refuses at once what that already condemns.
//!
//! The door predicts as the engine does ([`super::Scheduler::predict_ttft`]), which under the `slo`
//! policy puts a request that can still make its target behind its own tenant's earlier such
//! requests and every prompt being computed for one, and a request that cannot behind
//! everything that can, everything being computed and its own tenant's earlier ones; then its
//! own uncached prompt. Two differences. It leaves out other tenants' queued work (their fair
//! share ahead: what it cannot know cheaply, it does not count). And it computes at the rate the
//! engine will have by then: every request ahead of this one decodes while this one's prompt is
//! computed, and decoders take their tokens out of every pass (pacing). The engine judges a
//! waiting request again at every step with the decoders it has then, so a door that took the
//! rate of the moment would let through what the engine refuses a pass later — seconds later,
//! the wait the door is for. Requests submitted since the last step count by an estimate of
//! their uncached part: the prompt past its longest common prefix with the tenant's recent
//! prompts, or past its public prefix or the prefix the disk tier holds if that is longer. A request that might be beyond reach even alone (its whole prompt at the current
//! rate passes the limit) is left to the engine, which serves those rather than refuse them.
//! Whatever the door lets through, the engine judges again at its next step and at every step
//! after, and refuses it if its prediction passes the limit by [`LATE_SLACK`].

use super::config::{EngineConfig, SloClass};
use super::request::{Charge, Request};
use crate::radix::TenantKey;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A request the door let through is refused by the engine later only if the engine's own
/// prediction passes the limit by this factor. The door judged it against what the engine had
/// published; refused a pass or more later, it would have waited seconds for a 429, the wait the
/// door is there to spare. A misprediction this large is overload the door could not see (a burst
/// over many tenants, passes slower than their model), which the engine still sheds.
pub(crate) const LATE_SLACK: f64 = 1.25;

/// Recent prompts kept per tenant for the estimate of a new prompt's uncached part.
const RECENT: usize = 8;

type Key = (TenantKey, SloClass);

/// What the door knows (one lock: a submit holds it for a few hash lookups and a prefix compare).
#[derive(Debug, Default)]
pub(crate) struct Door {
    state: Mutex<State>,
    /// The disk tier's index, when there is a tier: a prompt's stored prefix counts as cached.
    tier: std::sync::OnceLock<super::tier::StoredIndex>,
    /// Requests refused here.
    refused: AtomicU64,
}

/// The engine's side of the door: the door it publishes admission state to (for
/// [`super::EngineHandle::submit`]), the last submission it has taken in (the door's sequence
/// number) and the id its next sequence gets.
#[derive(Debug, Default)]
pub(crate) struct Intake {
    pub door: Arc<Door>,
    pub taken: u64,
    pub next_id: u64,
}

/// Prompt work of some requests: uncached tokens, and how many requests they are (each decodes
/// once its prompt is done).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Work {
    pub tokens: usize,
    pub requests: usize,
}

impl Work {
    /// One request with `tokens` to compute.
    pub fn one(tokens: usize) -> Work {
        Work { tokens, requests: 1 }
    }
}

impl std::ops::Add for Work {
    type Output = Work;
    fn add(self, o: Work) -> Work {
        Work { tokens: self.tokens + o.tokens, requests: self.requests + o.requests }
    }
}

impl std::ops::AddAssign for Work {
    fn add_assign(&mut self, o: Work) {
        *self = *self + o;
    }
}

impl std::iter::Sum for Work {
    fn sum<I: Iterator<Item = Work>>(it: I) -> Work {
        it.fold(Work::default(), |a, b| a + b)
    }
}

/// What the engine publishes after a step: uncached prompt work of queued requests that can
/// (`hopeful`) and cannot (`hopeless`) still make their targets, and the prompt tokens left of
/// the prompts being computed.
#[derive(Debug, Default)]
pub(crate) struct Published {
    /// Prompt tokens per second the engine computes with `i` more requests decoding than now
    /// (`rates[0]`: now); the last entry stands for more.
    pub rates: Vec<f64>,
    /// Whether it had anything to do (an idle engine refuses nothing).
    pub busy: bool,
    pub hopeful: HashMap<Key, Work>,
    pub hopeless: HashMap<Key, Work>,
    /// Left to compute of running prompts that can still make their targets, and of all.
    pub running_hopeful: Work,
    pub running_all: Work,
    /// The last submission (by [`Charge::seq`]) the engine had taken in: everything up to it is
    /// in the figures above (or was refused).
    pub taken: u64,
}

impl Published {
    /// Prompt tokens per second with `more` requests decoding than now (0 before any pass).
    fn rate(&self, more: usize) -> f64 {
        self.rates.get(more).or(self.rates.last()).copied().unwrap_or(0.0)
    }
}

#[derive(Debug, Default)]
struct State {
    published: Published,
    /// Submissions so far (the last one's [`Charge::seq`]).
    submitted: u64,
    /// Requests let through that the last publication does not cover yet: their estimated
    /// uncached work, by whether they can make their own targets.
    unseen: VecDeque<(Key, Charge)>,
    /// Per tenant: its last prompts.
    recent: HashMap<TenantKey, VecDeque<Arc<[u32]>>>,
}

impl State {
    /// Unseen work that can (`hopeful`) or cannot make its target, of `key` (or of everyone).
    fn unseen(&self, hopeful: bool, key: Option<&Key>) -> Work {
        self.unseen
            .iter()
            .filter(|(k, c)| c.hopeful == hopeful && key.is_none_or(|key| key == k))
            .map(|(_, c)| Work::one(c.tokens))
            .sum()
    }
}

fn get(m: &HashMap<Key, Work>, k: &Key) -> Work {
    m.get(k).copied().unwrap_or_default()
}

impl Door {
    /// Counts the prompts' prefixes the disk tier holds as cached from now on.
    pub(super) fn set_tier(&self, index: super::tier::StoredIndex) {
        let _ = self.tier.set(index);
    }

    /// Judges a request at submission. `Err(predicted)`: refuse it now (its time to first token
    /// would be about `predicted`). `Ok(charge)`: let it through.
    pub(crate) fn judge(&self, req: &Request, cfg: &EngineConfig) -> Result<Charge, Duration> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let tokens: Arc<[u32]> = req.tokens.as_slice().into();
        // A public prefix (the operator's system prompt, a registered agent preamble) is computed
        // once for every tenant and evicted last: counted as cached, like the tenant's own recent
        // prompts' common part.
        let public = req.public.as_ref().map_or(0, |p| p.tokens);
        // So is what the disk tier holds of it (a context that survived a restart).
        let stored = self.tier.get().map_or(0, |t| t.prefix(req));
        let shared = st
            .recent
            .get(&req.tenant)
            .map_or(0, |r| r.iter().map(|p| common_prefix(p, &tokens)).max().unwrap_or(0))
            .max(public)
            .max(stored);
        let recent = st.recent.entry(req.tenant.clone()).or_default();
        if recent.len() == RECENT {
            recent.pop_front();
        }
        recent.push_back(tokens);
        st.submitted += 1;
        let seq = st.submitted;
        let now = st.published.rate(0);
        if req.prewarm || cfg.overload_factor <= 0.0 || now <= 0.0 {
            return Ok(Charge { seq, ..Charge::default() });
        }
        let target = cfg.targets(req.slo).ttft;
        let limit = target.mul_f64(cfg.overload_factor.max(1.0));
        let secs = |tokens: usize, rate: f64| Duration::from_secs_f64(tokens as f64 / rate);
        let key = (req.tenant.clone(), req.slo);
        // A prompt whose K/V arrives from a prefill server leaves its last token to compute here.
        let own =
            if req.remote_kv.is_some() { 1 } else { req.tokens.len() - shared.min(req.tokens.len().saturating_sub(1)) };
        let hopeful = secs(own, now) <= target;
        let p = &st.published;
        let ahead = if hopeful {
            get(&p.hopeful, &key) + st.unseen(true, Some(&key)) + p.running_hopeful
        } else {
            p.hopeful.values().copied().sum::<Work>()
                + st.unseen(true, None)
                + p.running_all
                + get(&p.hopeless, &key)
                + st.unseen(false, Some(&key))
        };
        let predicted = secs(ahead.tokens + own, p.rate(ahead.requests));
        let idle = !p.busy && st.unseen.is_empty();
        // Only what is surely not beyond reach: its whole prompt alone fits in the limit.
        if !idle && secs(req.tokens.len(), now) <= limit && predicted > limit {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(predicted);
        }
        let charge = Charge { seq, tokens: own, hopeful };
        st.unseen.push_back((key, charge));
        Ok(charge)
    }

    /// The engine's state after a step: what it covers leaves the unseen work.
    pub(crate) fn publish(&self, p: Published) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while st.unseen.front().is_some_and(|(_, c)| c.seq <= p.taken) {
            st.unseen.pop_front();
        }
        st.published = p;
    }

    /// Requests refused at the door so far.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Forgets a tenant's recent prompts (its cache was purged).
    pub(crate) fn forget(&self, tenant: &TenantKey) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).recent.remove(tenant);
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::GenerateParams;

    fn cfg() -> EngineConfig {
        let mut c = EngineConfig::default();
        c.interactive.ttft = Duration::from_secs(1);
        c.overload_factor = 2.0;
        c
    }

    fn req(tenant: &str, tokens: Vec<u32>) -> Request {
        Request::new(TenantKey::new(tenant), tokens, GenerateParams::default())
    }

    fn key(t: &str) -> Key {
        (TenantKey::new(t), SloClass::Interactive)
    }

    /// A busy engine at 100 prompt tokens a second however many decode; each entry of work one
    /// request.
    fn busy(door: &Door, hopeful: &[(&str, usize)], hopeless: &[(&str, usize)], running: (usize, usize)) {
        let map = |w: &[(&str, usize)]| w.iter().map(|&(t, n)| (key(t), Work::one(n))).collect();
        let one = |n| if n > 0 { Work::one(n) } else { Work::default() };
        door.publish(Published {
            rates: vec![100.0],
            busy: true,
            hopeful: map(hopeful),
            hopeless: map(hopeless),
            running_hopeful: one(running.0),
            running_all: one(running.1),
            taken: 0,
        });
    }

    fn charged(seq: u64, tokens: usize, hopeful: bool) -> Result<Charge, Duration> {
        Ok(Charge { seq, tokens, hopeful })
    }

    #[test]
    fn a_tenants_own_queue_past_the_limit_is_refused_at_once() {
        let door = Door::default();
        // 100 tokens a second, limit 2 s: 300 queued tokens of the same tenant are 3 s ahead, and
        // its own 50 take half a second more.
        busy(&door, &[("a", 300), ("b", 10_000)], &[], (0, 0));
        assert_eq!(door.judge(&req("a", (0..50).collect()), &cfg()), Err(Duration::from_secs_f64(3.5)));
        // Another tenant's queue does not count against "c" (fair share), however long.
        assert_eq!(door.judge(&req("c", (0..50).collect()), &cfg()), charged(2, 50, true));
    }

    #[test]
    fn a_prefix_the_disk_tier_holds_counts_as_cached() {
        // 100 tokens a second, target 1 s, limit 2 s, a's own 100 queued: 1 s ahead. A 190-token
        // prompt computed whole takes 1.9 s more (refused); with its first 128 tokens stored (a
        // context that survived a restart), 62 tokens: 0.62 s.
        let dir = tempfile::tempdir().unwrap();
        let prompt = req("a", (0..190).collect());
        let (_tier, index) = crate::runtime::tier::holding(dir.path(), &prompt, 64, 2);
        assert_eq!(index.prefix(&prompt), 128);
        let door = Door::default();
        busy(&door, &[("a", 100)], &[], (0, 0));
        assert_eq!(door.judge(&prompt, &cfg()), Err(Duration::from_secs_f64(2.9)));
        // (A new door: the refused prompt is among a's recent ones now, which would count too.)
        let fresh = Door::default();
        fresh.set_tier(index.clone());
        busy(&fresh, &[("a", 100)], &[], (0, 0));
        assert_eq!(fresh.judge(&prompt, &cfg()), charged(1, 62, true));
        // Another tenant's same tokens find nothing of a's.
        let fresh = Door::default();
        fresh.set_tier(index);
        busy(&fresh, &[("a", 100)], &[], (0, 0));
        assert_eq!(fresh.judge(&req("b", (0..190).collect()), &cfg()), Err(Duration::from_secs_f64(2.9)));
    }

    #[test]
    fn a_request_that_cannot_make_its_target_waits_behind_everything_that_can() {
        let door = Door::default();
        // 150 tokens: 1.5 s alone, past the 1 s target but within the 2 s limit.
        busy(&door, &[("b", 120)], &[("a", 30)], (0, 60));
        // Ahead of it: b's 120 (they can make theirs), everything being computed (60) and a's
        // own earlier 30: 2.1 s, then its own 1.5 s.
        let predicted = door.judge(&req("a", (0..150).collect()), &cfg()).unwrap_err();
        assert_eq!(predicted, Duration::from_secs_f64(3.6));
        // A short request of a's is only behind a's own that can make it (none) and the
        // running prompts that can (none).
        assert_eq!(door.judge(&req("a", (500..510).collect()), &cfg()), charged(2, 10, true));
    }

    #[test]
    fn unseen_submissions_count_by_what_they_do_not_share() {
        let door = Door::default();
        busy(&door, &[], &[], (0, 0));
        // Three requests on one 60-token context, 20 new tokens each: 80, then 20 and 20.
        let ctx: Vec<u32> = (0..60).collect();
        let with = |tail: u32| ctx.iter().copied().chain(tail * 100..tail * 100 + 20).collect::<Vec<_>>();
        assert_eq!(door.judge(&req("a", with(1)), &cfg()), charged(1, 80, true));
        assert_eq!(door.judge(&req("a", with(2)), &cfg()), charged(2, 20, true));
        assert_eq!(door.judge(&req("a", with(3)), &cfg()), charged(3, 20, true));
        // The engine has taken in the first: a publication covers it, the other two stay unseen.
        door.publish(Published { rates: vec![100.0], busy: true, taken: 1, ..Published::default() });
        assert_eq!(door.state.lock().unwrap().unseen(true, Some(&key("a"))), Work { tokens: 40, requests: 2 });
    }

    #[test]
    fn a_public_prefix_counts_as_cached_for_a_tenants_first_request() {
        let door = Door::default();
        busy(&door, &[("a", 100)], &[], (0, 0));
        // A fresh tenant's first request: 1,000 tokens, of which a 960-token registered preamble.
        let mut r = req("a", (0..1000).collect());
        r.public = Some(crate::runtime::PublicPrefix { template: "chat".into(), tokens: 960 });
        // 100 ahead and its own 40: 1.4 s, within the 2 s limit (counted whole it would be
        // hopeless, and judged behind everything).
        assert_eq!(door.judge(&r, &cfg()), charged(1, 40, true));
    }

    #[test]
    fn what_may_be_beyond_reach_and_an_idle_engine_are_left_to_the_engine() {
        let door = Door::default();
        door.publish(Published { rates: vec![100.0], ..Published::default() });
        // Idle, nothing unseen: never refused.
        assert!(door.judge(&req("a", (0..150).collect()), &cfg()).is_ok());
        busy(&door, &[("a", 10_000)], &[("a", 10_000)], (10_000, 10_000));
        // 300 tokens alone take 3 s, past the 2 s limit: maybe beyond reach, so the engine decides.
        assert!(door.judge(&req("a", (1000..1300).collect()), &cfg()).is_ok());
    }

    #[test]
    fn the_rate_is_the_one_left_once_the_requests_ahead_decode() {
        let door = Door::default();
        // 100 prompt tokens a second now; 50 with one more request decoding, 40 with two.
        door.publish(Published {
            rates: vec![100.0, 50.0, 40.0],
            busy: true,
            hopeful: [(key("a"), Work::one(50))].into(),
            ..Published::default()
        });
        // Behind one request: 100 tokens at 50 a second, 2 s, just within the limit.
        assert_eq!(door.judge(&req("a", (0..50).collect()), &cfg()), charged(1, 50, true));
        // Behind two: 150 tokens at 40 a second, 3.75 s (at the rate of the moment: 1.5 s).
        let predicted = door.judge(&req("a", (100..150).collect()), &cfg()).unwrap_err();
        assert_eq!(predicted, Duration::from_secs_f64(3.75));
        // Beyond the table, its last entry stands.
        assert_eq!(Published { rates: vec![100.0, 50.0], ..Published::default() }.rate(7), 50.0);
    }
}
