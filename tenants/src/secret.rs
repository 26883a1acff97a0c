//! A string that must not end up in logs: its `Debug` prints `Secret(***)`.

use std::fmt;

use serde::{Deserialize, Deserializer};

/// A secret value (a signing key, a password): readable only through [`Secret::expose`].
///
/// `Debug` never prints the value, so a config struct holding secrets can derive `Debug` and be
/// logged. There is deliberately no `Display` and no `Serialize`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The secret value. Call it only where the value is used, never to log it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether the secret is the empty string.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// The empty secret ("none given": a setting left unset).
impl Default for Secret {
    fn default() -> Secret {
        Secret(String::new())
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Secret {
        Secret(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Secret {
        Secret(value.to_owned())
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Secret, D::Error> {
        String::deserialize(deserializer).map(Secret)
    }
}

/// `bytes` random bytes from the operating system, as lowercase hex (passwords, webhook secrets,
/// sign-in codes).
pub fn random_hex(bytes: usize) -> std::io::Result<String> {
    use std::io::Read;
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_redacts_the_value() {
        let secret = Secret::new("hunter2");
        assert_eq!(format!("{secret:?}"), "Secret(***)");
        assert_eq!(format!("{:?}", Some(secret.clone())), "Some(Secret(***))");
        assert_eq!(secret.expose(), "hunter2");
    }

    #[test]
    fn deserializes_from_a_string() {
        let secret: Secret = serde_json::from_str("\"s3cr3t\"").unwrap();
        assert_eq!(secret.expose(), "s3cr3t");
        assert!(serde_json::from_str::<Secret>("42").is_err());
    }
}
