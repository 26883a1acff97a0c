//! Typed ids: what a tenant owns is named by a UUID, and each kind of thing has its own type, so a
//! session id cannot be passed where a task id is expected. Parsed once at the edge (a URL path,
//! a header, a JWT claim, a CLI argument), stored as `uuid` columns (`sqlx(transparent)`), sent as
//! the UUID's text (`serde(transparent)`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The error of parsing an id from text that is not a UUID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} id {input:?}: expected a UUID such as 67e55044-10b1-426f-9247-bb680e5fe0c8")]
pub struct ParseIdError {
    /// What the id names (`"tenant"`, `"session"`, …).
    pub what: &'static str,
    /// The rejected text, cut to its first 64 characters.
    pub input: String,
}

/// The error of parsing a [`TenantId`].
pub type ParseTenantIdError = ParseIdError;

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, sqlx::Type)]
        #[serde(transparent)]
        #[sqlx(transparent)]
        pub struct $name(pub Uuid);

        impl $name {
            /// A fresh random id.
            pub fn random() -> $name {
                $name(Uuid::new_v4())
            }

            /// The UUID, hyphen-free (as response ids such as `chatcmpl-…` carry it).
            pub fn simple(self) -> uuid::fmt::Simple {
                self.0.simple()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.hyphenated().fmt(f)
            }
        }

        impl FromStr for $name {
            type Err = ParseIdError;

            fn from_str(s: &str) -> Result<$name, ParseIdError> {
                Uuid::parse_str(s.trim())
                    .map($name)
                    .map_err(|_| ParseIdError { what: $what, input: s.chars().take(64).collect() })
            }
        }

        /// From the UUID's text, refused with [`ParseIdError`]'s words (a JSON body, a URL path).
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<$name, D::Error> {
                let text = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }

        impl From<Uuid> for $name {
            fn from(id: Uuid) -> $name {
                $name(id)
            }
        }

        impl From<$name> for Uuid {
            fn from(id: $name) -> Uuid {
                id.0
            }
        }
    };
}

uuid_id!(
    /// A tenant: everything it owns is scoped by this id.
    TenantId,
    "tenant"
);
uuid_id!(
    /// A registered repository (its mirror's folder is named after it).
    RepoId,
    "repository"
);
uuid_id!(
    /// A session: a tenant working on one branch of one repository. A request may also label
    /// itself with a session id of its own choosing (never another tenant's).
    SessionId,
    "session"
);
uuid_id!(
    /// A task: a unit of work an agent attempts, closed once with its outcome.
    TaskId,
    "task"
);
uuid_id!(
    /// A model request: its HTTP span's `request_id`, its response's id (`chatcmpl-…`) and its
    /// ledger row's key are all this one id.
    RequestId,
    "request"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_text_and_json_and_name_their_kind_when_refused() {
        let id = SessionId::random();
        assert_eq!(id.to_string().parse::<SessionId>().unwrap(), id);
        assert_eq!(serde_json::to_string(&id).unwrap(), format!("\"{id}\""));
        assert_eq!(serde_json::from_str::<SessionId>(&format!("\"{id}\"")).unwrap(), id);
        let err = serde_json::from_str::<SessionId>("\"s-1\"").unwrap_err();
        assert!(err.to_string().starts_with("invalid session id \"s-1\": expected a UUID"), "{err}");
        assert_eq!(format!("{}", id.simple()), id.0.simple().to_string());
        let err = "not-a-uuid".parse::<TaskId>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid task id \"not-a-uuid\": expected a UUID such as 67e55044-10b1-426f-9247-bb680e5fe0c8"
        );
        let err = "x".repeat(100).parse::<TenantId>().unwrap_err();
        assert!(err.to_string().starts_with("invalid tenant id"), "{err}");
        assert_eq!(err.input.len(), 64);
    }
}
