//! `[disagg]`: prefill/decode disaggregation settings (see `docs/deployment.md`).

use serde::Deserialize;

/// What a server does with a request's prompt (`[disagg] role`, `cachet serve --role`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Prefill and decode here (the default).
    #[default]
    Unified,
    /// Also compute prompts' K/V for decode servers (`POST /v1/internal/prefill`); serves the API
    /// as a unified server does.
    Prefill,
    /// Have a prefill server compute the K/V of a request's uncached whole chunks, receive them,
    /// and decode here; prefill locally when no prefill server answers.
    Decode,
}

impl std::str::FromStr for Role {
    type Err = cachet_tenants::UnknownWord;
    fn from_str(s: &str) -> Result<Role, cachet_tenants::UnknownWord> {
        match s {
            "unified" => Ok(Role::Unified),
            "prefill" => Ok(Role::Prefill),
            "decode" => Ok(Role::Decode),
            _ => Err(cachet_tenants::UnknownWord {
                what: "role",
                input: s.chars().take(64).collect(),
                expected: "unified prefill decode",
            }),
        }
    }
}

/// When a decode server reserves the K/V slots of a request whose prompt a prefill server
/// computes (`[disagg] reserve`; SGLang's two policies).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reserve {
    /// When the transfer is complete: the chunks go into the disk tier as they arrive and the
    /// request enters the engine at the end, which loads them. A long prefill holds no decode
    /// memory.
    #[default]
    PrefillComplete,
    /// At once: the request enters the engine, which reserves its prompt's slots and copies each
    /// chunk into them as it arrives. Decode memory is held for the whole remote prefill; nothing
    /// is left to load at the end.
    Early,
}

/// Prefill/decode disaggregation (`[disagg]`; see `docs/deployment.md`).
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DisaggSettings {
    /// This server's role.
    pub role: Role,
    /// When a decode server reserves a request's K/V slots.
    pub reserve: Reserve,
    /// The prefill servers a decode server asks (`http://prefill-0:8080`); a request goes to the
    /// one its first chunk's key picks, so that requests sharing a prefix meet the same cache.
    pub prefill_urls: Vec<String>,
    /// Uncached prompt tokens (in whole chunks) below which a decode server prefills locally: a
    /// short prompt costs less to compute than to send for.
    pub min_remote_tokens: usize,
    /// The longest a remote prefill and its transfer may take before the request computes what it
    /// did not get locally.
    pub timeout_secs: u64,
}

impl Default for DisaggSettings {
    fn default() -> Self {
        DisaggSettings {
            role: Role::Unified,
            reserve: Reserve::PrefillComplete,
            prefill_urls: Vec::new(),
            min_remote_tokens: 256,
            timeout_secs: 120,
        }
    }
}
