//! The eligible files of a commit, each with its (cached) analysis. Blob contents are read only on
//! a cache miss: what a blob is (binary, generated, its outline) never changes.

use std::sync::Arc;

use git2::{Oid, Repository};
use moka::sync::Cache;

use crate::outline::{analyze_as, FileAnalysis, Lang};
use crate::rules::{classify, FileFilter};
use crate::store::tree::{blob_bytes, blob_size, list_files};
use crate::{BlobId, CommitId, ContextError};

/// What the context needs to know about one blob, as a given language (or as plain text).
#[derive(Debug)]
pub(crate) struct BlobInfo {
    pub size: u64,
    pub binary: bool,
    pub generated: bool,
    pub analysis: Arc<FileAnalysis>,
}

/// Blob facts by (blob, language of the path's extension).
pub(crate) type BlobCache = Cache<(Oid, Option<Lang>), Arc<BlobInfo>>;

/// An eligible file.
#[derive(Clone, Debug)]
pub(crate) struct Candidate {
    pub path: String,
    pub oid: Oid,
    pub blob: BlobId,
    pub info: Arc<BlobInfo>,
    /// The repository's `include` rules name it.
    pub included: bool,
}

impl Candidate {
    pub(crate) fn analysis(&self) -> &FileAnalysis {
        &self.info.analysis
    }
}

/// The files at `commit` that pass `filter`, sorted by path.
pub(crate) fn candidates(
    repo: &Repository,
    commit: &CommitId,
    filter: &FileFilter,
    cache: &BlobCache,
) -> Result<Vec<Candidate>, ContextError> {
    let mut out = Vec::new();
    for file in list_files(repo, commit, |dir| filter.prunes_dir(dir))? {
        if filter.check_path(&file.path).is_err() {
            continue;
        }
        let lang = Lang::from_path(&file.path);
        let key = (file.blob, lang);
        let cached = cache.get(&key);
        let size = match &cached {
            Some(info) => info.size,
            None => blob_size(repo, file.blob)?,
        };
        if filter.check_size(size).is_err() {
            continue;
        }
        let info = match cached {
            Some(info) => info,
            None => {
                let info = Arc::new(blob_info(&blob_bytes(repo, file.blob)?, lang));
                cache.insert(key, info.clone());
                info
            }
        };
        if filter.check_content(&file.path, info.binary, info.generated).is_err() {
            continue;
        }
        let included = filter.includes(&file.path);
        out.push(Candidate { blob: BlobId::from_oid(file.blob), oid: file.blob, path: file.path, info, included });
    }
    Ok(out)
}

/// The facts of any blob as `lang`, from the cache or read and analysed now.
pub(crate) fn cached_info(
    repo: &Repository,
    oid: Oid,
    lang: Option<Lang>,
    cache: &BlobCache,
) -> Result<Arc<BlobInfo>, ContextError> {
    if let Some(info) = cache.get(&(oid, lang)) {
        return Ok(info);
    }
    let info = Arc::new(blob_info(&blob_bytes(repo, oid)?, lang));
    cache.insert((oid, lang), info.clone());
    Ok(info)
}

fn blob_info(bytes: &[u8], lang: Option<Lang>) -> BlobInfo {
    let (binary, generated) = classify(bytes);
    let analysis = match (binary, lang, std::str::from_utf8(bytes)) {
        (false, Some(lang), Ok(text)) => analyze_as(lang, text),
        _ => FileAnalysis::default(),
    };
    BlobInfo { size: bytes.len() as u64, binary, generated, analysis: Arc::new(analysis) }
}

/// The text of an eligible blob (eligible blobs are UTF-8).
pub(crate) fn blob_text(repo: &Repository, oid: Oid) -> Result<String, ContextError> {
    String::from_utf8(blob_bytes(repo, oid)?).map_err(|_| {
        ContextError::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("blob {oid} is not UTF-8")))
    })
}
