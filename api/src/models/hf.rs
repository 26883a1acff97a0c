//! Model files from the Hugging Face hub: `hf:OWNER/REPO/FILE.gguf[@REVISION]`.
//!
//! [`pull`] speaks the hub's HTTP API as its own client libraries do:
//! 1. `GET {endpoint}/api/models/{owner}/{repo}/revision/{revision}?blobs=true`
//!    gives the revision's commit and, for every file kept in LFS (every model
//!    file), its size and SHA-256. A file the hub publishes no SHA-256 for is
//!    refused: nothing unverified is ever used.
//! 2. `GET {endpoint}/{owner}/{repo}/resolve/{commit}/{file}` (redirects are
//!    followed; the token is not sent to another host) streams the file into
//!    `.<file>.<sha256 prefix>.incomplete` beside its final place,
//!    `<models dir>/hf/<owner>/<repo>/<file>`, hashing as it goes. A download
//!    that stops part way keeps its bytes, and the next pull asks for the rest
//!    (`Range: bytes=N-`); a server that answers the whole file instead is
//!    followed from byte 0. The incomplete file is named by the expected hash,
//!    so the bytes of another revision are never resumed.
//! 3. The size and SHA-256 are checked, the file synced and renamed into place.
//!    A mismatch removes the incomplete file.
//!
//! The endpoint is `$HF_ENDPOINT` (default `https://huggingface.co`) and the
//! token `$HF_TOKEN`, the variables the hub's own clients read.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::{fingerprint, io_err, lock_model, verify_file, Progress, PullError, PullEvent, Reporter};

/// A file on the hub, as `hf:OWNER/REPO/FILE[@REVISION]` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HfFile {
    pub owner: String,
    pub repo: String,
    /// The file's path in the repository (may contain `/`).
    pub file: String,
    /// A branch, tag or commit; `main` when left out.
    pub revision: String,
}

impl FromStr for HfFile {
    type Err = PullError;

    fn from_str(spec: &str) -> Result<Self, PullError> {
        let bad = |reason: &str| PullError::BadName { name: spec.to_string(), reason: reason.to_string() };
        let rest = spec.strip_prefix("hf:").ok_or_else(|| bad("a Hugging Face file starts with hf:"))?;
        let (path, revision) = match rest.rsplit_once('@') {
            Some((p, r)) if !r.is_empty() => (p, r),
            Some(_) => return Err(bad("the revision after @ is empty")),
            None => (rest, "main"),
        };
        let mut parts = path.splitn(3, '/');
        let (Some(owner), Some(repo), Some(file)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad("expected hf:OWNER/REPO/FILE[@REVISION]"));
        };
        let name_ok = |s: &str| {
            !s.is_empty()
                && s != "."
                && s != ".."
                && s.len() <= 96
                && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        };
        if !name_ok(owner) || !name_ok(repo) {
            return Err(bad("an owner or repository name is letters, digits, '-', '_' and '.'"));
        }
        let segment_ok = |s: &str| {
            !s.is_empty()
                && s != "."
                && s != ".."
                && !s.starts_with('.')
                && !s.chars().any(|c| c.is_control() || c == '\\')
        };
        if file.len() > 1024 || !file.split('/').all(segment_ok) {
            return Err(bad("the file must be a relative path inside the repository"));
        }
        if revision.len() > 256 || revision.chars().any(|c| c.is_control() || c == ' ') {
            return Err(bad("the revision is a branch, tag or commit"));
        }
        Ok(HfFile { owner: owner.into(), repo: repo.into(), file: file.into(), revision: revision.into() })
    }
}

impl std::fmt::Display for HfFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "hf:{}/{}/{}", self.owner, self.repo, self.file)?;
        if self.revision != "main" {
            write!(f, "@{}", self.revision)?;
        }
        Ok(())
    }
}

impl HfFile {
    /// Where the verified file lives under the models folder `dir`.
    pub fn local_path(&self, dir: &Path) -> PathBuf {
        let mut path = dir.join("hf").join(&self.owner).join(&self.repo);
        path.extend(self.file.split('/'));
        path
    }
}

/// Where and as whom [`pull`] talks to the hub.
#[derive(Debug, Clone)]
pub struct HfOptions {
    /// The hub's base URL, without a trailing slash.
    pub endpoint: String,
    /// A bearer token for gated or private repositories.
    pub token: Option<String>,
    pub progress: Progress,
}

impl Default for HfOptions {
    /// `$HF_ENDPOINT` (else `https://huggingface.co`) and `$HF_TOKEN`.
    fn default() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        HfOptions {
            endpoint: var("HF_ENDPOINT")
                .unwrap_or_else(|| "https://huggingface.co".into())
                .trim_end_matches('/')
                .into(),
            token: var("HF_TOKEN"),
            progress: Progress::Auto,
        }
    }
}

/// What the hub says about one file at one commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    pub commit: String,
    pub size: u64,
    pub sha256: String,
}

/// Makes sure `file` is present under `dir` and matches what the hub publishes
/// for it, downloading (or resuming) it if needed; returns its path.
pub fn pull(file: &HfFile, dir: &Path, opts: &HfOptions) -> Result<PathBuf, PullError> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| PullError::Hub {
        url: opts.endpoint.clone(),
        reason: format!("cannot start an HTTP client: {e}"),
    })?;
    rt.block_on(pull_async(file, dir, opts))
}

async fn pull_async(file: &HfFile, dir: &Path, opts: &HfOptions) -> Result<PathBuf, PullError> {
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(30))
        .read_timeout(Duration::from_secs(120))
        .user_agent(concat!("cachet/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| PullError::Hub {
            url: opts.endpoint.clone(),
            reason: format!("cannot build an HTTP client: {e}"),
        })?;
    let published = metadata(&client, file, opts).await?;
    let dest = file.local_path(dir);
    let folder = dest.parent().unwrap_or(dir).to_path_buf();
    let base = dest.file_name().map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned());
    let report = Reporter::new(&opts.progress, published.size);

    let seen = fingerprint(&dest);
    if seen.is_some() && verify_existing(&dest, &published, &report)? {
        report.event(PullEvent::Present { path: dest.clone() });
        return Ok(dest);
    }
    let _lock = lock_model(&folder, &base, &report)?;
    let now = fingerprint(&dest);
    if now.is_some() && now != seen && verify_existing(&dest, &published, &report)? {
        report.event(PullEvent::Present { path: dest.clone() });
        return Ok(dest);
    }

    let partial_path = folder.join(format!(".{base}.{}.incomplete", &published.sha256[..16]));
    let mut partial = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&partial_path)
        .map_err(io_err("cannot open", &partial_path))?;
    let (mut hasher, mut done) = hash_prefix(&mut partial, &partial_path, published.size)?;
    if done < published.size {
        let url = format!(
            "{}/{}/{}/resolve/{}/{}",
            opts.endpoint,
            file.owner,
            file.repo,
            published.commit,
            file.file.split('/').map(encode).collect::<Vec<_>>().join("/")
        );
        report.event(PullEvent::Downloading { url: url.clone(), from: done });
        download(&client, &url, opts, (&mut partial, &partial_path), &mut hasher, &mut done, published.size, &report)
            .await?;
    }
    if done != published.size {
        let _ = fs::remove_file(&partial_path);
        return Err(PullError::Size { file: file.to_string(), expected: published.size, actual: done });
    }
    let actual = format!("{:x}", hasher.finalize());
    if !actual.eq_ignore_ascii_case(&published.sha256) {
        let _ = fs::remove_file(&partial_path);
        return Err(PullError::FileHash { file: file.to_string(), expected: published.sha256, actual });
    }
    partial.sync_all().map_err(io_err("cannot sync", &partial_path))?;
    drop(partial);
    fs::rename(&partial_path, &dest).map_err(io_err("cannot rename into", &dest))?;
    if let Ok(d) = File::open(&folder) {
        let _ = d.sync_all();
    }
    report.event(PullEvent::Done { path: dest.clone() });
    Ok(dest)
}

/// Percent-encodes one path segment (RFC 3986 unreserved characters pass).
fn encode(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn authorized(req: reqwest::RequestBuilder, opts: &HfOptions) -> reqwest::RequestBuilder {
    match &opts.token {
        Some(token) => req.bearer_auth(token),
        None => req,
    }
}

/// The hint for a refused request.
fn refusal(status: reqwest::StatusCode, what: &str, opts: &HfOptions) -> String {
    match status.as_u16() {
        401 | 403 if opts.token.is_none() => {
            format!("{status}: {what} is gated or private; set HF_TOKEN to a token that may read it")
        }
        401 | 403 => format!("{status}: the token in HF_TOKEN may not read {what}"),
        404 => format!("{status}: no such repository or revision ({what})"),
        _ => format!("{status} for {what}"),
    }
}

/// Asks the hub for the revision's commit and the file's size and SHA-256.
pub async fn metadata(client: &reqwest::Client, file: &HfFile, opts: &HfOptions) -> Result<Published, PullError> {
    let url = format!(
        "{}/api/models/{}/{}/revision/{}?blobs=true",
        opts.endpoint,
        file.owner,
        file.repo,
        encode(&file.revision)
    );
    let hub = |reason: String| PullError::Hub { url: url.clone(), reason };
    let response = authorized(client.get(&url), opts).send().await.map_err(|e| hub(format!("{e}")))?;
    let status = response.status();
    if !status.is_success() {
        let what = format!("{}/{}@{}", file.owner, file.repo, file.revision);
        return Err(hub(refusal(status, &what, opts)));
    }
    // A revision's listing is a few hundred bytes per file; cap what is read.
    let body = read_capped(response, 16 << 20).await.map_err(hub)?;
    let info: serde_json::Value =
        serde_json::from_slice(&body).map_err(|e| hub(format!("the answer is not JSON: {e}")))?;
    let commit = info["sha"].as_str().filter(|c| c.len() >= 7 && c.bytes().all(|b| b.is_ascii_hexdigit()));
    let commit = commit.ok_or_else(|| hub("the answer names no commit (`sha`)".into()))?;
    let siblings = info["siblings"].as_array().ok_or_else(|| hub("the answer lists no files".into()))?;
    let Some(entry) = siblings.iter().find(|s| s["rfilename"].as_str() == Some(file.file.as_str())) else {
        let ggufs: Vec<&str> =
            siblings.iter().filter_map(|s| s["rfilename"].as_str()).filter(|n| n.ends_with(".gguf")).take(20).collect();
        let listing = if ggufs.is_empty() { "no .gguf files".into() } else { ggufs.join(", ") };
        return Err(hub(format!(
            "{}/{} has no file {:?} at {} ({listing})",
            file.owner, file.repo, file.file, file.revision
        )));
    };
    let lfs = &entry["lfs"];
    let sha256 = lfs["sha256"].as_str().filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    let Some(sha256) = sha256 else {
        return Err(hub(format!("the hub publishes no SHA-256 for {:?} (not an LFS file); refusing it", file.file)));
    };
    let size = lfs["size"].as_u64().or_else(|| entry["size"].as_u64());
    let size = size.ok_or_else(|| hub(format!("the hub publishes no size for {:?}", file.file)))?;
    Ok(Published { commit: commit.to_ascii_lowercase(), size, sha256: sha256.to_ascii_lowercase() })
}

async fn read_capped(mut response: reqwest::Response, cap: usize) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| format!("{e}"))? {
        if body.len() + chunk.len() > cap {
            return Err(format!("the answer is larger than {cap} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Hashes the bytes already in the incomplete file (all of them up to `size`;
/// more than `size` means it is not ours: it is emptied).
fn hash_prefix(partial: &mut File, path: &Path, size: u64) -> Result<(Sha256, u64), PullError> {
    let len = partial.metadata().map_err(io_err("cannot stat", path))?.len();
    let mut hasher = Sha256::new();
    if len > size {
        partial.set_len(0).map_err(io_err("cannot truncate", path))?;
        return Ok((hasher, 0));
    }
    partial.seek(SeekFrom::Start(0)).map_err(io_err("cannot seek", path))?;
    let copied = io::copy(&mut Read::by_ref(partial).take(len), &mut hasher).map_err(io_err("cannot read", path))?;
    Ok((hasher, copied))
}

/// Streams the rest of the file (from `*done`) into `partial`.
#[allow(clippy::too_many_arguments)]
async fn download(
    client: &reqwest::Client,
    url: &str,
    opts: &HfOptions,
    (partial, path): (&mut File, &Path),
    hasher: &mut Sha256,
    done: &mut u64,
    size: u64,
    report: &Reporter,
) -> Result<(), PullError> {
    let mut req = authorized(client.get(url), opts);
    if *done > 0 {
        req = req.header(reqwest::header::RANGE, format!("bytes={}-", *done));
    }
    let interrupted = |done: u64, reason: String| PullError::Interrupted { url: url.into(), done, total: size, reason };
    let mut response = req.send().await.map_err(|e| interrupted(*done, format!("{e}")))?;
    let status = response.status();
    let resumed = status == reqwest::StatusCode::PARTIAL_CONTENT
        && response
            .headers()
            .get(reqwest::header::CONTENT_RANGE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with(&format!("bytes {}-", *done)));
    if status == reqwest::StatusCode::RANGE_NOT_SATISFIABLE || (status.is_success() && !resumed && *done > 0) {
        // The server does not resume here: start over from byte 0.
        partial.set_len(0).map_err(io_err("cannot truncate", path))?;
        *hasher = Sha256::new();
        *done = 0;
        if status == reqwest::StatusCode::RANGE_NOT_SATISFIABLE {
            return Box::pin(download(client, url, opts, (partial, path), hasher, done, size, report)).await;
        }
    } else if !status.is_success() {
        return Err(PullError::Hub { url: url.into(), reason: refusal(status, url, opts) });
    }
    partial.seek(SeekFrom::Start(*done)).map_err(io_err("cannot seek", path))?;
    loop {
        let chunk = match response.chunk().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => break,
            Err(e) => {
                partial.flush().map_err(io_err("cannot write", path))?;
                return Err(interrupted(*done, format!("{e}")));
            }
        };
        if *done + chunk.len() as u64 > size {
            let _ = fs::remove_file(path);
            return Err(PullError::Size { file: url.into(), expected: size, actual: *done + chunk.len() as u64 });
        }
        partial.write_all(&chunk).map_err(io_err("cannot write", path))?;
        hasher.update(&chunk);
        *done += chunk.len() as u64;
        report.event(PullEvent::Bytes { done: *done, total: size });
    }
    if *done < size {
        return Err(interrupted(*done, "the connection closed early".into()));
    }
    Ok(())
}

/// Whether `dest` has the published size and SHA-256; reports why not.
fn verify_existing(dest: &Path, published: &Published, report: &Reporter) -> Result<bool, PullError> {
    verify_file(dest, published.size, &published.sha256, report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_hostile_ones_are_refused() {
        let f: HfFile = "hf:Qwen/Qwen2.5-Coder-7B-Instruct-GGUF/qwen2.5-coder-7b-instruct-q4_k_m.gguf".parse().unwrap();
        assert_eq!(
            (f.owner.as_str(), f.repo.as_str(), f.revision.as_str()),
            ("Qwen", "Qwen2.5-Coder-7B-Instruct-GGUF", "main")
        );
        let f: HfFile = "hf:a/b/sub/dir/m.gguf@v1.0".parse().unwrap();
        assert_eq!((f.file.as_str(), f.revision.as_str()), ("sub/dir/m.gguf", "v1.0"));
        assert_eq!(f.local_path(Path::new("/m")), Path::new("/m/hf/a/b/sub/dir/m.gguf"));
        assert_eq!(f.to_string(), "hf:a/b/sub/dir/m.gguf@v1.0");
        for bad in [
            "hf:",
            "hf:a/b",
            "hf:a/b/",
            "hf:../b/c.gguf",
            "hf:a/../c.gguf",
            "hf:a/b/../../etc/passwd",
            "hf:a/b/x/../../../y",
            "hf:a/b//c",
            "hf:a/b/.git/config",
            "hf:a/b/c\\d",
            "hf:a/b/c\n",
            "hf:a b/c/d",
            "hf:a/b/c.gguf@",
            "a/b/c.gguf",
        ] {
            assert!(bad.parse::<HfFile>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn segments_are_percent_encoded() {
        assert_eq!(encode("refs/pr/1"), "refs%2Fpr%2F1");
        assert_eq!(encode("a b?.gguf"), "a%20b%3F.gguf");
    }
}
