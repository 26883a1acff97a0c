//! Constrained decoding: a request may carry a grammar its output must match
//! (a JSON Schema, a regular expression or an llguidance Lark grammar, which
//! may start lazily at a trigger such as `<tool_call>`). The grammar engine is
//! [llguidance](https://github.com/guidance-ai/llguidance); this module only
//! adapts it to cachet:
//!
//! - [`Grammars`] belongs to a model: its tokenizer's byte view for llguidance
//!   (built on first use) and a cache of compiled grammars keyed by their text,
//!   since agents send the same tools on every turn. [`Grammars::compile`] is
//!   blocking CPU work: callers run it off the engine thread (and off async
//!   executors), before they submit the request.
//! - A compiled [`Grammar`] is data of the request; the engine gives each
//!   sequence its own matcher state ([`Constraint`]), asks it for the allowed
//!   tokens while the forward pass runs, masks the logits with them before
//!   penalties and temperature, and feeds it every sampled token.
//!
//! The tokenizer's byte view comes from llguidance's own reader of a Hugging
//! Face `tokenizer.json` (applied to the JSON our tokenizer serialises to),
//! rather than from `toktrie_hf_tokenizers`: that adapter is pinned to an
//! older `tokenizers` (0.21) than the engine's (0.23), and would put a second
//! tokenizer library and a second copy of the vocabulary in the process.

use crate::tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{self, SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// What a request's output must match.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GrammarSource {
    /// A JSON Schema, as JSON text. Options for llguidance's JSON compiler
    /// (separators, whitespace) may be given under the schema's `"x-guidance"`.
    JsonSchema(String),
    /// A regular expression (Rust `regex` syntax) the whole output must match.
    Regex(String),
    /// An llguidance grammar in its Lark-like syntax (may embed `%json {…}`
    /// schemas and lazy rules that start at a trigger).
    Lark(String),
}

impl GrammarSource {
    fn tag_and_text(&self) -> (&'static str, &str) {
        match self {
            GrammarSource::JsonSchema(s) => ("json_schema", s),
            GrammarSource::Regex(s) => ("regex", s),
            GrammarSource::Lark(s) => ("lark", s),
        }
    }

    /// Bytes of grammar text (what the cache weighs).
    pub fn len(&self) -> usize {
        self.tag_and_text().1.len()
    }

    /// Whether the grammar text is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why a grammar could not be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GrammarError {
    /// The grammar or schema is malformed or uses what llguidance does not support.
    #[error("{0}")]
    Invalid(String),
    /// This model's tokenizer cannot be used for constrained decoding.
    #[error("constrained decoding is not available for this model: {0}")]
    Unsupported(String),
    /// The grammar is larger than the server accepts.
    #[error("the grammar is {len} bytes; at most {limit} are accepted")]
    TooLarge { len: usize, limit: usize },
}

/// A grammar's matcher failed on a sequence's output: no token is allowed, a token was refused,
/// or llguidance failed (its message, in one line).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct MatchError(pub String);

/// The largest grammar text accepted (JSON Schemas of large tool sets included).
pub const MAX_GRAMMAR_BYTES: usize = 1 << 20;

/// A compiled grammar: cheap to clone, shared by every request that uses it.
#[derive(Clone)]
pub struct Grammar {
    /// The matcher at the start of the output; each request takes a copy.
    start: Arc<Matcher>,
    /// Tokens the model has that the tokenizer does not (always masked).
    vocab: usize,
    eos: Arc<[u32]>,
    /// Takes the grammar out of its model's cache (its lexer is shared by every copy: one
    /// that failed — out of llguidance's limits — fails for every later request too, and must
    /// not be kept with what it built).
    evict: Arc<dyn Fn() + Send + Sync>,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar").finish_non_exhaustive()
    }
}

impl Grammar {
    /// Whether `tokens` may be the output (or its start) under this grammar: `Ok(true)`
    /// when the output may end after them, `Ok(false)` when it must go on, `Err` naming
    /// the first token the grammar does not allow.
    pub fn check(&self, tokens: &[u32]) -> Result<bool, MatchError> {
        let mut c = self.start();
        for (i, &t) in tokens.iter().enumerate() {
            let mask = c.mask()?;
            if t as usize >= mask.len() || !mask.is_allowed(t) {
                return Err(MatchError(format!("token {i} (id {t}) is not allowed there")));
            }
            c.commit(t)?;
        }
        if c.finished() {
            return Ok(true);
        }
        let mask = c.mask()?;
        Ok(c.eos.first().is_some_and(|&e| (e as usize) < mask.len() && mask.is_allowed(e)))
    }

    /// A fresh matcher state for one sequence. Copies share the grammar's lazily
    /// built lexer, so requests with the same grammar warm it up for each other.
    pub(crate) fn start(&self) -> Constraint {
        Constraint {
            matcher: (*self.start).clone(),
            vocab: self.vocab,
            eos: self.eos.clone(),
            evict: self.evict.clone(),
        }
    }
}

/// The grammar state of one sequence.
pub(crate) struct Constraint {
    matcher: Matcher,
    vocab: usize,
    eos: Arc<[u32]>,
    evict: Arc<dyn Fn() + Send + Sync>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("stopped", &self.matcher.is_stopped()).finish_non_exhaustive()
    }
}

impl Constraint {
    /// The tokens the grammar allows next (llguidance's own error text on failure).
    pub(crate) fn mask(&mut self) -> Result<SimpleVob, MatchError> {
        let m = &mut self.matcher;
        match std::panic::catch_unwind(AssertUnwindSafe(|| m.compute_mask())) {
            Ok(Ok(mask)) => Ok(mask),
            // llguidance's stop reason when no token can extend the output.
            Ok(Err(e)) if e.to_string().starts_with("NoExtensionBias") => {
                Err(MatchError("the grammar allows no token here".into()))
            }
            Ok(Err(e)) => Err(self.failed(&e.to_string())),
            Err(_) => Err(self.failed("the grammar engine failed")),
        }
    }

    /// The matcher failed: the grammar leaves its model's cache (its shared lexer may be what
    /// failed), and the error is told in one line.
    fn failed(&self, error: &str) -> MatchError {
        (self.evict)();
        MatchError(first_line(error))
    }

    /// Sets every logit the mask does not allow to −∞ (with every end-of-sequence
    /// id of the model allowed wherever the grammar allows its EOS). False when
    /// nothing is allowed.
    pub(crate) fn apply(&self, mask: &SimpleVob, logits: &mut [f32]) -> bool {
        let eos_allowed = self.eos.first().is_some_and(|&e| (e as usize) < mask.len() && mask.is_allowed(e));
        let mut any = false;
        let known = mask.len().min(logits.len()).min(self.vocab);
        for (i, l) in logits.iter_mut().enumerate() {
            let ok = (i < known && mask.is_allowed(i as u32)) || (eos_allowed && self.eos.contains(&(i as u32)));
            if ok {
                any |= !l.is_nan();
            } else {
                *l = f32::NEG_INFINITY;
            }
        }
        any
    }

    /// Feeds the sampled token. An end-of-sequence id ends the request, so it
    /// is not fed (the grammar allowed it only where the output may end).
    pub(crate) fn commit(&mut self, token: u32) -> Result<(), MatchError> {
        if self.eos.contains(&token) {
            return Ok(());
        }
        let m = &mut self.matcher;
        match std::panic::catch_unwind(AssertUnwindSafe(|| m.consume_token(token))) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(self.failed(&e.to_string())),
            Err(_) => Err(self.failed("the grammar engine failed")),
        }
    }

    /// How many of `tokens`, from the start, the grammar allows one after the other from here
    /// (the state does not move: a draft is checked before the model verifies it). An
    /// end-of-sequence id ends the count (it ends the output); a matcher error counts as none.
    pub(crate) fn allowed_prefix(&mut self, tokens: &[u32]) -> usize {
        let upto = tokens.iter().position(|t| self.eos.contains(t)).unwrap_or(tokens.len());
        let m = &mut self.matcher;
        match std::panic::catch_unwind(AssertUnwindSafe(|| m.validate_tokens(&tokens[..upto]))) {
            Ok(Ok(n)) => n.min(upto),
            _ => 0,
        }
    }

    /// Whether the grammar is complete and allows nothing more.
    pub(crate) fn finished(&self) -> bool {
        self.matcher.is_stopped() && !self.matcher.is_error()
    }
}

/// Counters of a model's grammar cache.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GrammarStats {
    pub compiled: u64,
    pub cache_hits: u64,
}

/// The grammars of one model: llguidance's view of its tokenizer (built on
/// first use) and a cache of compiled grammars.
pub struct Grammars {
    tokenizer: Arc<Tokenizer>,
    /// The model's vocabulary (the logits' length), which may exceed the tokenizer's.
    vocab: usize,
    eos: Arc<[u32]>,
    factory: OnceLock<Result<ParserFactory, GrammarError>>,
    cache: Arc<moka::sync::Cache<GrammarSource, Cached>>,
    compiled: std::sync::atomic::AtomicU64,
    hits: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars").field("vocab", &self.vocab).field("cached", &self.cache.entry_count()).finish()
    }
}

/// A compiled grammar in the cache, with what it weighs.
#[derive(Clone)]
struct Cached {
    grammar: Grammar,
    weight: u32,
}

/// Compiled grammars kept: each weighed by its text, what its lexer held after its first mask
/// (measured), and a flat 128 KiB for what using it builds (lexer states grow as requests use
/// them, up to [`MAX_LEXER_STATES`]), so at most 512 grammars, fewer when they are large.
const CACHE_WEIGHT: u64 = 64 << 20;
const ENTRY_WEIGHT: u32 = 128 << 10;

fn weight(text: usize, lexer: usize) -> u32 {
    u32::try_from(text.saturating_add(lexer)).unwrap_or(u32::MAX).saturating_add(ENTRY_WEIGHT)
}

/// The longest a grammar's first mask may take (it builds most of its lexer); over it the
/// grammar is refused. A cold compile of a large tool set takes tens of milliseconds.
const FIRST_MASK_BUDGET: Duration = Duration::from_secs(2);

/// The most lexer states a grammar may build (llguidance's default is 250,000, at 1-2 kB a
/// state): one tenant's grammar must not hold hundreds of megabytes.
const MAX_LEXER_STATES: usize = 50_000;

/// Runs `work` (compiling grammars) on the grammar threads, at a low scheduling priority: a
/// tenant's costly grammar (up to the first-mask budget of CPU time, more with several at once)
/// takes CPU time the engine and the HTTP workers do not need, never theirs. `None` if the work
/// panicked.
pub fn in_background<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> impl std::future::Future<Output = Option<T>> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    let pool = POOL.get_or_init(|| {
        let threads = std::thread::available_parallelism().map_or(2, |n| (n.get() / 2).max(2));
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("cachet-grammar-{i}"))
            .start_handler(|_| lower_priority())
            .build()
            .ok()
    });
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job = move || {
        let out = std::panic::catch_unwind(AssertUnwindSafe(work)).ok();
        let _ = tx.send(out);
    };
    match pool {
        Some(pool) => pool.spawn(job),
        None => job(),
    }
    async move { rx.await.ok().flatten() }
}

/// Lowers the calling thread's scheduling priority (Linux: `nice` is per thread).
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority on the calling thread (who = 0) changes nothing but its priority.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, 10);
    }
}

/// The CPU time one thread has used (Linux: its CPU-time clock, readable from other threads
/// while it lives).
struct ThreadCpuClock {
    #[cfg(target_os = "linux")]
    id: libc::clockid_t,
    #[cfg(target_os = "linux")]
    at_start: Duration,
}

impl ThreadCpuClock {
    /// The calling thread's clock, where the system has one.
    fn current() -> Option<ThreadCpuClock> {
        #[cfg(target_os = "linux")]
        {
            let mut id: libc::clockid_t = 0;
            // SAFETY: pthread_self is the calling thread; `id` is a valid out-pointer.
            if unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut id) } != 0 {
                return None;
            }
            let at_start = read_clock(id)?;
            Some(ThreadCpuClock { id, at_start })
        }
        #[cfg(not(target_os = "linux"))]
        None
    }

    /// CPU time used since [`ThreadCpuClock::current`] (the thread must still be running).
    fn elapsed(&self) -> Duration {
        #[cfg(target_os = "linux")]
        {
            read_clock(self.id).map_or(Duration::ZERO, |now| now.saturating_sub(self.at_start))
        }
        #[cfg(not(target_os = "linux"))]
        Duration::ZERO
    }
}

#[cfg(target_os = "linux")]
fn read_clock(id: libc::clockid_t) -> Option<Duration> {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid out-pointer; an invalid clock id is an error return, not UB.
    if unsafe { libc::clock_gettime(id, &mut t) } != 0 {
        return None;
    }
    Some(Duration::new(u64::try_from(t.tv_sec).ok()?, u32::try_from(t.tv_nsec).ok()?))
}

/// Gives memory a failed grammar freed back to the system: a lexer that ran out of llguidance's
/// limits built up to hundreds of megabytes in the allocator arena of the thread that compiled
/// it, and glibc keeps what is freed in its arenas (each blocking thread may have its own).
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only hands the allocator's free memory back to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Computes `parser`'s first mask, cancelled once it has taken `budget` of this thread's CPU
/// time (the grammar threads run at a low priority: on a busy server their wall-clock time
/// stretches, and a grammar must not be refused for that), or ten times `budget` of wall-clock
/// time; the bytes its lexer then holds.
fn first_mask(parser: &mut llguidance::TokenParser, budget: Duration) -> Result<usize, GrammarError> {
    let cancel = parser.enable_cancellation();
    let cpu = ThreadCpuClock::current();
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::Builder::new()
        .name("cachet-grammar-budget".into())
        .spawn(move || {
            let start = Instant::now();
            loop {
                match wait.recv_timeout(Duration::from_millis(50)) {
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                    _ => return,
                }
                let spent = cpu.as_ref().map_or_else(|| start.elapsed(), ThreadCpuClock::elapsed);
                if spent >= budget || start.elapsed() >= budget * 10 {
                    cancel.cancel();
                    return;
                }
            }
        })
        .map_err(|e| GrammarError::Invalid(format!("the grammar could not be checked: {e}")))?;
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
        parser.start_without_prompt();
        // A grammar that allows only the empty output is stopped already: nothing to build.
        if parser.stopped() {
            return Ok(());
        }
        parser.compute_mask().map(drop)
    }));
    let _ = done.send(());
    let cancelled = parser.cancellation_handle().is_some_and(|c| c.is_cancelled());
    let _ = watchdog.join();
    if cancelled {
        return Err(GrammarError::Invalid(format!(
            "the grammar takes longer than {} s of CPU time to prepare; simplify it",
            budget.as_secs()
        )));
    }
    match result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(GrammarError::Invalid(first_line(&e.to_string()))),
        Err(_) => return Err(GrammarError::Invalid("the grammar engine failed on this grammar".into())),
    }
    if let Some(e) = parser.error_message() {
        return Err(GrammarError::Invalid(first_line(&e)));
    }
    // A lexer that ran out of llguidance's budget may still give a (partial) first mask.
    if let Some(e) = parser.parser.get_error() {
        return Err(GrammarError::Invalid(first_line(&e.message())));
    }
    Ok(parser.parser.lexer_stats().num_bytes)
}

impl Grammars {
    /// The grammars of a model with `tokenizer` and `vocab` logits per token.
    pub fn new(tokenizer: Arc<Tokenizer>, vocab: usize) -> Grammars {
        let eos: Arc<[u32]> = tokenizer.eos_ids().into();
        Grammars {
            tokenizer,
            vocab,
            eos,
            factory: OnceLock::new(),
            cache: Arc::new(
                moka::sync::Cache::builder()
                    .max_capacity(CACHE_WEIGHT)
                    .weigher(|_: &GrammarSource, c: &Cached| c.weight)
                    .build(),
            ),
            compiled: Default::default(),
            hits: Default::default(),
        }
    }

    fn factory(&self) -> Result<&ParserFactory, GrammarError> {
        self.factory.get_or_init(|| build_factory(&self.tokenizer, &self.eos)).as_ref().map_err(Clone::clone)
    }

    /// Compiles `source` (blocking; cached by its text). Errors name the problem
    /// as llguidance reports it.
    pub fn compile(&self, source: &GrammarSource) -> Result<Grammar, GrammarError> {
        use std::sync::atomic::Ordering::Relaxed;
        if source.len() > MAX_GRAMMAR_BYTES {
            return Err(GrammarError::TooLarge { len: source.len(), limit: MAX_GRAMMAR_BYTES });
        }
        if let Some(c) = self.cache.get(source) {
            self.hits.fetch_add(1, Relaxed);
            metrics::counter!("cachet:grammar_cache_hits_total").increment(1);
            return Ok(c.grammar);
        }
        let start = Instant::now();
        let factory = self.factory()?;
        let (tag, text) = source.tag_and_text();
        let built = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let grammar = TopLevelGrammar::from_tagged_str(tag, text)?;
            factory.create_parser(grammar)
        }));
        let mut parser = match built {
            Ok(Ok(parser)) => parser,
            Ok(Err(e)) => return Err(GrammarError::Invalid(first_line(&e.to_string()))),
            Err(_) => return Err(GrammarError::Invalid("the grammar engine failed on this grammar".into())),
        };
        // The first mask, here (on the caller's thread, never the engine's) and within a time
        // budget: much of a grammar's lexer is built lazily, at its first mask, and a grammar
        // that cannot be built within llguidance's limits or the budget fails now, before it is
        // cached or reaches the engine.
        let held = match first_mask(&mut parser, FIRST_MASK_BUDGET) {
            Ok(held) => held,
            Err(e) => {
                drop(parser);
                release_freed_memory();
                return Err(e);
            }
        };
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::Invalid(first_line(&e)));
        }
        let (cache, key) = (Arc::downgrade(&self.cache), source.clone());
        let evict: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
            if let Some(cache) = cache.upgrade() {
                cache.invalidate(&key);
            }
        });
        let grammar = Grammar { start: Arc::new(matcher), vocab: self.vocab, eos: self.eos.clone(), evict };
        self.compiled.fetch_add(1, Relaxed);
        metrics::histogram!("cachet:grammar_compile_seconds").record(start.elapsed().as_secs_f64());
        self.cache.insert(source.clone(), Cached { grammar: grammar.clone(), weight: weight(source.len(), held) });
        Ok(grammar)
    }

    /// Whether `source` is compiled and cached.
    pub fn is_cached(&self, source: &GrammarSource) -> bool {
        self.cache.contains_key(source)
    }

    /// Drops every compiled grammar (for measuring cold compiles).
    pub fn clear_cache(&self) {
        self.cache.invalidate_all();
        self.cache.run_pending_tasks();
    }

    /// Compiles and cache hits so far.
    pub fn stats(&self) -> GrammarStats {
        use std::sync::atomic::Ordering::Relaxed;
        GrammarStats { compiled: self.compiled.load(Relaxed), cache_hits: self.hits.load(Relaxed) }
    }

    /// Time to build the tokenizer view (the first compile pays it once).
    pub fn warm_up(&self) -> Result<Duration, GrammarError> {
        let start = Instant::now();
        self.factory()?;
        Ok(start.elapsed())
    }
}

/// llguidance's errors run over several lines; the first says what is wrong.
fn first_line(s: &str) -> String {
    let s = s.trim();
    let line = s.lines().next().unwrap_or(s);
    if line.len() > 500 {
        let mut end = 500;
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &line[..end])
    } else {
        line.to_string()
    }
}

/// The tokenizer as llguidance sees it: every token's bytes (special tokens
/// behind toktrie's marker byte), tokenizing with our own tokenizer.
struct TokenizerView {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for TokenizerView {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<toktrie::TokenId> {
        match std::str::from_utf8(s) {
            Ok(text) => self.tokenizer.encode(text, false).unwrap_or_else(|_| self.trie.greedy_tokenize(s)),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

fn build_factory(tokenizer: &Arc<Tokenizer>, eos: &[u32]) -> Result<ParserFactory, GrammarError> {
    let unsupported = |m: String| GrammarError::Unsupported(m);
    let json = tokenizer.inner().to_string(false).map_err(|e| unsupported(e.to_string()))?;
    let json: serde_json::Value = serde_json::from_str(&json).map_err(|e| unsupported(e.to_string()))?;
    // llguidance's reader asserts on vocabularies it does not expect: a panic is an `Err` here.
    let mut words = std::panic::catch_unwind(|| llguidance::token_bytes_from_tokenizer_json(&json))
        .map_err(|_| unsupported("the tokenizer's vocabulary could not be read".into()))?
        .map_err(|e| unsupported(e.to_string()))?;
    let size = tokenizer.vocab_size().max(words.len());
    words.resize(size, Vec::new());
    let first_eos =
        *eos.first().ok_or_else(|| unsupported("the tokenizer declares no end-of-sequence token".into()))?;
    let mut info = TokRxInfo::new(size as u32, first_eos);
    info.tok_bos = tokenizer.bos_id();
    let trie = std::panic::catch_unwind(|| TokTrie::from(&info, &words).with_eos_tokens(eos))
        .map_err(|_| unsupported("the tokenizer's vocabulary could not be indexed".into()))?;
    let env: TokEnv = Arc::new(TokenizerView { trie, tokenizer: tokenizer.clone() });
    let mut factory = ParserFactory::new_simple(&env).map_err(|e| unsupported(e.to_string()))?;
    factory.quiet();
    // Errors in one line, without the parser's state and grammar (they reach the client).
    factory.limits_mut().verbose_errors = false;
    factory.limits_mut().max_lexer_states = MAX_LEXER_STATES;
    Ok(factory)
}

#[cfg(test)]
mod tests;
