//! JWT bearer tokens: verification (HS256, RS256, EdDSA, with key rotation) and issuing.
//!
//! A token is accepted only if its header names an algorithm for which a key is configured
//! (`none` never is), its signature verifies with one of that algorithm's keys, it has not
//! expired (give or take the leeway), and its `iss` and `aud` equal the configured ones exactly.
//! A [`Role::Tenant`] token must carry a `tenant` claim.

use std::fmt;
use std::time::Duration;

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::ids::TenantId;
use crate::secret::Secret;

/// Longer tokens are rejected before any parsing.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// Who a token speaks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A tenant's client: everything it does is scoped to its `tenant` claim.
    Tenant,
    /// An operator of the deployment: administers tenants.
    Operator,
}

fn default_role() -> Role {
    Role::Tenant
}

/// The claims of a cachet token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// The subject: a user or service name (issued tokens use the tenant id, or `"operator"`).
    pub sub: String,
    /// The tenant the token acts for; required for [`Role::Tenant`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<TenantId>,
    /// The role; a token without one is a tenant token.
    #[serde(default = "default_role")]
    pub role: Role,
    /// Issuer.
    pub iss: String,
    /// Audience: a single string.
    pub aud: String,
    /// Expiry, seconds since the Unix epoch.
    pub exp: i64,
    /// Issued at, seconds since the Unix epoch (0 if absent).
    #[serde(default)]
    pub iat: i64,
}

/// Keys and expectations for tokens; read from the service's config.
#[derive(Clone, Debug, Deserialize)]
#[serde(default)]
pub struct JwtConfig {
    /// The required `iss`. Default `"cachet"`.
    pub issuer: String,
    /// The required `aud`. Default `"cachet-api"`.
    pub audience: String,
    /// Shared secret for HS256 (verifies and signs).
    pub hs256_secret: Option<Secret>,
    /// RS256 public keys (PEM text); a token may be signed by any of them (key rotation).
    pub rs256_public_keys: Vec<String>,
    /// Ed25519 public keys (PEM text); a token may be signed by any of them.
    pub eddsa_public_keys: Vec<String>,
    /// RS256 private key (PEM), for issuing when there is no HS256 secret.
    pub rs256_private_key: Option<Secret>,
    /// Ed25519 private key (PKCS#8 PEM), for issuing when there is neither of the above.
    pub eddsa_private_key: Option<Secret>,
    /// Clock skew tolerated on `exp` and `nbf`, in seconds. Default 30.
    pub leeway_seconds: u64,
}

impl Default for JwtConfig {
    fn default() -> JwtConfig {
        JwtConfig {
            issuer: "cachet".into(),
            audience: "cachet-api".into(),
            hs256_secret: None,
            rs256_public_keys: Vec::new(),
            eddsa_public_keys: Vec::new(),
            rs256_private_key: None,
            eddsa_private_key: None,
            leeway_seconds: 30,
        }
    }
}

/// Why a token was refused or could not be made. The messages are safe to show to clients:
/// they never contain the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// No bearer token was presented.
    #[error("missing bearer token")]
    Missing,
    /// The token is not a well-formed JWT with the expected claims.
    #[error("malformed token: {0}")]
    Malformed(String),
    /// The header's algorithm is `none` or one for which no key is configured.
    #[error("token algorithm not accepted: {0}")]
    Algorithm(String),
    /// The signature does not verify with any configured key.
    #[error("invalid token signature")]
    Signature,
    /// The token has expired.
    #[error("token expired")]
    Expired,
    /// The token's `nbf` lies in the future.
    #[error("token not valid yet")]
    NotYetValid,
    /// The `iss` claim is missing or not the configured issuer.
    #[error("wrong token issuer")]
    Issuer,
    /// The `aud` claim is missing or not the configured audience.
    #[error("wrong token audience")]
    Audience,
    /// A tenant token without a `tenant` claim.
    #[error("tenant token without a tenant claim")]
    MissingTenant,
    /// No key is configured for what was asked (verifying at all, or issuing).
    #[error("no key configured: {0}")]
    NoKey(String),
    /// A configured key cannot be used (bad PEM, empty secret).
    #[error("invalid key: {0}")]
    InvalidKey(String),
    /// Signing a token failed.
    #[error("cannot issue token: {0}")]
    Issue(String),
}

impl AuthError {
    /// Whether the fault lies with the server's configuration rather than the presented token
    /// (HTTP 500 rather than 401).
    pub fn is_server_error(&self) -> bool {
        matches!(self, AuthError::NoKey(_) | AuthError::InvalidKey(_) | AuthError::Issue(_))
    }
}

/// Takes the token out of an `Authorization` header value (`Bearer <token>`).
pub fn bearer_token(header: Option<&str>) -> Result<&str, AuthError> {
    let header = header.map(str::trim).filter(|h| !h.is_empty()).ok_or(AuthError::Missing)?;
    match header.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() => Ok(token.trim()),
        _ => Err(AuthError::Malformed("expected an `Authorization: Bearer <token>` header".into())),
    }
}

/// Verifies and issues tokens. Built once from a [`JwtConfig`]; cheap to share behind an `Arc`.
pub struct Jwt {
    issuer: String,
    audience: String,
    leeway: u64,
    hs256: Vec<DecodingKey>,
    rs256: Vec<DecodingKey>,
    eddsa: Vec<DecodingKey>,
    signer: Option<(Algorithm, EncodingKey)>,
}

impl fmt::Debug for Jwt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Jwt")
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .field("leeway", &self.leeway)
            .field("hs256_keys", &self.hs256.len())
            .field("rs256_keys", &self.rs256.len())
            .field("eddsa_keys", &self.eddsa.len())
            .field("signer", &self.signer.as_ref().map(|(alg, _)| alg))
            .finish()
    }
}

impl Jwt {
    /// Parses every configured key. Fails with [`AuthError::NoKey`] if no verification key is
    /// configured at all, and with [`AuthError::InvalidKey`] naming the first unusable key.
    pub fn new(cfg: &JwtConfig) -> Result<Jwt, AuthError> {
        let mut hs256 = Vec::new();
        let mut signer = None;
        if let Some(secret) = &cfg.hs256_secret {
            if secret.is_empty() {
                return Err(AuthError::InvalidKey("hs256_secret is empty".into()));
            }
            if secret.expose().len() < 32 {
                tracing::warn!("hs256_secret is shorter than 32 bytes; use a longer random secret");
            }
            let bytes = secret.expose().as_bytes();
            let invalid = |e: jsonwebtoken::errors::Error| AuthError::InvalidKey(format!("hs256_secret: {e}"));
            hs256.push(DecodingKey::from_secret(bytes).map_err(invalid)?);
            signer = Some((Algorithm::HS256, EncodingKey::from_secret(bytes).map_err(invalid)?));
        }
        let rs256 = parse_keys(&cfg.rs256_public_keys, "rs256_public_keys", DecodingKey::from_rsa_pem)?;
        let eddsa = parse_keys(&cfg.eddsa_public_keys, "eddsa_public_keys", DecodingKey::from_ed_pem)?;
        if hs256.is_empty() && rs256.is_empty() && eddsa.is_empty() {
            return Err(AuthError::NoKey(
                "no verification key: set hs256_secret, rs256_public_keys or eddsa_public_keys".into(),
            ));
        }
        if let Some(pem) = &cfg.rs256_private_key {
            let key = EncodingKey::from_rsa_pem(pem.expose().as_bytes())
                .map_err(|_| AuthError::InvalidKey("rs256_private_key is not an RSA private key in PEM".into()))?;
            signer = signer.or(Some((Algorithm::RS256, key)));
        }
        if let Some(pem) = &cfg.eddsa_private_key {
            let key = EncodingKey::from_ed_pem(pem.expose().as_bytes()).map_err(|_| {
                AuthError::InvalidKey("eddsa_private_key is not an Ed25519 private key in PKCS#8 PEM".into())
            })?;
            signer = signer.or(Some((Algorithm::EdDSA, key)));
        }
        Ok(Jwt {
            issuer: cfg.issuer.clone(),
            audience: cfg.audience.clone(),
            leeway: cfg.leeway_seconds,
            hs256,
            rs256,
            eddsa,
            signer,
        })
    }

    /// The algorithms for which a verification key is configured.
    pub fn accepted_algorithms(&self) -> Vec<&'static str> {
        let mut algs = Vec::new();
        for (name, keys) in [("HS256", &self.hs256), ("RS256", &self.rs256), ("EdDSA", &self.eddsa)] {
            if !keys.is_empty() {
                algs.push(name);
            }
        }
        algs
    }

    /// Verifies a token (without the `Bearer ` prefix) and returns its claims.
    pub fn verify(&self, token: &str) -> Result<Claims, AuthError> {
        let token = token.trim();
        if token.is_empty() {
            return Err(AuthError::Missing);
        }
        if token.len() > MAX_TOKEN_BYTES {
            return Err(AuthError::Malformed(format!("token is longer than {MAX_TOKEN_BYTES} bytes")));
        }
        let alg = header_alg(token)?;
        let (algorithm, keys) = match alg.as_str() {
            "HS256" if !self.hs256.is_empty() => (Algorithm::HS256, &self.hs256),
            "RS256" if !self.rs256.is_empty() => (Algorithm::RS256, &self.rs256),
            "EdDSA" if !self.eddsa.is_empty() => (Algorithm::EdDSA, &self.eddsa),
            none if none.eq_ignore_ascii_case("none") => {
                return Err(AuthError::Algorithm("unsigned tokens (alg \"none\") are never accepted".into()));
            }
            other => {
                let shown: String = other.chars().take(16).collect();
                let accepted = self.accepted_algorithms().join(", ");
                return Err(AuthError::Algorithm(format!("{shown:?} (accepted: {accepted})")));
            }
        };
        let mut validation = Validation::new(algorithm);
        validation.leeway = self.leeway;
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&[&self.audience]);
        for key in keys {
            match jsonwebtoken::decode::<Map<String, Value>>(token, key, &validation) {
                Ok(data) => return claims_from(data.claims),
                // Signature and key errors come before any claim check: try the next key.
                Err(e) => match map_error(&e) {
                    AuthError::Signature => continue,
                    other => return Err(other),
                },
            }
        }
        Err(AuthError::Signature)
    }

    /// Issues a tenant token valid for `ttl`, signed with the HS256 secret if one is set, else
    /// the RS256 private key, else the Ed25519 private key.
    pub fn issue(&self, tenant: TenantId, ttl: Duration) -> Result<String, AuthError> {
        self.sign(tenant.to_string(), Some(tenant), Role::Tenant, ttl)
    }

    /// Issues an operator token (no tenant) valid for `ttl`.
    pub fn issue_operator(&self, ttl: Duration) -> Result<String, AuthError> {
        self.sign("operator".into(), None, Role::Operator, ttl)
    }

    fn sign(&self, sub: String, tenant: Option<TenantId>, role: Role, ttl: Duration) -> Result<String, AuthError> {
        let (algorithm, key) = self.signer.as_ref().ok_or_else(|| {
            AuthError::NoKey("no signing key: set hs256_secret, rs256_private_key or eddsa_private_key".into())
        })?;
        let now = jsonwebtoken::get_current_timestamp() as i64;
        let ttl = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
        let claims = Claims {
            sub,
            tenant,
            role,
            iss: self.issuer.clone(),
            aud: self.audience.clone(),
            exp: now.saturating_add(ttl),
            iat: now,
        };
        jsonwebtoken::encode(&Header::new(*algorithm), &claims, key).map_err(|e| AuthError::Issue(e.to_string()))
    }
}

fn parse_keys(
    pems: &[String],
    field: &str,
    parse: fn(&[u8]) -> jsonwebtoken::errors::Result<DecodingKey>,
) -> Result<Vec<DecodingKey>, AuthError> {
    pems.iter()
        .enumerate()
        .map(|(i, pem)| {
            parse(pem.as_bytes())
                .map_err(|e| AuthError::InvalidKey(format!("{field}[{i}] is not a usable public key in PEM: {e}")))
        })
        .collect()
}

/// The `alg` of the token's header, read without trusting anything else in it.
fn header_alg(token: &str) -> Result<String, AuthError> {
    let mut parts = token.split('.');
    let (Some(header), Some(_), Some(_), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(AuthError::Malformed("expected three dot-separated parts".into()));
    };
    let bytes = base64url_decode(header).ok_or_else(|| AuthError::Malformed("header is not base64url".into()))?;
    let header: Map<String, Value> =
        serde_json::from_slice(&bytes).map_err(|_| AuthError::Malformed("header is not a JSON object".into()))?;
    match header.get("alg") {
        Some(Value::String(alg)) => Ok(alg.clone()),
        _ => Err(AuthError::Malformed("header has no alg".into())),
    }
}

/// Decodes unpadded (or padded) base64url.
fn base64url_decode(text: &str) -> Option<Vec<u8>> {
    let text = text.trim_end_matches('=');
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for byte in text.bytes() {
        let value = match byte {
            b'A'..=b'Z' => byte - b'A',
            b'a'..=b'z' => byte - b'a' + 26,
            b'0'..=b'9' => byte - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(value);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    (bits < 6).then_some(out)
}

fn claims_from(map: Map<String, Value>) -> Result<Claims, AuthError> {
    let claims: Claims = serde_json::from_value(Value::Object(map))
        .map_err(|e| AuthError::Malformed(format!("claims: {}", without_quoted(&e.to_string()))))?;
    if claims.role == Role::Tenant && claims.tenant.is_none() {
        return Err(AuthError::MissingTenant);
    }
    Ok(claims)
}

/// Replaces double-quoted parts of a serde message (values taken from the token) with `"…"`.
fn without_quoted(message: &str) -> String {
    message.split('"').enumerate().map(|(i, part)| if i % 2 == 1 { "…" } else { part }).collect::<Vec<_>>().join("\"")
}

fn map_error(err: &jsonwebtoken::errors::Error) -> AuthError {
    match err.kind() {
        ErrorKind::InvalidSignature
        | ErrorKind::InvalidRsaKey(_)
        | ErrorKind::InvalidEddsaKey
        | ErrorKind::InvalidEcdsaKey
        | ErrorKind::InvalidKeyFormat => AuthError::Signature,
        ErrorKind::ExpiredSignature => AuthError::Expired,
        ErrorKind::ImmatureSignature => AuthError::NotYetValid,
        ErrorKind::InvalidIssuer => AuthError::Issuer,
        ErrorKind::InvalidAudience => AuthError::Audience,
        ErrorKind::MissingRequiredClaim(claim) if claim == "iss" => AuthError::Issuer,
        ErrorKind::MissingRequiredClaim(claim) if claim == "aud" => AuthError::Audience,
        ErrorKind::MissingRequiredClaim(claim) => AuthError::Malformed(format!("missing {claim} claim")),
        ErrorKind::InvalidClaimFormat(claim) => AuthError::Malformed(format!("invalid {claim} claim")),
        ErrorKind::InvalidAlgorithm | ErrorKind::UnsupportedAlgorithm | ErrorKind::InvalidAlgorithmName => {
            AuthError::Algorithm("not accepted for the configured keys".into())
        }
        ErrorKind::Base64(_) => AuthError::Malformed("not base64url".into()),
        ErrorKind::Utf8(_) => AuthError::Malformed("not UTF-8".into()),
        ErrorKind::Json(_) => AuthError::Malformed("claims are not a JSON object".into()),
        _ => AuthError::Malformed("not a valid JWT".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64url_decodes_unpadded_text() {
        assert_eq!(base64url_decode("").unwrap(), b"");
        assert_eq!(base64url_decode("Zg").unwrap(), b"f");
        assert_eq!(base64url_decode("Zm8").unwrap(), b"fo");
        assert_eq!(base64url_decode("Zm9v").unwrap(), b"foo");
        assert_eq!(base64url_decode("Zm9vYg==").unwrap(), b"foob");
        assert_eq!(base64url_decode("-_-_").unwrap(), [0xfb, 0xff, 0xbf]);
        assert!(base64url_decode("Z").is_none(), "a single leftover character is not a byte");
        assert!(base64url_decode("Zm9v+").is_none(), "standard alphabet characters are rejected");
    }

    #[test]
    fn quoted_values_are_hidden() {
        assert_eq!(
            without_quoted("invalid type: string \"secret\", expected u64"),
            "invalid type: string \"…\", expected u64"
        );
        assert_eq!(without_quoted("missing field `sub`"), "missing field `sub`");
    }

    #[test]
    fn bearer_header_parsing() {
        assert_eq!(bearer_token(None), Err(AuthError::Missing));
        assert_eq!(bearer_token(Some("  ")), Err(AuthError::Missing));
        assert_eq!(bearer_token(Some("Bearer abc")), Ok("abc"));
        assert_eq!(bearer_token(Some("bearer  abc ")), Ok("abc"));
        assert!(matches!(bearer_token(Some("Basic abc")), Err(AuthError::Malformed(_))));
        assert!(matches!(bearer_token(Some("Bearer")), Err(AuthError::Malformed(_))));
    }

    #[test]
    fn config_deserializes_with_defaults_and_redacts_secrets() {
        let cfg: JwtConfig = serde_json::from_str(r#"{"hs256_secret": "topsecret"}"#).unwrap();
        assert_eq!(cfg.issuer, "cachet");
        assert_eq!(cfg.audience, "cachet-api");
        assert_eq!(cfg.leeway_seconds, 30);
        assert!(!format!("{cfg:?}").contains("topsecret"));
    }
}
