//! cachet-words: the closed sets of words that more than one crate speaks, defined once.
//!
//! A request's [`SloClass`] is chosen by the client (the API), scheduled by the engine and
//! stored in the ledger; its [`FinishReason`] is decided by the engine (or the API's tool-call
//! parser), sent to the client and stored. Each is one enum here, written as the same word
//! everywhere: in JSON (serde), in a Postgres `text` column (with the `sqlx` feature), in
//! metrics' labels ([`SloClass::as_str`]) and when parsed from a request ([`std::str::FromStr`],
//! whose error lists the accepted words).
//!
//! [`text_enum!`] makes such a set; the tenants crate makes its own (an endpoint, a task's
//! status, …) with it.
//!
//! ```
//! use cachet_words::{FinishReason, SloClass};
//!
//! assert_eq!("batch".parse::<SloClass>().unwrap(), SloClass::Batch);
//! assert_eq!(SloClass::default(), SloClass::Interactive);
//! assert_eq!(FinishReason::ToolCalls.as_str(), "tool_calls");
//! let err = "fast".parse::<SloClass>().unwrap_err();
//! assert_eq!(err.to_string(), "unknown SLO class \"fast\" (expected one of: interactive batch)");
//! ```

/// The error of parsing one of these words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {input:?} (expected one of: {expected})")]
pub struct UnknownWord {
    /// What the word names (`"endpoint"`, `"task status"`, …).
    pub what: &'static str,
    /// The rejected word, cut to its first 64 characters.
    pub input: String,
    /// The words accepted, space-separated.
    pub expected: &'static str,
}

/// An enum whose values are a few fixed words: `as_str`, `Display`, `FromStr` (an unknown word
/// is an [`UnknownWord`]), serde as the word, and — with this crate's `sqlx` feature — a Postgres
/// `text` column (an unknown word in a row is a decode error, never a silent default).
#[macro_export]
macro_rules! text_enum {
    ($(#[$doc:meta])* $name:ident, $what:literal {
        $($(#[$vdoc:meta])* $variant:ident = $text:literal),+ $(,)?
    }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        pub enum $name {
            $($(#[$vdoc])* #[serde(rename = $text)] $variant),+
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
            type Err = $crate::UnknownWord;

            fn from_str(s: &str) -> Result<$name, $crate::UnknownWord> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err($crate::UnknownWord {
                        what: $what,
                        input: s.chars().take(64).collect(),
                        expected: concat!($($text, " "),+).trim_ascii_end(),
                    }),
                }
            }
        }

        $crate::__text_column!($name);
    };
}

/// A Postgres `text` column holding a [`text_enum!`]'s words (written by `as_str`, read by
/// `FromStr`).
#[cfg(feature = "sqlx")]
#[doc(hidden)]
#[macro_export]
macro_rules! __text_column {
    ($name:ident) => {
        impl $crate::__sqlx::Type<$crate::__sqlx::Postgres> for $name {
            fn type_info() -> $crate::__sqlx::postgres::PgTypeInfo {
                <&str as $crate::__sqlx::Type<$crate::__sqlx::Postgres>>::type_info()
            }

            fn compatible(ty: &$crate::__sqlx::postgres::PgTypeInfo) -> bool {
                <&str as $crate::__sqlx::Type<$crate::__sqlx::Postgres>>::compatible(ty)
            }
        }

        impl $crate::__sqlx::postgres::PgHasArrayType for $name {
            fn array_type_info() -> $crate::__sqlx::postgres::PgTypeInfo {
                <&str as $crate::__sqlx::postgres::PgHasArrayType>::array_type_info()
            }
        }

        impl<'q> $crate::__sqlx::Encode<'q, $crate::__sqlx::Postgres> for $name {
            fn encode_by_ref(
                &self,
                buf: &mut $crate::__sqlx::postgres::PgArgumentBuffer,
            ) -> Result<$crate::__sqlx::encode::IsNull, $crate::__sqlx::error::BoxDynError> {
                <&str as $crate::__sqlx::Encode<'q, $crate::__sqlx::Postgres>>::encode_by_ref(&self.as_str(), buf)
            }
        }

        impl<'r> $crate::__sqlx::Decode<'r, $crate::__sqlx::Postgres> for $name {
            fn decode(
                value: $crate::__sqlx::postgres::PgValueRef<'r>,
            ) -> Result<$name, $crate::__sqlx::error::BoxDynError> {
                let word = <&str as $crate::__sqlx::Decode<'r, $crate::__sqlx::Postgres>>::decode(value)?;
                Ok(word.parse::<$name>()?)
            }
        }
    };
}

/// Without the `sqlx` feature a set is no column type.
#[cfg(not(feature = "sqlx"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __text_column {
    ($name:ident) => {};
}

#[cfg(feature = "sqlx")]
#[doc(hidden)]
pub use sqlx as __sqlx;

text_enum!(
    /// Latency class of a request: what its time-to-first-token and inter-token targets are,
    /// and how the scheduler orders it against others.
    SloClass, "SLO class" {
        /// A person is waiting (an IDE, an agent turn).
        Interactive = "interactive",
        /// Throughput work (evaluations, bulk jobs, pre-warming).
        Batch = "batch",
    }
);

// Written out: `text_enum!` makes the enum, so it cannot carry `#[derive(Default)]`.
#[allow(clippy::derivable_impls)]
impl Default for SloClass {
    fn default() -> SloClass {
        SloClass::Interactive
    }
}

text_enum!(
    /// Why generation ended.
    FinishReason, "finish reason" {
        /// A stop token or stop string.
        Stop = "stop",
        /// `max_tokens`, or the end of the context window.
        Length = "length",
        /// The answer ended with tool calls (the model stopped after them). The engine never
        /// says so (it sees tokens): the API does, when the text parsed into calls.
        ToolCalls = "tool_calls",
    }
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_an_unknown_one_lists_the_choices() {
        for f in FinishReason::ALL {
            assert_eq!(f.as_str().parse::<FinishReason>().unwrap(), *f);
            assert_eq!(serde_json::to_string(f).unwrap(), format!("\"{f}\""));
        }
        assert_eq!(serde_json::from_str::<SloClass>("\"batch\"").unwrap(), SloClass::Batch);
        assert!(serde_json::from_str::<SloClass>("\"fast\"").is_err());
        let long = "x".repeat(1000);
        let err = long.parse::<FinishReason>().unwrap_err();
        assert_eq!(err.input.len(), 64);
        assert_eq!(err.expected, "stop length tool_calls");
    }
}
