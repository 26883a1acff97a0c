//! JWT verification and issuing: round trips for every algorithm, key rotation, and the
//! tokens that must be refused, each with the right error.

use std::time::Duration;

use cachet_tenants::jwt::{AuthError, Claims, Jwt, JwtConfig, Role};
use cachet_tenants::{Secret, TenantId};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

const HS_SECRET: &str = "test-secret-that-is-at-least-32-bytes-long";
const RSA1_KEY: &str = include_str!("keys/rsa1.key.pem");
const RSA1_PUB: &str = include_str!("keys/rsa1.pub.pem");
const RSA2_KEY: &str = include_str!("keys/rsa2.key.pem");
const RSA2_PUB: &str = include_str!("keys/rsa2.pub.pem");
const ED1_KEY: &str = include_str!("keys/ed25519_1.key.pem");
const ED1_PUB: &str = include_str!("keys/ed25519_1.pub.pem");
const ED2_KEY: &str = include_str!("keys/ed25519_2.key.pem");
const ED2_PUB: &str = include_str!("keys/ed25519_2.pub.pem");

const HOUR: Duration = Duration::from_secs(3600);

fn hs256() -> Jwt {
    Jwt::new(&JwtConfig { hs256_secret: Some(Secret::new(HS_SECRET)), ..JwtConfig::default() }).unwrap()
}

fn rs256_only() -> Jwt {
    Jwt::new(&JwtConfig { rs256_public_keys: vec![RSA1_PUB.into()], ..JwtConfig::default() }).unwrap()
}

fn now() -> i64 {
    jsonwebtoken::get_current_timestamp() as i64
}

/// Valid claims for a tenant token, as JSON, to be bent by each negative test.
fn claims(tenant: TenantId) -> Value {
    json!({"sub": tenant.to_string(), "tenant": tenant, "role": "tenant", "iss": "cachet", "aud": "cachet-api",
           "exp": now() + 600, "iat": now()})
}

fn sign(alg: Algorithm, key: &EncodingKey, claims: &Value) -> String {
    jsonwebtoken::encode(&Header::new(alg), claims, key).unwrap()
}

fn sign_hs(claims: &Value) -> String {
    sign(Algorithm::HS256, &EncodingKey::from_secret(HS_SECRET.as_bytes()).unwrap(), claims)
}

fn b64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// Checks the error and that its message never echoes the token.
fn refused(jwt: &Jwt, token: &str) -> AuthError {
    let err = jwt.verify(token).expect_err("the token must be refused");
    assert!(token.len() < 8 || !err.to_string().contains(token), "{err} echoes the token");
    err
}

#[test]
fn hs256_round_trip_for_tenant_and_operator() {
    let jwt = hs256();
    let tenant = TenantId::random();
    let claims = jwt.verify(&jwt.issue(tenant, HOUR).unwrap()).unwrap();
    assert_eq!(claims.role, Role::Tenant);
    assert_eq!(claims.tenant, Some(tenant));
    assert_eq!(claims.sub, tenant.to_string());
    assert_eq!((claims.iss.as_str(), claims.aud.as_str()), ("cachet", "cachet-api"));
    assert!(claims.exp >= now() + 3590 && claims.iat <= now());

    let operator = jwt.verify(&jwt.issue_operator(HOUR).unwrap()).unwrap();
    assert_eq!((operator.role, operator.tenant), (Role::Operator, None));
}

#[test]
fn rs256_round_trip_with_key_rotation() {
    let cfg = JwtConfig {
        rs256_public_keys: vec![RSA2_PUB.into(), RSA1_PUB.into()],
        rs256_private_key: Some(Secret::new(RSA1_KEY)),
        ..JwtConfig::default()
    };
    let jwt = Jwt::new(&cfg).unwrap();
    let tenant = TenantId::random();
    let token = jwt.issue(tenant, HOUR).unwrap();
    assert_eq!(jsonwebtoken::decode_header(&token).unwrap().alg, Algorithm::RS256);
    assert_eq!(jwt.verify(&token).unwrap().tenant, Some(tenant));
    // A token from the other (older) key verifies too.
    let old = sign(Algorithm::RS256, &EncodingKey::from_rsa_pem(RSA2_KEY.as_bytes()).unwrap(), &claims(tenant));
    assert_eq!(jwt.verify(&old).unwrap().tenant, Some(tenant));
}

#[test]
fn eddsa_round_trip_with_key_rotation() {
    let cfg = JwtConfig {
        eddsa_public_keys: vec![ED1_PUB.into(), ED2_PUB.into()],
        eddsa_private_key: Some(Secret::new(ED2_KEY)),
        ..JwtConfig::default()
    };
    let jwt = Jwt::new(&cfg).unwrap();
    let token = jwt.issue_operator(HOUR).unwrap();
    assert_eq!(jsonwebtoken::decode_header(&token).unwrap().alg, Algorithm::EdDSA);
    assert_eq!(jwt.verify(&token).unwrap().role, Role::Operator);
    let tenant = TenantId::random();
    let other = sign(Algorithm::EdDSA, &EncodingKey::from_ed_pem(ED1_KEY.as_bytes()).unwrap(), &claims(tenant));
    assert_eq!(jwt.verify(&other).unwrap().tenant, Some(tenant));
}

#[test]
fn hs256_secret_takes_precedence_for_issuing() {
    let cfg = JwtConfig {
        hs256_secret: Some(Secret::new(HS_SECRET)),
        rs256_public_keys: vec![RSA1_PUB.into()],
        rs256_private_key: Some(Secret::new(RSA1_KEY)),
        ..JwtConfig::default()
    };
    let token = Jwt::new(&cfg).unwrap().issue_operator(HOUR).unwrap();
    assert_eq!(jsonwebtoken::decode_header(&token).unwrap().alg, Algorithm::HS256);
}

#[test]
fn alg_none_is_refused() {
    let jwt = hs256();
    let header = b64url(br#"{"alg":"none","typ":"JWT"}"#);
    let body = b64url(claims(TenantId::random()).to_string().as_bytes());
    for token in [format!("{header}.{body}."), format!("{header}.{body}.c2ln")] {
        assert!(matches!(refused(&jwt, &token), AuthError::Algorithm(_)), "{token}");
    }
    let header = b64url(br#"{"alg":"None"}"#);
    assert!(matches!(refused(&jwt, &format!("{header}.{body}.")), AuthError::Algorithm(_)));
}

#[test]
fn a_token_signed_with_another_key_is_refused() {
    let claims = claims(TenantId::random());
    let other_secret = EncodingKey::from_secret(b"another-secret-that-is-32-bytes-long!!").unwrap();
    assert_eq!(refused(&hs256(), &sign(Algorithm::HS256, &other_secret, &claims)), AuthError::Signature);

    let rsa2 = EncodingKey::from_rsa_pem(RSA2_KEY.as_bytes()).unwrap();
    assert_eq!(refused(&rs256_only(), &sign(Algorithm::RS256, &rsa2, &claims)), AuthError::Signature);

    let ed_only = Jwt::new(&JwtConfig { eddsa_public_keys: vec![ED1_PUB.into()], ..JwtConfig::default() }).unwrap();
    let ed2 = EncodingKey::from_ed_pem(ED2_KEY.as_bytes()).unwrap();
    assert_eq!(refused(&ed_only, &sign(Algorithm::EdDSA, &ed2, &claims)), AuthError::Signature);

    // A valid token with a tampered payload.
    let token = hs256().issue(TenantId::random(), HOUR).unwrap();
    let parts: Vec<&str> = token.split('.').collect();
    let forged = format!("{}.{}.{}", parts[0], b64url(claims.to_string().as_bytes()), parts[2]);
    assert_eq!(refused(&hs256(), &forged), AuthError::Signature);
}

#[test]
fn hs256_token_is_refused_when_only_rs256_is_configured() {
    // The classic confusion attack: HMAC keyed with the RSA public key the server trusts.
    let key = EncodingKey::from_secret(RSA1_PUB.as_bytes()).unwrap();
    let token = sign(Algorithm::HS256, &key, &claims(TenantId::random()));
    assert!(matches!(refused(&rs256_only(), &token), AuthError::Algorithm(_)));
    // And an RS256 token where only EdDSA is configured.
    let ed_only = Jwt::new(&JwtConfig { eddsa_public_keys: vec![ED1_PUB.into()], ..JwtConfig::default() }).unwrap();
    let rsa1 = EncodingKey::from_rsa_pem(RSA1_KEY.as_bytes()).unwrap();
    let token = sign(Algorithm::RS256, &rsa1, &claims(TenantId::random()));
    assert!(matches!(refused(&ed_only, &token), AuthError::Algorithm(_)));
}

#[test]
fn expiry_is_checked_with_leeway() {
    let jwt = hs256();
    let mut c = claims(TenantId::random());
    c["exp"] = json!(now() - 3600);
    assert_eq!(refused(&jwt, &sign_hs(&c)), AuthError::Expired);
    c["exp"] = json!(now() - 10);
    assert!(jwt.verify(&sign_hs(&c)).is_ok(), "within the 30 s leeway");
    c["nbf"] = json!(now() + 3600);
    assert_eq!(refused(&jwt, &sign_hs(&c)), AuthError::NotYetValid);
    let mut c = claims(TenantId::random());
    c.as_object_mut().unwrap().remove("exp");
    assert!(matches!(refused(&jwt, &sign_hs(&c)), AuthError::Malformed(_)));
}

#[test]
fn issuer_and_audience_must_match_exactly() {
    let jwt = hs256();
    let base = claims(TenantId::random());
    let with = |key: &str, value: Value| {
        let mut c = base.clone();
        c[key] = value;
        sign_hs(&c)
    };
    let without = |key: &str| {
        let mut c = base.clone();
        c.as_object_mut().unwrap().remove(key);
        sign_hs(&c)
    };
    assert_eq!(refused(&jwt, &with("aud", json!("someone-else"))), AuthError::Audience);
    assert_eq!(refused(&jwt, &with("aud", json!("cachet-api2"))), AuthError::Audience);
    assert_eq!(refused(&jwt, &without("aud")), AuthError::Audience);
    assert_eq!(refused(&jwt, &with("iss", json!("evil"))), AuthError::Issuer);
    assert_eq!(refused(&jwt, &without("iss")), AuthError::Issuer);
    assert!(matches!(refused(&jwt, &with("aud", json!(["cachet-api", "x"]))), AuthError::Malformed(_)));
}

#[test]
fn tenant_tokens_need_a_tenant_claim() {
    let jwt = hs256();
    let mut c = claims(TenantId::random());
    c.as_object_mut().unwrap().remove("tenant");
    assert_eq!(refused(&jwt, &sign_hs(&c)), AuthError::MissingTenant);
    c.as_object_mut().unwrap().remove("role");
    assert_eq!(refused(&jwt, &sign_hs(&c)), AuthError::MissingTenant, "no role means tenant");
    c["role"] = json!("operator");
    let claims: Claims = jwt.verify(&sign_hs(&c)).unwrap();
    assert_eq!(claims.role, Role::Operator);
    c["role"] = json!("admin");
    assert!(matches!(refused(&jwt, &sign_hs(&c)), AuthError::Malformed(_)));
    c["role"] = json!("tenant");
    c["tenant"] = json!("not-a-uuid-SECRETISH");
    let err = refused(&jwt, &sign_hs(&c));
    assert!(matches!(&err, AuthError::Malformed(m) if !m.contains("SECRETISH")), "{err}");
}

#[test]
fn malformed_tokens_are_refused() {
    let jwt = hs256();
    assert_eq!(jwt.verify(""), Err(AuthError::Missing));
    let header = b64url(br#"{"alg":"HS256","typ":"JWT"}"#);
    let valid = sign_hs(&claims(TenantId::random()));
    let signature = valid.rsplit('.').next().unwrap();
    for token in [
        "garbage".to_string(),
        "a.b".into(),
        "a.b.c.d".into(),
        "!!!.e30.sig".into(),
        format!("{}.e30.sig", b64url(b"not json")),
        format!("{}.e30.sig", b64url(b"{}")),
        "x".repeat(10_000),
    ] {
        assert!(matches!(refused(&jwt, &token), AuthError::Malformed(_)), "{token:.40}");
    }
    // The signature is checked before the payload is read.
    assert_eq!(refused(&jwt, &format!("{header}.%%%.{signature}")), AuthError::Signature);
    // Correctly signed, but the payload is not a JSON object.
    let key = EncodingKey::from_secret(HS_SECRET.as_bytes()).unwrap();
    for payload in [&b"not json"[..], b"[1,2]"] {
        let message = format!("{header}.{}", b64url(payload));
        let signature = jsonwebtoken::crypto::sign(message.as_bytes(), &key, Algorithm::HS256).unwrap();
        assert!(matches!(refused(&jwt, &format!("{message}.{signature}")), AuthError::Malformed(_)));
    }
}

#[test]
fn configuration_errors() {
    assert!(matches!(Jwt::new(&JwtConfig::default()), Err(AuthError::NoKey(_))));
    let empty = JwtConfig { hs256_secret: Some(Secret::new("")), ..JwtConfig::default() };
    assert!(matches!(Jwt::new(&empty), Err(AuthError::InvalidKey(_))));
    let bad_pem = JwtConfig { rs256_public_keys: vec!["not a pem".into()], ..JwtConfig::default() };
    assert!(matches!(Jwt::new(&bad_pem), Err(AuthError::InvalidKey(m)) if m.contains("rs256_public_keys[0]")));
    let swapped = JwtConfig { eddsa_public_keys: vec![RSA1_PUB.into()], ..JwtConfig::default() };
    assert!(matches!(Jwt::new(&swapped), Err(AuthError::InvalidKey(_))));
    let bad_private = JwtConfig {
        hs256_secret: Some(Secret::new(HS_SECRET)),
        rs256_private_key: Some(Secret::new("nope")),
        ..JwtConfig::default()
    };
    let err = Jwt::new(&bad_private).unwrap_err();
    assert!(matches!(&err, AuthError::InvalidKey(_)) && err.is_server_error());
    // Verification keys only: cannot issue.
    assert!(matches!(rs256_only().issue(TenantId::random(), HOUR), Err(AuthError::NoKey(_))));
}
