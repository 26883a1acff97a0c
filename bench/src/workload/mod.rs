//! Workloads: nine named scenarios, eight of them built from real source text (one of those a
//! tool-call request of its own), one a replay of requests recorded from real agent
//! clients ([`trace`]), plus the arrival process that starts them.
//!
//! Sizes are in *approximate tokens*: the client has no tokenizer, so it
//! counts [`CHARS_PER_TOKEN`] (4) characters per token, about right for code
//! with BPE tokenizers of current models. The server-reported
//! `prompt_tokens` is recorded next to the estimate.
//!
//! Everything is deterministic for a seed and a repository state: the same
//! seed gives the same prompts and the same arrival schedule.

mod scenarios;
pub(crate) use scenarios::lone_prompt;
pub mod source;
pub mod trace;

use crate::arrival::{open_schedule, Arrival, Burst};
use crate::client::{HttpRequest, Message};
use crate::error::BenchError;
use crate::workload::source::SourceCorpus;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Characters per approximate token.
pub const CHARS_PER_TOKEN: usize = 4;

/// Open-loop scenarios calibrated to a machine ([`ScenarioSpec::at_capacity`]) arrive at this
/// share of what it serves one request at a time (the burst comes on top).
pub const PEAK_LOAD: f64 = 0.8;

/// The approximate token count of `text`: characters / 4, rounded up.
pub fn approx_tokens(text: &str) -> usize {
    text.chars().count().div_ceil(CHARS_PER_TOKEN)
}

/// The nine workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// Sessions asking follow-ups over the same repository context.
    RepeatedContext,
    /// Single prompts with little shared context.
    Unrelated,
    /// Very long inputs, short outputs.
    LongInput,
    /// Short inputs, long outputs.
    LongOutput,
    /// Poisson steady load plus a burst well above it.
    Peak,
    /// Agent sessions whose context grows with tool output and diffs.
    Agent,
    /// Several concurrent agents, each replaying a session recorded from a real agent client
    /// (system prompt, tool list, tool calls and results as the client sent them).
    AgentTrace,
    /// A real file asked back whole with a small change (a rename, comments, doc comments): what
    /// an agent's `write_file` after an edit looks like, where most of the answer repeats the
    /// prompt (what speculative decoding is for).
    CodeEdit,
    /// The same edit as an agent's tool call: the whole new file as the `content` argument of a
    /// required `write_file` call, so the answer is JSON under the tool-call grammar (the file
    /// JSON-escaped), streamed as tool-call argument deltas.
    CodeEditTools,
}

impl Scenario {
    /// All nine, in report order.
    pub const ALL: [Scenario; 9] = [
        Scenario::RepeatedContext,
        Scenario::Unrelated,
        Scenario::LongInput,
        Scenario::LongOutput,
        Scenario::Peak,
        Scenario::Agent,
        Scenario::AgentTrace,
        Scenario::CodeEdit,
        Scenario::CodeEditTools,
    ];

    /// The command-line name (`repeated-context`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Scenario::RepeatedContext => "repeated-context",
            Scenario::Unrelated => "unrelated",
            Scenario::LongInput => "long-input",
            Scenario::LongOutput => "long-output",
            Scenario::Peak => "peak",
            Scenario::Agent => "agent",
            Scenario::AgentTrace => "agent-trace",
            Scenario::CodeEdit => "code-edit",
            Scenario::CodeEditTools => "code-edit-tools",
        }
    }

    /// Parses a comma-separated list of names, or `all`.
    ///
    /// # Errors
    /// [`BenchError::InvalidArgument`] naming an unknown scenario.
    pub fn parse_list(list: &str) -> Result<Vec<Scenario>, BenchError> {
        if list.trim() == "all" {
            return Ok(Scenario::ALL.to_vec());
        }
        let mut out = Vec::new();
        for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let s: Scenario = name.parse()?;
            if !out.contains(&s) {
                out.push(s);
            }
        }
        if out.is_empty() {
            return Err(BenchError::InvalidArgument("no scenario given".into()));
        }
        Ok(out)
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Scenario {
    type Err = BenchError;

    fn from_str(s: &str) -> Result<Scenario, BenchError> {
        Scenario::ALL.into_iter().find(|x| x.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Scenario::ALL.iter().map(|x| x.name()).collect();
            BenchError::InvalidArgument(format!("unknown scenario {s:?} (known: {}, all)", names.join(", ")))
        })
    }
}

/// A scenario's parameters. What each size means depends on the scenario
/// (see [`ScenarioSpec::defaults`]); all sizes are approximate tokens.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScenarioSpec {
    /// Which workload.
    pub scenario: Scenario,
    /// Conversations (sessions, or single requests). Open loop: the steady
    /// Poisson arrivals; bursts add their own.
    pub conversations: usize,
    /// Requests per conversation.
    pub turns: usize,
    /// The shared or initial context: the repository context of
    /// `repeated-context`, the initial file of each `agent` session.
    pub shared_tokens: usize,
    /// Per-request new input: the question, the excerpt, the tool output.
    pub prompt_tokens: usize,
    /// `max_tokens` of every request.
    pub max_tokens: u32,
    /// Send `ignore_eos` so outputs are exactly `max_tokens` long.
    pub ignore_eos: bool,
    /// How conversations start.
    pub arrival: Arrival,
}

impl ScenarioSpec {
    /// The defaults, sized for a 0.5B model on a 2-core CPU (roughly 1-3
    /// minutes per system):
    ///
    /// | scenario | requests | input | output | arrival |
    /// |---|---|---|---|---|
    /// | repeated-context | 4 sessions x 3 turns | 1,600 shared + 48 question | 32 | closed, 2 users |
    /// | unrelated | 8 | 800 | 32 | closed, 2 users |
    /// | long-input | 4 | 3,000 | 16 | closed, 2 users |
    /// | long-output | 4 | 96 | 256 | closed, 4 users |
    /// | peak | 8 Poisson + 16 burst | 600 | 32 | open, 0.2/s, burst at 10 s |
    /// | agent | 2 sessions x 4 turns | 800 initial + 400 per tool output | 32 | closed, 2 users |
    /// | agent-trace | 6 agents x up to 8 recorded requests | as recorded | at most 64 | closed, 3 users |
    /// | code-edit | 4 | a file of up to 600 + the change asked | the file back, at most 384 | closed, 2 users |
    /// | code-edit-tools | 4 | the same, with a `write_file` tool | one `write_file` call, at most 384 | closed, 2 users |
    ///
    /// `agent-trace` replays the recorded sessions of its trace in turn (agent `i` replays
    /// session `i mod sessions`); its `turns` caps the requests replayed per agent and its
    /// `max_tokens` caps each request's own limit.
    pub fn defaults(scenario: Scenario) -> ScenarioSpec {
        let closed = |users| Arrival::Closed { users };
        let spec = |conversations, turns, shared_tokens, prompt_tokens, max_tokens, arrival| ScenarioSpec {
            scenario,
            conversations,
            turns,
            shared_tokens,
            prompt_tokens,
            max_tokens,
            ignore_eos: true,
            arrival,
        };
        match scenario {
            Scenario::RepeatedContext => spec(4, 3, 1600, 48, 32, closed(2)),
            Scenario::Unrelated => spec(8, 1, 0, 800, 32, closed(2)),
            Scenario::LongInput => spec(4, 1, 0, 3000, 16, closed(2)),
            Scenario::LongOutput => spec(4, 1, 0, 96, 256, closed(4)),
            Scenario::Peak => spec(
                8,
                1,
                0,
                600,
                32,
                Arrival::Open { rate_per_s: 0.2, bursts: vec![Burst { at_s: 10.0, count: 16 }], max_in_flight: None },
            ),
            Scenario::Agent => spec(2, 4, 800, 400, 32, closed(2)),
            Scenario::AgentTrace => ScenarioSpec { ignore_eos: false, ..spec(6, 8, 0, 0, 64, closed(3)) },
            // The answer ends where the file does.
            Scenario::CodeEdit | Scenario::CodeEditTools => {
                ScenarioSpec { ignore_eos: false, ..spec(4, 1, 0, 600, 384, closed(2)) }
            }
        }
    }

    /// This spec with its open-loop arrivals scaled to a machine that serves `capacity`
    /// requests per second one at a time: Poisson arrivals at [`PEAK_LOAD`] times that, the
    /// bursts (same sizes) at the same point of the schedule as the defaults' (2 mean gaps
    /// in). A closed loop clocks itself and is unchanged.
    pub fn at_capacity(mut self, capacity: f64) -> ScenarioSpec {
        if let Arrival::Open { rate_per_s, bursts, .. } = &mut self.arrival {
            if capacity.is_finite() && capacity > 0.0 {
                *rate_per_s = PEAK_LOAD * capacity;
                for b in bursts {
                    b.at_s = 2.0 / *rate_per_s;
                }
            }
        }
        self
    }

    /// This spec with request counts (conversations, burst sizes) times
    /// `count` and input sizes times `size`, each at least 1.
    pub fn scaled(mut self, count: f64, size: f64) -> ScenarioSpec {
        let scale = |n: usize, f: f64| ((n as f64 * f).round() as usize).max(1);
        self.conversations = scale(self.conversations, count);
        if let Arrival::Open { bursts, .. } = &mut self.arrival {
            for b in bursts {
                b.count = scale(b.count, count);
            }
        }
        if self.shared_tokens > 0 {
            self.shared_tokens = scale(self.shared_tokens, size);
        }
        if self.prompt_tokens > 0 {
            self.prompt_tokens = scale(self.prompt_tokens, size);
        }
        self
    }

    /// Total requests the workload sends (for `agent-trace`, at most this many: sessions may
    /// be shorter).
    pub fn requests(&self) -> usize {
        let burst: usize = match &self.arrival {
            Arrival::Open { bursts, .. } => bursts.iter().map(|b| b.count).sum(),
            Arrival::Closed { .. } => 0,
        };
        (self.conversations + burst) * self.turns
    }

    /// A one-line description for reports.
    pub fn describe(&self) -> String {
        let shape = match self.scenario {
            Scenario::RepeatedContext => format!(
                "{} session(s) x {} turns; shared repository context ~{} tok, question ~{} tok",
                self.conversations, self.turns, self.shared_tokens, self.prompt_tokens
            ),
            Scenario::Agent => format!(
                "{} session(s) x {} turns; initial context ~{} tok, tool output / diff ~{} tok per turn",
                self.conversations, self.turns, self.shared_tokens, self.prompt_tokens
            ),
            Scenario::AgentTrace => format!(
                "{} agent(s), each replaying a recorded agent-client session (up to {} requests, as recorded)",
                self.conversations, self.turns
            ),
            Scenario::CodeEdit => format!(
                "{} file(s) of up to ~{} tok asked back whole with a small change",
                self.conversations, self.prompt_tokens
            ),
            Scenario::CodeEditTools => format!(
                "{} file(s) of up to ~{} tok asked back whole with a small change, as one required `write_file` call",
                self.conversations, self.prompt_tokens
            ),
            _ => format!("{} prompts of ~{} tok", self.conversations, self.prompt_tokens),
        };
        format!(
            "{shape}; max_tokens {}{}{}; {}",
            if self.scenario == Scenario::AgentTrace { "at most " } else { "" },
            self.max_tokens,
            if self.ignore_eos { " (ignore_eos)" } else { "" },
            self.arrival.describe()
        )
    }

    /// Checks the spec can be run.
    ///
    /// # Errors
    /// [`BenchError::InvalidArgument`] saying what is wrong.
    pub fn validate(&self) -> Result<(), BenchError> {
        let bad = |m: &str| Err(BenchError::InvalidArgument(format!("{}: {m}", self.scenario)));
        if self.conversations == 0 || self.turns == 0 {
            return bad("conversations and turns must be at least 1");
        }
        if self.max_tokens == 0 {
            return bad("max_tokens must be at least 1");
        }
        match &self.arrival {
            Arrival::Closed { users: 0 } => bad("a closed loop needs at least 1 user"),
            Arrival::Open { rate_per_s, .. } if !(rate_per_s.is_finite() && *rate_per_s > 0.0) => {
                bad("the arrival rate must be positive")
            }
            Arrival::Open { max_in_flight: Some(0), .. } => bad("max_in_flight must be at least 1"),
            _ => Ok(()),
        }
    }
}

/// Open loop: when each conversation of `spec` starts (seconds from the scenario's start,
/// ascending). Closed loop: `None`.
fn start_times(spec: &ScenarioSpec, seed: u64) -> Option<Vec<f64>> {
    match &spec.arrival {
        Arrival::Closed { .. } => None,
        Arrival::Open { rate_per_s, bursts, .. } => Some(open_schedule(*rate_per_s, spec.conversations, bursts, seed)),
    }
}

/// One conversation: a preamble, then one user message per turn. Turn `k > 0`
/// is sent after the assistant's answer to turn `k - 1` is appended. A
/// replayed agent session (`agent-trace`) is a list of recorded requests
/// instead, each sent when the one before it has ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Conversation {
    /// Messages before the first user message (system prompt, shared context).
    pub preamble: Vec<Message>,
    /// The user message of each turn.
    pub turns: Vec<String>,
    /// Recorded requests, sent in order before any `turns`.
    pub replay: Vec<HttpRequest>,
}

impl Conversation {
    /// The messages of the first turn.
    pub fn first_messages(&self) -> Vec<Message> {
        let mut m = self.preamble.clone();
        if let Some(t) = self.turns.first() {
            m.push(Message::new("user", t.clone()));
        }
        m
    }
}

/// A scenario made concrete: its conversations and, for an open loop, when
/// each starts.
#[derive(Clone, Debug)]
pub struct Workload {
    /// The parameters it was built from.
    pub spec: ScenarioSpec,
    /// The seed it was built with.
    pub seed: u64,
    /// The conversations.
    pub conversations: Vec<Conversation>,
    /// Open loop: each conversation's start (seconds from the scenario's
    /// start), ascending. Closed loop: `None`.
    pub start_times_s: Option<Vec<f64>>,
}

impl Workload {
    /// Builds `spec`'s workload from `corpus`, deterministically for `seed`.
    ///
    /// # Errors
    /// [`BenchError::InvalidArgument`] for an invalid spec.
    ///
    /// `agent-trace` is built from the trace committed with the benchmark
    /// ([`trace::Trace::embedded`]); [`Workload::from_trace`] takes another.
    pub fn build(spec: &ScenarioSpec, corpus: &SourceCorpus, seed: u64) -> Result<Workload, BenchError> {
        if spec.scenario == Scenario::AgentTrace {
            return Workload::from_trace(spec, &trace::Trace::embedded()?, seed);
        }
        spec.validate()?;
        let start_times_s = start_times(spec, seed);
        let count = start_times_s.as_ref().map_or(spec.conversations, Vec::len);
        let conversations = (0..count).map(|i| scenarios::conversation(spec, corpus, seed, i)).collect();
        Ok(Workload { spec: spec.clone(), seed, conversations, start_times_s })
    }

    /// The `agent-trace` workload of `trace`: `spec.conversations` agents, agent `i` replaying
    /// session `i mod sessions` (at most `spec.turns` of its requests, each `max_tokens` at most
    /// `spec.max_tokens`), marked as its own user ([`trace::prepare`]).
    ///
    /// # Errors
    /// [`BenchError::InvalidArgument`] for an invalid spec or a trace without sessions.
    pub fn from_trace(spec: &ScenarioSpec, trace: &trace::Trace, seed: u64) -> Result<Workload, BenchError> {
        spec.validate()?;
        if trace.sessions.is_empty() {
            return Err(BenchError::InvalidArgument("the agent trace has no replayable requests".into()));
        }
        let start_times_s = start_times(spec, seed);
        let count = start_times_s.as_ref().map_or(spec.conversations, Vec::len);
        let conversations = (0..count)
            .map(|i| {
                let session = &trace.sessions[i % trace.sessions.len()];
                let replay =
                    session.requests.iter().take(spec.turns).map(|r| trace::prepare(r, i, spec.max_tokens)).collect();
                Conversation { preamble: Vec::new(), turns: Vec::new(), replay }
            })
            .collect();
        Ok(Workload { spec: spec.clone(), seed, conversations, start_times_s })
    }

    /// The median size (approximate tokens) of the conversations' first requests: what a
    /// request of this workload that finds nothing cached must compute.
    pub fn first_request_tokens(&self) -> usize {
        let mut sizes: Vec<usize> = self
            .conversations
            .iter()
            .map(|c| match c.replay.first() {
                Some(r) => r.approx_prompt_tokens as usize,
                None => c.first_messages().iter().map(|m| approx_tokens(&m.content)).sum(),
            })
            .collect();
        sizes.sort_unstable();
        sizes.get(sizes.len() / 2).copied().unwrap_or(0)
    }

    /// Total requests.
    pub fn requests(&self) -> usize {
        self.conversations.iter().map(|c| c.turns.len() + c.replay.len()).sum()
    }
}

#[cfg(test)]
mod tests;
