//! Prompt builders against the workspace's own repository.

use super::*;
use std::path::Path;

/// The workspace's own repository.
fn corpus() -> SourceCorpus {
    SourceCorpus::open(&Path::new(env!("CARGO_MANIFEST_DIR")).join("..")).expect("the workspace is a git repository")
}

fn all_text(w: &Workload) -> Vec<String> {
    w.conversations
        .iter()
        .map(|c| {
            let mut s: String = c.preamble.iter().map(|m| m.content.as_str()).collect();
            for t in &c.turns {
                s.push_str(t);
            }
            for r in &c.replay {
                for m in r.body["messages"].as_array().into_iter().flatten() {
                    s.push_str(m["content"].as_str().unwrap_or_default());
                }
            }
            s
        })
        .collect()
}

/// Whether most long lines of `text` are lines of HEAD's files (the rest may
/// come from older commits or diffs): the prompt is real source text.
fn from_source(corpus: &SourceCorpus, history: &str, text: &str) -> bool {
    let lines: Vec<&str> = text.lines().filter(|l| l.trim().len() >= 12 && !l.contains('`')).collect();
    let found =
        lines.iter().filter(|l| corpus.files().iter().any(|f| f.text.contains(**l)) || history.contains(**l)).count();
    !lines.is_empty() && found * 2 >= lines.len()
}

/// Every line the repository's first-parent history ever had (its patches): files read at older
/// commits and diffs are source text too, though not at HEAD.
fn history(corpus: &SourceCorpus) -> String {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(corpus.root())
        .args(["log", "-p", "--first-parent", "--format="])
        .output()
        .expect("git runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn common_prefix(a: &str, b: &str) -> usize {
    a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count()
}

#[test]
fn every_scenario_is_deterministic_for_a_seed_and_built_of_real_source() {
    let corpus = corpus();
    let history = history(&corpus);
    // agent-trace replays recorded requests: its own tests are in `trace` and below.
    for s in Scenario::ALL.into_iter().filter(|s| *s != Scenario::AgentTrace) {
        let spec = ScenarioSpec::defaults(s);
        let a = Workload::build(&spec, &corpus, 7).unwrap();
        let b = Workload::build(&spec, &corpus, 7).unwrap();
        assert_eq!(a.conversations, b.conversations, "{s}");
        assert_eq!(a.start_times_s, b.start_times_s, "{s}");
        assert_eq!(a.requests(), spec.requests(), "{s}");
        let c = Workload::build(&spec, &corpus, 8).unwrap();
        assert_ne!(a.conversations, c.conversations, "{s}: another seed, other prompts");
        for text in all_text(&a) {
            assert!(from_source(&corpus, &history, &text), "{s}: not source text: {text:.300}");
            assert!(!text.to_lowercase().contains("lorem ipsum"));
        }
    }
}

#[test]
fn prompts_are_roughly_the_requested_size() {
    let corpus = corpus();
    let within = |got: usize, want: usize| got * 10 >= want * 6 && got * 10 <= want * 14;
    for s in [Scenario::Unrelated, Scenario::LongInput, Scenario::LongOutput, Scenario::Peak] {
        let spec = ScenarioSpec::defaults(s);
        let w = Workload::build(&spec, &corpus, 3).unwrap();
        for c in &w.conversations {
            let n = approx_tokens(&c.turns[0]);
            assert!(within(n, spec.prompt_tokens), "{s}: {n} tokens, wanted ~{}", spec.prompt_tokens);
        }
    }
    let spec = ScenarioSpec::defaults(Scenario::RepeatedContext);
    let w = Workload::build(&spec, &corpus, 3).unwrap();
    let context = approx_tokens(&w.conversations[0].preamble[0].content);
    assert!(within(context, spec.shared_tokens), "context {context} tokens");
    for t in &w.conversations[0].turns {
        assert!(within(approx_tokens(t), spec.prompt_tokens), "question {} tokens", approx_tokens(t));
    }
    // Agent: tool outputs are at most about the requested size, and the context grows.
    let spec = ScenarioSpec::defaults(Scenario::Agent);
    let w = Workload::build(&spec, &corpus, 3).unwrap();
    for c in &w.conversations {
        assert_eq!(c.turns.len(), spec.turns);
        for t in &c.turns[1..] {
            assert!(approx_tokens(t) <= spec.prompt_tokens + 40, "tool output {} tokens", approx_tokens(t));
        }
    }
}

#[test]
fn repeated_context_shares_its_prefix_and_unrelated_does_not() {
    let corpus = corpus();
    let spec = ScenarioSpec::defaults(Scenario::RepeatedContext);
    let w = Workload::build(&spec, &corpus, 11).unwrap();
    let first = &w.conversations[0].first_messages();
    for c in &w.conversations[1..] {
        let m = c.first_messages();
        assert_eq!(m[0], first[0], "the same system message (repository context)");
        assert_ne!(m[1], first[1], "each session asks its own question");
    }
    assert!(approx_tokens(&first[0].content) > 1000);

    let w = Workload::build(&ScenarioSpec::defaults(Scenario::Unrelated), &corpus, 11).unwrap();
    let texts: Vec<&String> = w.conversations.iter().map(|c| &c.turns[0]).collect();
    for (i, a) in texts.iter().enumerate() {
        for b in &texts[i + 1..] {
            assert!(common_prefix(a, b) < 100, "unrelated prompts share {} bytes", common_prefix(a, b));
        }
    }
}

#[test]
fn agent_turns_carry_diffs_and_files() {
    let corpus = corpus();
    assert!(corpus.commit_count() > 0, "the workspace has history");
    let w = Workload::build(&ScenarioSpec::defaults(Scenario::Agent), &corpus, 5).unwrap();
    let turns: Vec<&String> = w.conversations.iter().flat_map(|c| &c.turns).collect();
    assert!(turns.iter().any(|t| t.contains("Tool result (git_diff)") && t.contains("\n@@")), "a real diff");
    assert!(turns.iter().filter(|t| t.contains("Tool result (read_file")).count() >= 2);
}

#[test]
fn open_loop_workloads_start_on_the_schedule() {
    let corpus = corpus();
    let spec = ScenarioSpec::defaults(Scenario::Peak);
    let w = Workload::build(&spec, &corpus, 1).unwrap();
    let times = w.start_times_s.as_ref().unwrap();
    assert_eq!(times.len(), 8 + 16);
    assert_eq!(w.conversations.len(), times.len());
    assert_eq!(times.iter().filter(|&&t| t == 10.0).count(), 16);
}

#[test]
fn open_loops_scale_to_the_machine_and_calibration_sizes_follow_first_requests() {
    // A machine serving 0.5 requests/s alone: arrivals at 0.4/s, the burst 2 mean gaps in (5 s).
    let spec = ScenarioSpec::defaults(Scenario::Peak).at_capacity(0.5);
    match &spec.arrival {
        Arrival::Open { rate_per_s, bursts, .. } => {
            assert!((rate_per_s - 0.4).abs() < 1e-12);
            assert_eq!((bursts[0].at_s, bursts[0].count), (5.0, 16));
        }
        other => panic!("{other:?}"),
    }
    // The defaults' own rate is the same point on a machine of capacity 0.25/s.
    assert_eq!(ScenarioSpec::defaults(Scenario::Peak).at_capacity(0.25), ScenarioSpec::defaults(Scenario::Peak));
    let closed = ScenarioSpec::defaults(Scenario::Agent);
    assert_eq!(closed.clone().at_capacity(3.0), closed);
    assert_eq!(ScenarioSpec::defaults(Scenario::Peak).at_capacity(0.0), ScenarioSpec::defaults(Scenario::Peak));

    let corpus = corpus();
    let w = Workload::build(&ScenarioSpec::defaults(Scenario::RepeatedContext), &corpus, 1).unwrap();
    // Shared context (~1,600) and the first question (~48) plus the system prompt's line.
    let n = w.first_request_tokens();
    assert!((1600..1800).contains(&n), "{n}");
    let lone = lone_prompt(&corpus, 1, "x", 600);
    assert!((500..=620).contains(&approx_tokens(&lone)), "{}", approx_tokens(&lone));
    assert_ne!(lone, lone_prompt(&corpus, 1, "y", 600));
}

#[test]
fn scaling_and_parsing() {
    let spec = ScenarioSpec::defaults(Scenario::Peak).scaled(0.5, 0.25);
    assert_eq!(spec.conversations, 4);
    assert_eq!(spec.requests(), 4 + 8);
    assert_eq!(spec.prompt_tokens, 150);
    assert_eq!(Scenario::parse_list("all").unwrap().len(), 9);
    assert_eq!(Scenario::parse_list("agent-trace").unwrap(), vec![Scenario::AgentTrace]);
    assert_eq!(Scenario::parse_list("peak, agent,peak").unwrap(), vec![Scenario::Peak, Scenario::Agent]);
    assert!(Scenario::parse_list("nope").is_err());
    assert!(ScenarioSpec { turns: 0, ..ScenarioSpec::defaults(Scenario::Agent) }.validate().is_err());
}

#[test]
fn agent_trace_agents_replay_the_sessions_in_turn_each_as_its_own_user() {
    let text = concat!(
        r#"{"t": 0, "client": "a", "session": "a/1", "path": "/v1/chat/completions", "body": {"messages": [{"role": "system", "content": "tools"}, {"role": "user", "content": "t1"}]}}"#,
        "\n",
        r#"{"t": 1, "client": "a", "session": "a/1", "path": "/v1/chat/completions", "body": {"messages": [{"role": "system", "content": "tools"}, {"role": "user", "content": "t1"}, {"role": "tool", "content": "r"}]}}"#,
        "\n",
        r#"{"t": 0, "client": "b", "session": "b/1", "path": "/v1/completions", "body": {"prompt": "p"}}"#,
        "\n",
    );
    let trace = trace::Trace::parse(text).unwrap();
    let spec = ScenarioSpec { conversations: 3, ..ScenarioSpec::defaults(Scenario::AgentTrace) };
    let w = Workload::from_trace(&spec, &trace, 0).unwrap();
    let lens: Vec<usize> = w.conversations.iter().map(|c| c.replay.len()).collect();
    assert_eq!(lens, vec![2, 1, 2]);
    assert_eq!(w.requests(), 5);
    // Agents 0 and 2 replay the same session as two users: the system prompt is shared, the task is not.
    let (a, b) = (&w.conversations[0].replay[1].body, &w.conversations[2].replay[1].body);
    assert_eq!(a["messages"][0], b["messages"][0]);
    assert_ne!(a["messages"][1], b["messages"][1]);
    // Within one agent, every request starts with the one before it.
    assert_eq!(w.conversations[0].replay[0].body["messages"][1], a["messages"][1]);
    // turns caps the requests of an agent.
    let short = Workload::from_trace(&ScenarioSpec { turns: 1, ..spec.clone() }, &trace, 0).unwrap();
    assert_eq!(short.requests(), 3);
    assert!(Workload::from_trace(&spec, &trace::Trace::parse("").unwrap(), 0).is_err());
    // The default build uses the committed trace.
    let corpus = corpus();
    let w = Workload::build(&ScenarioSpec::defaults(Scenario::AgentTrace), &corpus, 0).unwrap();
    assert!(w.requests() > 0 && w.requests() <= ScenarioSpec::defaults(Scenario::AgentTrace).requests());
}

#[test]
fn a_code_edit_asks_for_a_real_file_back_with_a_change() {
    let corpus = corpus();
    let spec = ScenarioSpec::defaults(Scenario::CodeEdit);
    assert!(!spec.ignore_eos, "the answer ends where the file does");
    let w = Workload::build(&spec, &corpus, 5).unwrap();
    assert_eq!(w.requests(), 4);
    for c in &w.conversations {
        let t = &c.turns[0];
        let (path, rest) = t.strip_prefix("Here is `").unwrap().split_once("`:\n```\n").unwrap();
        let (code, ask) = rest.rsplit_once("```\n").unwrap();
        let file = corpus.files().iter().find(|f| f.path == path).expect("a file of the corpus");
        assert!(file.text.starts_with(code), "{path}: not the start of the file");
        assert!(approx_tokens(code) <= spec.prompt_tokens, "{path}: {} tokens", approx_tokens(code));
        assert!(ask.ends_with("Answer with the whole new file in one fenced code block and nothing else."), "{ask}");
    }
}

#[test]
fn a_tool_call_code_edit_asks_for_one_write_file_call_with_the_file() {
    let corpus = corpus();
    let spec = ScenarioSpec::defaults(Scenario::CodeEditTools);
    let w = Workload::build(&spec, &corpus, 5).unwrap();
    assert_eq!(w.requests(), 4);
    for c in &w.conversations {
        assert!(c.turns.is_empty() && c.replay.len() == 1, "one request, sent as built");
        let r = &c.replay[0];
        assert_eq!(r.path, "/v1/chat/completions");
        let b = &r.body;
        assert_eq!(b["tools"][0]["function"]["name"], "write_file");
        assert_eq!(b["tools"][0]["function"]["parameters"]["required"], serde_json::json!(["path", "content"]));
        assert_eq!((b["tool_choice"].as_str(), b["parallel_tool_calls"].as_bool()), (Some("required"), Some(false)));
        assert_eq!((b["stream"].as_bool(), b["max_tokens"].as_u64()), (Some(true), Some(u64::from(spec.max_tokens))));
        let user = b["messages"][1]["content"].as_str().unwrap();
        let (path, rest) = user.strip_prefix("Here is `").unwrap().split_once("`:\n```\n").unwrap();
        let (code, ask) = rest.rsplit_once("```\n").unwrap();
        let file = corpus.files().iter().find(|f| f.path == path).expect("a file of the corpus");
        assert!(file.text.starts_with(code), "{path}: not the start of the file");
        assert!(ask.ends_with("Write the whole new file with write_file."), "{ask}");
        assert!(r.approx_prompt_tokens as usize >= approx_tokens(code), "the estimate counts the file");
    }
}
