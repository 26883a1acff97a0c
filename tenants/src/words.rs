//! The closed sets of words a row stores in a `text` column — a request's endpoint and status;
//! a task's and a repository's status; a turn's role — as enums mapped to the column (an unknown
//! word in a row is a decode error, never a silent default) and by serde (the same words in
//! JSON), made by [`cachet_words::text_enum!`]. A request's finish reason and SLO class are
//! the engine's words too: they are defined once, in `cachet-words`, and re-exported here.

pub(crate) use cachet_words::text_enum;
pub use cachet_words::{FinishReason, SloClass, UnknownWord};

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
