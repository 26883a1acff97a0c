//! K/V that leaves the pool: the record a chunk of a cached prefix is written as, to a disk tier
//! or to another server (issue "KV that moves"; the tier and the transports build on it).
//!
//! A prefix is moved in fixed-size chunks of tokens. Each chunk's record carries what is needed
//! to use it safely anywhere: the model and K/V layout it was computed with (a **fingerprint**:
//! a record of another model or format is refused, never loaded), its **cache scope** (a tenant
//! and salt, or the public prompt of a template: a chunk never crosses tenants), the **chain
//! key** of the prefix before it (a chunk is valid only after exactly that prefix), its tokens,
//! its **provenance tags** (so a push invalidates stored chunks as it does cached ones) and, per
//! layer, its K and V rows as [`cachet_kernels::backend::Backend::kv_export`] gives them. The
//! whole record is covered by a SHA-256 trailer: a truncated or corrupted record is detected
//! and discarded (and recomputed), never loaded. The format is versioned ([`FORMAT_VERSION`]).
//!
//! ```
//! use cachet_engine::kv_transfer::{chain_key, KvRecord, RecordScope};
//! let scope = RecordScope::Tenant { tenant: "acme".into(), salt: None };
//! let tokens = vec![1, 2, 3];
//! let record = KvRecord {
//!     fingerprint: [7; 32],
//!     scope: scope.clone(),
//!     parent: [0; 32],
//!     tokens: tokens.clone(),
//!     tags: Vec::new(),
//!     kv_cols: 4,
//!     layers: vec![vec![0; 2 * 3 * 4]; 2],
//! };
//! let bytes = record.encode();
//! assert_eq!(KvRecord::decode(&bytes, &[7; 32]).unwrap(), record);
//! assert!(KvRecord::decode(&bytes, &[8; 32]).is_err(), "another model's record");
//! assert_eq!(record.key(), chain_key(&[0; 32], &scope, &tokens));
//! ```

use cachet_kernels::backend::KvFormat;
use sha2::{Digest, Sha256};
use std::ops::Range;

pub mod disk;

/// The record format's version; a record of another version is refused.
pub const FORMAT_VERSION: u16 = 1;

const MAGIC: &[u8; 8] = b"CACHETKV";
/// Limits that a record's lengths must keep (a corrupt length must not make the reader
/// allocate gigabytes before the checksum says the record is bad).
const MAX_TOKENS: usize = 1 << 20;
const MAX_TAGS: usize = 1 << 16;
const MAX_TEXT: usize = 1 << 16;
const MAX_LAYERS: usize = 1 << 10;

/// The cache scope of a chunk (the engine's [`crate::radix::key::Scope`], by value).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RecordScope {
    /// The operator's public prompt of one chat template.
    Public { template: String },
    /// A tenant's, optionally narrowed by a salt.
    Tenant { tenant: String, salt: Option<String> },
}

/// A provenance tag over a token range of the chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordTag {
    /// Token positions within the chunk.
    pub range: Range<u32>,
    pub source: String,
    pub version: String,
}

/// One chunk of a cached prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvRecord {
    /// The model and K/V layout it was computed with (the reader's must be equal).
    pub fingerprint: [u8; 32],
    pub scope: RecordScope,
    /// The chain key of the prefix before this chunk (all zeros for the first chunk).
    pub parent: [u8; 32],
    pub tokens: Vec<u32>,
    pub tags: Vec<RecordTag>,
    /// 16-bit units of one K (or V) row as the pool stores it: `kv_heads · head_dim` in f16,
    /// 17 per 32 values in `Q8_0` ([`cachet_kernels::backend::KvFormat::row_units`]; the
    /// fingerprint says which).
    pub kv_cols: u32,
    /// Per layer, K's rows then V's rows as stored (`2 · tokens · kv_cols` units).
    pub layers: Vec<Vec<u16>>,
}

/// Why a record was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    #[error("not a K/V record")]
    NotARecord,
    #[error("K/V record format {0}, this server reads {FORMAT_VERSION}")]
    Version(u16),
    #[error("the K/V record is truncated")]
    Truncated,
    #[error("the K/V record's checksum does not match: it is corrupt")]
    Checksum,
    #[error("the K/V record was computed with another model or K/V format")]
    OtherModel,
    #[error("malformed K/V record: {0}")]
    Malformed(String),
}

/// The fingerprint records carry: the weights' identity ([`crate::loader::weights_fingerprint`])
/// and the K/V layout per token (layers, K/V heads, head size, the rows' format), under this format
/// version. A pool of another size has the same fingerprint: slots are not part of a record.
pub fn model_fingerprint(
    weights: &[u8; 32],
    layers: usize,
    kv_heads: usize,
    head_dim: usize,
    format: KvFormat,
) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"cachet-kv-model-1");
    h.update(weights);
    for v in [layers, kv_heads, head_dim] {
        h.update((v as u64).to_le_bytes());
    }
    h.update(FORMAT_VERSION.to_le_bytes());
    // The K/V format's name (f16 pools keep the fingerprint they had before there was a choice):
    // a pool reads records of its own format only.
    h.update(format.name().as_bytes());
    h.finalize().into()
}

/// The chain key of `tokens` under `scope` after the prefix whose key is `parent`: a chunk's
/// name in a tier. Equal keys mean the same scope and the same tokens from the start.
pub fn chain_key(parent: &[u8; 32], scope: &RecordScope, tokens: &[u32]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"cachet-kv-chain-1");
    h.update(parent);
    let mut scope_bytes = Vec::new();
    put_scope(&mut scope_bytes, scope);
    h.update(&scope_bytes);
    h.update((tokens.len() as u64).to_le_bytes());
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    h.finalize().into()
}

impl KvRecord {
    /// This chunk's chain key.
    pub fn key(&self) -> [u8; 32] {
        chain_key(&self.parent, &self.scope, &self.tokens)
    }

    /// The record's bytes: magic, version, fingerprint, scope, parent, tokens, tags, layers,
    /// then the SHA-256 of all of it.
    pub fn encode(&self) -> Vec<u8> {
        let rows: usize = self.layers.iter().map(Vec::len).sum();
        let mut out = Vec::with_capacity(128 + 4 * self.tokens.len() + 2 * rows);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&self.fingerprint);
        put_scope(&mut out, &self.scope);
        out.extend_from_slice(&self.parent);
        put_u32(&mut out, self.tokens.len() as u32);
        for t in &self.tokens {
            put_u32(&mut out, *t);
        }
        put_u32(&mut out, self.tags.len() as u32);
        for tag in &self.tags {
            put_u32(&mut out, tag.range.start);
            put_u32(&mut out, tag.range.end);
            put_text(&mut out, &tag.source);
            put_text(&mut out, &tag.version);
        }
        put_u32(&mut out, self.kv_cols);
        put_u32(&mut out, self.layers.len() as u32);
        for layer in &self.layers {
            for v in layer {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        let sum: [u8; 32] = Sha256::digest(&out).into();
        out.extend_from_slice(&sum);
        out
    }

    /// Reads a record, refusing one that is not whole and intact, of another format version,
    /// or of another model than `fingerprint`.
    pub fn decode(bytes: &[u8], fingerprint: &[u8; 32]) -> Result<KvRecord, RecordError> {
        if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
            return Err(RecordError::NotARecord);
        }
        let mut r = Reader { bytes, at: MAGIC.len() };
        let version = u16::from_le_bytes(r.array()?);
        if version != FORMAT_VERSION {
            return Err(RecordError::Version(version));
        }
        // The checksum first: nothing of a corrupt record is believed.
        if bytes.len() < r.at + 32 {
            return Err(RecordError::Truncated);
        }
        let (body, sum) = bytes.split_at(bytes.len() - 32);
        if Sha256::digest(body).as_slice() != sum {
            return Err(RecordError::Checksum);
        }
        let mut r = Reader { bytes: body, at: r.at };
        let (head, layer_count) = r.head(fingerprint)?;
        let per_layer = 2 * head.tokens.len() * head.kv_cols as usize;
        if layer_count.saturating_mul(per_layer).saturating_mul(2) != r.left() {
            return Err(RecordError::Malformed(format!(
                "{} bytes of rows for {layer_count} layers of {per_layer} values",
                r.left()
            )));
        }
        let mut layers = Vec::with_capacity(layer_count);
        for _ in 0..layer_count {
            let raw = r.take(2 * per_layer)?;
            layers.push(raw.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect());
        }
        Ok(KvRecord { layers, ..head })
    }

    /// Reads what a record says of itself — everything but its rows, which stay empty — from
    /// `head`, the first bytes of a record of `len` bytes in all, checking that `len` is what
    /// such a record takes. The checksum is not checked (it covers the rows): for indexing
    /// stored records without reading them whole; [`KvRecord::decode`] checks everything
    /// before the rows are used. `Truncated` when `head` ends before the rows do start.
    pub fn decode_head(head: &[u8], len: u64, fingerprint: &[u8; 32]) -> Result<KvRecord, RecordError> {
        if head.len() < MAGIC.len() || &head[..MAGIC.len()] != MAGIC {
            return Err(RecordError::NotARecord);
        }
        let mut r = Reader { bytes: head, at: MAGIC.len() };
        let version = u16::from_le_bytes(r.array()?);
        if version != FORMAT_VERSION {
            return Err(RecordError::Version(version));
        }
        let (record, layer_count) = r.head(fingerprint)?;
        let per_layer = 2 * record.tokens.len() as u64 * record.kv_cols as u64;
        let whole = (r.at as u64)
            .saturating_add((layer_count as u64).saturating_mul(per_layer).saturating_mul(2))
            .saturating_add(32);
        if whole != len {
            return Err(RecordError::Malformed(format!("{len} bytes where the record takes {whole}")));
        }
        Ok(record)
    }
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_text(out: &mut Vec<u8>, s: &str) {
    put_u32(out, s.len() as u32);
    out.extend_from_slice(s.as_bytes());
}

fn put_scope(out: &mut Vec<u8>, scope: &RecordScope) {
    match scope {
        RecordScope::Public { template } => {
            out.push(0);
            put_text(out, template);
        }
        RecordScope::Tenant { tenant, salt } => {
            out.push(1);
            put_text(out, tenant);
            match salt {
                None => out.push(0),
                Some(s) => {
                    out.push(1);
                    put_text(out, s);
                }
            }
        }
    }
}

/// Reads a record's body; every read checks what is left.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    /// A record's fields before its rows (the rows left empty), checked, and its layer count.
    fn head(&mut self, fingerprint: &[u8; 32]) -> Result<(KvRecord, usize), RecordError> {
        let stored: [u8; 32] = self.array()?;
        if &stored != fingerprint {
            return Err(RecordError::OtherModel);
        }
        let scope = self.scope()?;
        let parent: [u8; 32] = self.array()?;
        let n = self.count(MAX_TOKENS, 4)?;
        let tokens = (0..n).map(|_| self.u32()).collect::<Result<Vec<_>, _>>()?;
        let tag_count = self.count(MAX_TAGS, 16)?;
        let mut tags = Vec::with_capacity(tag_count);
        for _ in 0..tag_count {
            let (start, end) = (self.u32()?, self.u32()?);
            if start > end || end as usize > tokens.len() {
                return Err(RecordError::Malformed(format!("a tag over {start}..{end} of {} tokens", tokens.len())));
            }
            tags.push(RecordTag { range: start..end, source: self.text()?, version: self.text()? });
        }
        let kv_cols = self.u32()?;
        let layer_count = self.count(MAX_LAYERS, 0)?;
        Ok((KvRecord { fingerprint: stored, scope, parent, tokens, tags, kv_cols, layers: Vec::new() }, layer_count))
    }

    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn take(&mut self, n: usize) -> Result<&[u8], RecordError> {
        if self.left() < n {
            return Err(RecordError::Truncated);
        }
        let s = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], RecordError> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    fn u8(&mut self) -> Result<u8, RecordError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, RecordError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// A count of items of at least `min_bytes` each: at most `max`, and no more than the
    /// bytes left could hold.
    fn count(&mut self, max: usize, min_bytes: usize) -> Result<usize, RecordError> {
        let n = self.u32()? as usize;
        if n > max || n.saturating_mul(min_bytes) > self.left() {
            return Err(RecordError::Malformed(format!("a count of {n}")));
        }
        Ok(n)
    }

    fn text(&mut self) -> Result<String, RecordError> {
        let n = self.count(MAX_TEXT, 1)?;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| RecordError::Malformed("text that is not UTF-8".into()))
    }

    fn scope(&mut self) -> Result<RecordScope, RecordError> {
        match self.u8()? {
            0 => Ok(RecordScope::Public { template: self.text()? }),
            1 => {
                let tenant = self.text()?;
                let salt = match self.u8()? {
                    0 => None,
                    1 => Some(self.text()?),
                    b => return Err(RecordError::Malformed(format!("salt marker {b}"))),
                };
                Ok(RecordScope::Tenant { tenant, salt })
            }
            b => Err(RecordError::Malformed(format!("scope kind {b}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachet_kernels::testing::Lcg;

    fn record(rng: &mut Lcg) -> KvRecord {
        let tokens: Vec<u32> = (0..37).map(|_| rng.next_u32() % 151_000).collect();
        let kv_cols = 8;
        KvRecord {
            fingerprint: [3; 32],
            scope: RecordScope::Tenant { tenant: "acme".into(), salt: Some("user-9".into()) },
            parent: [9; 32],
            tags: vec![
                RecordTag { range: 0..10, source: "repo:main:src/lib.rs".into(), version: "ab12".into() },
                RecordTag { range: 10..37, source: "repo:main:src/cart.rs".into(), version: "cd34".into() },
            ],
            layers: (0..3).map(|_| (0..2 * tokens.len() * kv_cols).map(|_| rng.next_u32() as u16).collect()).collect(),
            tokens,
            kv_cols: kv_cols as u32,
        }
    }

    #[test]
    fn a_record_round_trips_and_names_its_chain() {
        let r = record(&mut Lcg::new(1));
        let bytes = r.encode();
        assert_eq!(KvRecord::decode(&bytes, &[3; 32]).unwrap(), r);
        // The chain key depends on the scope, the parent and the tokens.
        let other_tenant = RecordScope::Tenant { tenant: "globex".into(), salt: Some("user-9".into()) };
        assert_ne!(r.key(), chain_key(&r.parent, &other_tenant, &r.tokens));
        assert_ne!(r.key(), chain_key(&[0; 32], &r.scope, &r.tokens));
        assert_ne!(r.key(), chain_key(&r.parent, &r.scope, &r.tokens[1..]));
        let public = RecordScope::Public { template: "chat".into() };
        let p = KvRecord { scope: public, tags: Vec::new(), ..r.clone() };
        assert_eq!(KvRecord::decode(&p.encode(), &[3; 32]).unwrap(), p);
    }

    /// Every truncation and every single flipped byte is refused (never a panic, never a
    /// record); another model's or another version's record too.
    #[test]
    fn truncated_corrupt_foreign_and_future_records_are_refused() {
        let r = record(&mut Lcg::new(2));
        let bytes = r.encode();
        for cut in 0..bytes.len() {
            assert!(KvRecord::decode(&bytes[..cut], &[3; 32]).is_err(), "cut at {cut}");
        }
        let mut rng = Lcg::new(3);
        for _ in 0..500 {
            let mut bad = bytes.clone();
            let at = rng.next_u32() as usize % bad.len();
            bad[at] ^= 1 << (rng.next_u32() % 8);
            let err = KvRecord::decode(&bad, &[3; 32]).unwrap_err();
            assert!(
                matches!(err, RecordError::Checksum | RecordError::NotARecord | RecordError::Version(_)),
                "byte {at}: {err}"
            );
        }
        assert_eq!(KvRecord::decode(&bytes, &[4; 32]), Err(RecordError::OtherModel));
        let mut future = bytes.clone();
        future[8] = 2;
        assert_eq!(KvRecord::decode(&future, &[3; 32]), Err(RecordError::Version(2)));
        assert_eq!(KvRecord::decode(b"not a record at all", &[3; 32]), Err(RecordError::NotARecord));
    }

    /// A record whose checksum is right but whose lengths lie (a writer's bug, or a forged
    /// file) is refused without allocating what the lengths claim.
    #[test]
    fn lengths_that_lie_are_refused_before_allocating() {
        let r = record(&mut Lcg::new(4));
        let mut body = r.encode();
        body.truncate(body.len() - 32);
        // The token count sits after magic, version, fingerprint, scope and parent.
        let mut scope = Vec::new();
        put_scope(&mut scope, &r.scope);
        let at = 8 + 2 + 32 + scope.len() + 32;
        body[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        let sum: [u8; 32] = Sha256::digest(&body).into();
        body.extend_from_slice(&sum);
        assert!(matches!(KvRecord::decode(&body, &[3; 32]), Err(RecordError::Malformed(_))));
    }
}
