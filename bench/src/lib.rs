//! cachet-bench: replays coding-agent workloads against any OpenAI-compatible
//! endpoint. Not built yet: see the "cachet-bench" issue.
