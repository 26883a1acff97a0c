//! The closed sets of words a row stores in a `text` column — a request's endpoint, status,
//! finish reason and SLO class; a task's and a repository's status; a turn's role — as enums
//! mapped by `sqlx::Type` (an unknown word in a row is a decode error, never a silent default)
//! and by serde (the same words in JSON).

/// The error of parsing one of these words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {input:?} (expected one of: {expected})")]
pub struct UnknownWord {
    /// What the word names (`"endpoint"`, `"task status"`, …).
    pub what: &'static str,
    /// The rejected word, cut to its first 64 characters.
    pub input: String,
    /// The words accepted, comma-separated.
    pub expected: &'static str,
}

/// An enum stored as one of a few words in a `text` column.
macro_rules! text_enum {
    ($(#[$doc:meta])* $name:ident, $what:literal {
        $($(#[$vdoc:meta])* $variant:ident = $text:literal),+ $(,)?
    }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, sqlx::Type)]
        #[sqlx(type_name = "text")]
        pub enum $name {
            $($(#[$vdoc])* #[serde(rename = $text)] #[sqlx(rename = $text)] $variant),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The word stored and sent for it.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = $crate::words::UnknownWord;

            fn from_str(s: &str) -> Result<$name, $crate::words::UnknownWord> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err($crate::words::UnknownWord {
                        what: $what,
                        input: s.chars().take(64).collect(),
                        expected: concat!($($text, " "),+).trim_ascii_end(),
                    }),
                }
            }
        }
    };
}
pub(crate) use text_enum;

text_enum!(
    /// The API endpoint a request came through (the ledger's `endpoint`).
    Endpoint, "endpoint" {
        /// `POST /v1/chat/completions`.
        ChatCompletions = "chat.completions",
        /// `POST /v1/completions`.
        Completions = "completions",
        /// `POST /v1/sessions/{id}/messages`.
        SessionMessages = "sessions.messages",
        /// `POST /v1/responses`.
        Responses = "responses",
    }
);

text_enum!(
    /// Where a ledger row stands: `running` from admission (updated as tokens stream), then how
    /// the request ended.
    RequestStatus, "request status" {
        Running = "running",
        Ok = "ok",
        Cancelled = "cancelled",
        Error = "error",
        /// Left `running` by a process that died: the sweeper marks it so once it has not moved
        /// for a while (what was streamed stays billed).
        Interrupted = "interrupted",
    }
);

text_enum!(
    /// Why generation stopped.
    FinishReason, "finish reason" {
        /// A stop token or stop sequence.
        Stop = "stop",
        /// The token limit.
        Length = "length",
        /// The answer ended with tool calls (the model stopped after them).
        ToolCalls = "tool_calls",
    }
);

text_enum!(
    /// The SLO class a request ran under.
    SloClass, "SLO class" {
        Interactive = "interactive",
        Batch = "batch",
    }
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_an_unknown_one_is_refused_with_the_choices() {
        for e in Endpoint::ALL {
            assert_eq!(e.as_str().parse::<Endpoint>().unwrap(), *e);
            assert_eq!(serde_json::to_string(e).unwrap(), format!("\"{e}\""));
        }
        assert_eq!(serde_json::from_str::<RequestStatus>("\"cancelled\"").unwrap(), RequestStatus::Cancelled);
        let err = "chat".parse::<Endpoint>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown endpoint \"chat\" (expected one of: chat.completions completions sessions.messages responses)"
        );
        assert!(serde_json::from_str::<SloClass>("\"fast\"").is_err());
    }
}
