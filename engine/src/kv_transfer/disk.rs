//! A directory of [`KvRecord`]s: the disk tier's storage (the engine's use of it:
//! `runtime::tier`).
//!
//! One file per chunk, named by its chain key (`<hex>.kv`, mode 0600, in a 0700 directory),
//! written to a temporary name and renamed, so a crash leaves a whole file or none. The index
//! (size, tenant, parent chunk, provenance tags, last use) lives in memory and is rebuilt by
//! [`DiskTier::open`] from the files, so the tier survives a restart. A file that is corrupt or
//! truncated is discarded (deleted) when found; a file of another model or format is left alone
//! and not used. Beyond `max_bytes` the least recently used files go, first those of a tenant
//! past its share of the bound.
//!
//! Invalidation follows the chain as the cache's does its subtree: the chunks after an
//! invalidated one go with it (they were computed after the stale text).

use super::{KvRecord, RecordError, RecordScope};
use std::collections::HashMap;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

#[derive(Clone, Debug)]
struct Entry {
    bytes: u64,
    tenant: Option<String>,
    /// The chain key of the chunk before (all zeros for a first chunk).
    parent: [u8; 32],
    /// (source, version) of each tag.
    tags: Vec<(String, String)>,
    used_at: u64,
}

/// What [`DiskTier::open`] found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Opened {
    /// Records of this model, indexed.
    pub records: usize,
    /// Corrupt or truncated files, deleted.
    pub discarded: usize,
    /// Files of another model or format version, left alone.
    pub ignored: usize,
}

/// The tier's directory and its index.
#[derive(Debug)]
pub struct DiskTier {
    dir: PathBuf,
    fingerprint: [u8; 32],
    max_bytes: u64,
    entries: HashMap<[u8; 32], Entry>,
    used: u64,
    clock: u64,
    /// Shares of `max_bytes` per tenant (others: `default_share`).
    shares: HashMap<String, f64>,
    default_share: f64,
}

/// A chain key as 64 hex digits (a record's file name, and its name between replicas).
pub fn hex(key: &[u8; 32]) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

/// The chain key of 64 hex digits; `None` for anything else.
pub fn from_hex(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 {
        return None;
    }
    let mut key = [0u8; 32];
    for (i, byte) in key.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(key)
}

fn unhex(name: &str) -> Option<[u8; 32]> {
    from_hex(name.strip_suffix(".kv")?)
}

/// How much of a stored record opening the tier reads: its fields before the rows (a chunk of 256
/// tokens takes about 1 KiB of them, its rows megabytes).
const HEAD_BYTES: usize = 64 << 10;

/// The fields of the record stored at `path`, its rows left empty, from its first bytes (the whole
/// file when they do not hold them): see [`KvRecord::decode_head`]. Opening a tier indexes its
/// records this way, so a restart reads kilobytes per chunk, not the rows; a chunk's checksum is
/// checked when it is loaded.
fn read_head(path: &Path, fingerprint: &[u8; 32]) -> io::Result<Result<KvRecord, RecordError>> {
    use std::io::Read;
    let file = fs::File::open(path)?;
    let len = file.metadata()?.len();
    let mut head = Vec::with_capacity(HEAD_BYTES);
    file.take(HEAD_BYTES as u64).read_to_end(&mut head)?;
    match KvRecord::decode_head(&head, len, fingerprint) {
        Err(RecordError::Truncated | RecordError::Malformed(_)) if (head.len() as u64) < len => {
            Ok(KvRecord::decode_head(&fs::read(path)?, len, fingerprint))
        }
        r => Ok(r),
    }
}

impl DiskTier {
    /// Opens (creating it, 0700) the tier in `dir` for the model of `fingerprint`, keeping at
    /// most `max_bytes` of records; indexes the records already there (from their heads: a file
    /// of the wrong length is discarded now, one whose rows are corrupt when it is read).
    pub fn open(dir: &Path, fingerprint: [u8; 32], max_bytes: u64) -> io::Result<(DiskTier, Opened)> {
        fs::create_dir_all(dir)?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
        let mut tier = DiskTier {
            dir: dir.to_path_buf(),
            fingerprint,
            max_bytes,
            entries: HashMap::new(),
            used: 0,
            clock: 0,
            shares: HashMap::new(),
            default_share: 1.0,
        };
        let mut opened = Opened::default();
        for item in fs::read_dir(dir)? {
            let item = item?;
            let name = item.file_name();
            let Some(key) = name.to_str().and_then(unhex) else {
                // A temporary file a crash left behind, or something else: not the tier's.
                if name.to_str().is_some_and(|n| n.ends_with(".kv.tmp")) {
                    let _ = fs::remove_file(item.path());
                }
                continue;
            };
            match read_head(&item.path(), &fingerprint)? {
                Ok(record) if record.key() == key => {
                    tier.index(key, &record, item.metadata()?.len());
                    opened.records += 1;
                }
                Err(RecordError::OtherModel | RecordError::Version(_)) => opened.ignored += 1,
                // Corrupt, truncated, or not the record its name says.
                _ => {
                    fs::remove_file(item.path())?;
                    opened.discarded += 1;
                }
            }
        }
        tier.evict_to(tier.max_bytes)?;
        Ok((tier, opened))
    }

    fn path(&self, key: &[u8; 32]) -> PathBuf {
        DiskTier::file(&self.dir, key)
    }

    /// The file of `key`'s record in a tier's directory `dir`.
    pub fn file(dir: &Path, key: &[u8; 32]) -> PathBuf {
        dir.join(format!("{}.kv", hex(key)))
    }

    fn index(&mut self, key: [u8; 32], record: &KvRecord, bytes: u64) {
        self.clock += 1;
        let tenant = match &record.scope {
            RecordScope::Tenant { tenant, .. } => Some(tenant.clone()),
            RecordScope::Public { .. } => None,
        };
        let tags = record.tags.iter().map(|t| (t.source.clone(), t.version.clone())).collect();
        let entry = Entry { bytes, tenant, parent: record.parent, tags, used_at: self.clock };
        if let Some(old) = self.entries.insert(key, entry) {
            self.used -= old.bytes;
        }
        self.used += bytes;
    }

    /// Writes `record` (replacing a file of the same key), then evicts the least recently used
    /// records beyond the bound. A record of another model is refused.
    pub fn put(&mut self, record: &KvRecord) -> io::Result<()> {
        if record.fingerprint != self.fingerprint {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a K/V record of another model"));
        }
        let bytes = DiskTier::write(&self.dir, record)?;
        self.written(record, bytes)
    }

    /// Writes `record`'s file into the tier's directory `dir` without touching an index (a
    /// writer thread does this outside the index's lock, then calls [`DiskTier::written`]).
    /// Returns the file's size.
    pub fn write(dir: &Path, record: &KvRecord) -> io::Result<u64> {
        let bytes = record.encode();
        let path = DiskTier::file(dir, &record.key());
        let tmp = path.with_extension("kv.tmp");
        {
            let mut f = fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_data()?;
        }
        fs::rename(&tmp, &path)?;
        Ok(bytes.len() as u64)
    }

    /// Indexes a record [`DiskTier::write`] wrote (`bytes` long), then evicts the least recently
    /// used records beyond the bound.
    pub fn written(&mut self, record: &KvRecord, bytes: u64) -> io::Result<()> {
        self.index(record.key(), record, bytes);
        self.evict_to(self.max_bytes)
    }

    /// The tier's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Sets `tenant`'s share of the bound (a fraction; beyond it, its records go first).
    pub fn set_share(&mut self, tenant: &str, share: f64) {
        self.shares.insert(tenant.to_string(), share);
    }

    /// The share of tenants without one of their own.
    pub fn set_default_share(&mut self, share: f64) {
        self.default_share = share;
    }

    /// The record of `key`, if the tier has it intact (a corrupt one is deleted: `None`).
    pub fn get(&mut self, key: &[u8; 32]) -> io::Result<Option<KvRecord>> {
        if !self.entries.contains_key(key) {
            return Ok(None);
        }
        let path = self.path(key);
        let read = match fs::read(&path) {
            Ok(b) => KvRecord::decode(&b, &self.fingerprint).ok().filter(|r| r.key() == *key),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        match read {
            Some(record) => {
                self.clock += 1;
                if let Some(e) = self.entries.get_mut(key) {
                    e.used_at = self.clock;
                }
                Ok(Some(record))
            }
            None => {
                self.remove(key)?;
                Ok(None)
            }
        }
    }

    /// Whether the tier holds `key`.
    pub fn contains(&self, key: &[u8; 32]) -> bool {
        self.entries.contains_key(key)
    }

    /// Deletes the record of `key`; whether there was one.
    pub fn remove(&mut self, key: &[u8; 32]) -> io::Result<bool> {
        let Some(e) = self.entries.remove(key) else { return Ok(false) };
        self.used -= e.bytes;
        match fs::remove_file(self.path(key)) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
            _ => Ok(true),
        }
    }

    /// Deletes every record with a tag of `source` whose version is not `keep_version` (a push
    /// changed that file): what the engine's cache does in memory. Returns how many.
    /// The chunks chained after them go too (returned in the count).
    pub fn invalidate(&mut self, source: &str, keep_version: Option<&str>) -> io::Result<usize> {
        let stale: Vec<[u8; 32]> = self
            .entries
            .iter()
            .filter(|(_, e)| e.tags.iter().any(|(s, v)| s == source && Some(v.as_str()) != keep_version))
            .map(|(k, _)| *k)
            .collect();
        self.remove_chains(stale)
    }

    /// Deletes every record of `tenant` (a deleted tenant's K/V must not stay on disk); how many.
    pub fn purge_tenant(&mut self, tenant: &str) -> io::Result<usize> {
        let theirs: Vec<[u8; 32]> =
            self.entries.iter().filter(|(_, e)| e.tenant.as_deref() == Some(tenant)).map(|(k, _)| *k).collect();
        self.remove_chains(theirs)
    }

    /// Removes `roots` and every record chained after one of them.
    fn remove_chains(&mut self, roots: Vec<[u8; 32]>) -> io::Result<usize> {
        let mut gone: std::collections::HashSet<[u8; 32]> = std::collections::HashSet::new();
        let mut next = roots;
        while !next.is_empty() {
            for key in &next {
                if self.remove(key)? {
                    gone.insert(*key);
                }
            }
            next = self.entries.iter().filter(|(_, e)| gone.contains(&e.parent)).map(|(k, _)| *k).collect();
        }
        Ok(gone.len())
    }

    /// Bytes of records on disk.
    pub fn bytes(&self) -> u64 {
        self.used
    }

    /// Bytes of `tenant`'s records.
    pub fn tenant_bytes(&self, tenant: &str) -> u64 {
        self.entries.values().filter(|e| e.tenant.as_deref() == Some(tenant)).map(|e| e.bytes).sum()
    }

    /// Records indexed.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the tier holds no record.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn evict_to(&mut self, bound: u64) -> io::Result<()> {
        while self.used > bound {
            // A tenant past its share loses its own least recently used first.
            let mut per_tenant: HashMap<&str, u64> = HashMap::new();
            for e in self.entries.values() {
                if let Some(t) = &e.tenant {
                    *per_tenant.entry(t).or_default() += e.bytes;
                }
            }
            let share = |t: &str| self.shares.get(t).copied().unwrap_or(self.default_share);
            let over: Vec<&str> = per_tenant
                .iter()
                .filter(|(t, &b)| b as f64 > share(t) * self.max_bytes as f64)
                .map(|(t, _)| *t)
                .collect();
            let victim = self
                .entries
                .iter()
                .filter(|(_, e)| over.is_empty() || e.tenant.as_deref().is_some_and(|t| over.contains(&t)))
                .min_by_key(|(_, e)| e.used_at)
                .map(|(k, _)| *k);
            let Some(oldest) = victim else { break };
            self.remove(&oldest)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::RecordTag;
    use super::*;

    fn record(tenant: &str, first: u32, source: &str, version: &str) -> KvRecord {
        let tokens: Vec<u32> = (first..first + 16).collect();
        KvRecord {
            fingerprint: [5; 32],
            scope: RecordScope::Tenant { tenant: tenant.into(), salt: None },
            parent: [0; 32],
            tags: vec![RecordTag { range: 0..16, source: source.into(), version: version.into() }],
            kv_cols: 4,
            layers: vec![(0..2 * 16 * 4).map(|i| (i * 7 + first) as u16).collect(); 2],
            tokens,
        }
    }

    #[test]
    fn records_survive_a_reopen_and_files_are_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tier");
        let (mut tier, opened) = DiskTier::open(&path, [5; 32], 1 << 20).unwrap();
        assert_eq!(opened, Opened::default());
        let a = record("acme", 0, "r:main:a.rs", "v1");
        tier.put(&a).unwrap();
        assert_eq!(tier.get(&a.key()).unwrap(), Some(a.clone()));
        let file = path.join(format!("{}.kv", hex(&a.key())));
        assert_eq!(fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o700);
        drop(tier);
        let (mut again, opened) = DiskTier::open(&path, [5; 32], 1 << 20).unwrap();
        assert_eq!(opened.records, 1);
        assert_eq!(again.get(&a.key()).unwrap(), Some(a.clone()));
        assert_eq!(again.tenant_bytes("acme"), again.bytes());
        assert_eq!(again.tenant_bytes("globex"), 0);
    }

    /// Opening indexes records from their heads: a large record's rows are not read (a corruption
    /// there is found when the chunk is loaded, and the file deleted then); a file of the wrong
    /// length is discarded at once; a head longer than the first read is read whole.
    #[test]
    fn opening_reads_heads_and_a_corrupt_row_is_found_at_the_load() {
        let dir = tempfile::tempdir().unwrap();
        let (mut tier, _) = DiskTier::open(dir.path(), [5; 32], 1 << 30).unwrap();
        let big = KvRecord { kv_cols: 1024, layers: vec![vec![3; 2 * 16 * 1024]; 4], ..record("acme", 0, "s", "v") };
        let long_head = KvRecord {
            tags: (0..4000)
                .map(|i| RecordTag { range: 0..16, source: format!("src/{i:040}.rs"), version: "v".into() })
                .collect(),
            ..record("acme", 100, "s", "v")
        };
        tier.put(&big).unwrap();
        tier.put(&long_head).unwrap();
        let file = dir.path().join(format!("{}.kv", hex(&big.key())));
        let mut bytes = fs::read(&file).unwrap();
        assert!(bytes.len() > 4 * HEAD_BYTES && long_head.encode().len() > 2 * HEAD_BYTES);
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x01;
        fs::write(&file, &bytes).unwrap();
        drop(tier);
        let (mut tier, opened) = DiskTier::open(dir.path(), [5; 32], 1 << 30).unwrap();
        assert_eq!(opened, Opened { records: 2, discarded: 0, ignored: 0 });
        assert_eq!(tier.get(&long_head.key()).unwrap(), Some(long_head));
        assert_eq!(tier.get(&big.key()).unwrap(), None, "the checksum is checked at the load");
        assert!(!file.exists() && !tier.contains(&big.key()));
        // One byte more than the record takes: discarded when the tier opens.
        let extra = record("acme", 200, "s", "v");
        tier.put(&extra).unwrap();
        let file = dir.path().join(format!("{}.kv", hex(&extra.key())));
        let mut bytes = fs::read(&file).unwrap();
        bytes.push(0);
        fs::write(&file, &bytes).unwrap();
        drop(tier);
        let (_, opened) = DiskTier::open(dir.path(), [5; 32], 1 << 30).unwrap();
        assert_eq!(opened, Opened { records: 1, discarded: 1, ignored: 0 });
    }

    #[test]
    fn corrupt_files_are_discarded_and_other_models_files_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let (mut tier, _) = DiskTier::open(dir.path(), [5; 32], 1 << 20).unwrap();
        let (a, b) = (record("acme", 0, "s", "v"), record("acme", 100, "s", "v"));
        tier.put(&a).unwrap();
        tier.put(&b).unwrap();
        // Corrupt a in place: found at the next read, deleted, a miss.
        let file_a = dir.path().join(format!("{}.kv", hex(&a.key())));
        let mut bytes = fs::read(&file_a).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x40;
        fs::write(&file_a, &bytes).unwrap();
        assert_eq!(tier.get(&a.key()).unwrap(), None);
        assert!(!file_a.exists() && !tier.contains(&a.key()));
        // Truncate b: found at the next open, deleted.
        let file_b = dir.path().join(format!("{}.kv", hex(&b.key())));
        let bytes = fs::read(&file_b).unwrap();
        fs::write(&file_b, &bytes[..bytes.len() - 10]).unwrap();
        // Another model's record under its own name: left alone, not used.
        let other = KvRecord { fingerprint: [6; 32], ..record("acme", 200, "s", "v") };
        let file_o = dir.path().join(format!("{}.kv", hex(&other.key())));
        fs::write(&file_o, other.encode()).unwrap();
        // A record under another record's name: discarded.
        let c = record("acme", 300, "s", "v");
        fs::write(dir.path().join(format!("{}.kv", hex(&a.key()))), c.encode()).unwrap();
        drop(tier);
        let (tier, opened) = DiskTier::open(dir.path(), [5; 32], 1 << 20).unwrap();
        assert_eq!(opened, Opened { records: 0, discarded: 2, ignored: 1 });
        assert!(tier.is_empty() && !file_b.exists() && file_o.exists());
    }

    #[test]
    fn the_least_recently_used_go_beyond_the_bound_and_pushes_invalidate_by_source() {
        let dir = tempfile::tempdir().unwrap();
        // Room for three records (all of one size: names of equal lengths).
        let one = record("acme", 0, "f0", "v1").encode().len() as u64;
        let (mut tier, _) = DiskTier::open(dir.path(), [5; 32], 3 * one).unwrap();
        let rs: Vec<KvRecord> = (0..3).map(|i| record("acme", i * 100, &format!("f{i}"), "v1")).collect();
        for r in &rs {
            tier.put(r).unwrap();
        }
        // Using the first makes the second the least recently used.
        assert!(tier.get(&rs[0].key()).unwrap().is_some());
        let d = record("beta", 900, "f9", "v1");
        tier.put(&d).unwrap();
        assert!(tier.bytes() <= 3 * one);
        assert!(!tier.contains(&rs[1].key()) && tier.contains(&rs[0].key()) && tier.contains(&d.key()));
        // A push of f2 to v2 removes f2's records; keeping f0 at its version keeps them.
        assert_eq!(tier.invalidate("f2", Some("v2")).unwrap(), 1);
        assert_eq!(tier.invalidate("f0", Some("v1")).unwrap(), 0);
        assert!(!tier.contains(&rs[2].key()) && tier.contains(&rs[0].key()));
        let foreign = KvRecord { fingerprint: [6; 32], ..d };
        assert_eq!(tier.put(&foreign).unwrap_err().kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn invalidation_follows_the_chain_and_a_tenant_past_its_share_goes_first() {
        let dir = tempfile::tempdir().unwrap();
        let one = record("acme", 0, "f0", "v1").encode().len() as u64;
        let (mut tier, _) = DiskTier::open(dir.path(), [5; 32], 4 * one).unwrap();
        // acme: a chain of three chunks, the middle one tagged f1.
        let mut chain = Vec::new();
        let mut parent = [0; 32];
        for (i, source) in ["f0", "f1", "f2"].iter().enumerate() {
            let r = KvRecord { parent, ..record("acme", i as u32 * 16, source, "v1") };
            parent = r.key();
            tier.put(&r).unwrap();
            chain.push(r);
        }
        assert_eq!(tier.invalidate("f1", Some("v2")).unwrap(), 2, "f1's chunk and the one after it");
        assert!(tier.contains(&chain[0].key()) && !tier.contains(&chain[2].key()));
        // acme may keep a quarter of the bound: its older chunk goes before beta's.
        tier.set_share("acme", 0.25);
        let b1 = record("beta", 500, "g", "v1");
        let b2 = record("beta", 600, "g", "v1");
        let a2 = record("acme", 700, "f9", "v1");
        tier.put(&b1).unwrap();
        // acme's first chunk used after beta's: plain LRU would evict beta's.
        assert!(tier.get(&chain[0].key()).unwrap().is_some());
        tier.put(&a2).unwrap();
        tier.put(&b2).unwrap();
        let b3 = record("beta", 800, "g", "v1");
        tier.put(&b3).unwrap();
        assert!(!tier.contains(&chain[0].key()) && tier.contains(&b1.key()), "acme was past its share");
        assert_eq!(tier.purge_tenant("beta").unwrap(), 3);
        assert_eq!(tier.len(), 1);
    }
}
