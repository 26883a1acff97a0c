//! `cachet_api::models::hf::pull` against a local server that speaks the
//! Hugging Face hub's HTTP API (the hub itself is not reachable from the test
//! machines): the revision listing with LFS hashes, `resolve` with a redirect
//! to a second "CDN" path, byte ranges, a connection cut part way, a server
//! that ignores ranges, a wrong published hash, gated and missing files.

use std::collections::HashMap;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use cachet_api::models::hf::{pull, HfFile, HfOptions};
use cachet_api::models::{Progress, PullError};
use sha2::{Digest, Sha256};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// How the fake hub behaves.
#[derive(Default)]
struct Behaviour {
    /// Cut the next file download after this many bytes (then serve normally).
    cut_after: Option<usize>,
    /// Answer every file download with the whole file (200), ignoring `Range`.
    ignore_range: bool,
    /// Publish this hash instead of the real one.
    published_sha: Option<String>,
    /// Refuse requests without this bearer token (401).
    token: Option<String>,
}

/// Every request the fake hub saw: (path, `Range` header).
type Log = Arc<Mutex<Vec<(String, Option<String>)>>>;

struct Hub {
    url: String,
    data: Vec<u8>,
    behaviour: Arc<Mutex<Behaviour>>,
    log: Log,
}

fn serve(data: Vec<u8>) -> Hub {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let behaviour = Arc::new(Mutex::new(Behaviour::default()));
    let log = Arc::new(Mutex::new(Vec::new()));
    let (b, l, d) = (Arc::clone(&behaviour), Arc::clone(&log), data.clone());
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (b, l, d) = (Arc::clone(&b), Arc::clone(&l), d.clone());
            std::thread::spawn(move || answer(stream, &b, &l, &d));
        }
    });
    Hub { url, data, behaviour, log }
}

fn answer(
    mut stream: TcpStream,
    behaviour: &Mutex<Behaviour>,
    log: &Mutex<Vec<(String, Option<String>)>>,
    data: &[u8],
) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let range = headers.get("range").cloned();
    log.lock().unwrap().push((path.clone(), range.clone()));
    let mut b = behaviour.lock().unwrap();
    let reply = |stream: &mut TcpStream, status: &str, extra: &str, body: &[u8]| {
        let head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n", body.len());
        let _ = stream.write_all(head.as_bytes());
        let _ = stream.write_all(body);
    };
    if let Some(token) = &b.token {
        if headers.get("authorization") != Some(&format!("Bearer {token}")) && !path.starts_with("/cdn/") {
            return reply(&mut stream, "401 Unauthorized", "", b"{\"error\":\"gated\"}");
        }
    }
    let sha = b.published_sha.clone().unwrap_or_else(|| format!("{:x}", Sha256::digest(data)));
    match path.as_str() {
        "/api/models/acme/tiny-GGUF/revision/main?blobs=true" => {
            let body = serde_json::json!({
                "id": "acme/tiny-GGUF",
                "sha": COMMIT,
                "siblings": [
                    {"rfilename": "README.md", "size": 12, "blobId": "x"},
                    {"rfilename": "tiny-q4_k_m.gguf", "size": data.len(), "lfs": {"sha256": sha, "size": data.len(), "pointerSize": 134}},
                    {"rfilename": "tiny-q8_0.gguf", "size": 1, "lfs": {"sha256": sha, "size": 1, "pointerSize": 134}},
                ]
            });
            reply(&mut stream, "200 OK", "Content-Type: application/json\r\n", body.to_string().as_bytes())
        }
        p if p == format!("/acme/tiny-GGUF/resolve/{COMMIT}/tiny-q4_k_m.gguf") => {
            reply(&mut stream, "302 Found", "Location: /cdn/blob\r\n", b"")
        }
        "/cdn/blob" => {
            let from = range
                .as_deref()
                .filter(|_| !b.ignore_range)
                .and_then(|r| r.strip_prefix("bytes=")?.strip_suffix('-')?.parse::<usize>().ok());
            let (status, extra, body) = match from {
                Some(n) if n < data.len() => (
                    "206 Partial Content",
                    format!("Content-Range: bytes {n}-{}/{}\r\n", data.len() - 1, data.len()),
                    &data[n..],
                ),
                Some(_) => ("416 Range Not Satisfiable", String::new(), &data[..0]),
                None => ("200 OK", String::new(), data),
            };
            if let Some(cut) = b.cut_after.take() {
                // Promise the whole body, send part of it, hang up.
                let head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\n{extra}\r\n", body.len());
                let _ = stream.write_all(head.as_bytes());
                let _ = stream.write_all(&body[..cut.min(body.len())]);
                let _ = stream.flush();
                let _ = stream.shutdown(std::net::Shutdown::Both);
                return;
            }
            reply(&mut stream, status, &extra, body)
        }
        _ => reply(&mut stream, "404 Not Found", "", b"{\"error\":\"Repository not found\"}"),
    }
}

fn data(len: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_u32;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn options(hub: &Hub) -> HfOptions {
    HfOptions { endpoint: hub.url.clone(), token: None, progress: Progress::Quiet }
}

fn file() -> HfFile {
    "hf:acme/tiny-GGUF/tiny-q4_k_m.gguf".parse().unwrap()
}

fn downloads(hub: &Hub) -> Vec<Option<String>> {
    hub.log.lock().unwrap().iter().filter(|(p, _)| p == "/cdn/blob").map(|(_, r)| r.clone()).collect()
}

/// Names in the file's folder other than the lock.
fn leftovers(dir: &Path) -> Vec<String> {
    let folder = dir.join("hf/acme/tiny-GGUF");
    let mut names: Vec<String> = fs::read_dir(folder)
        .map(|d| d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.retain(|n| !n.ends_with(".lock"));
    names.sort();
    names
}

#[test]
fn downloads_verifies_and_then_finds_it_present() {
    let hub = serve(data(300_000));
    let dir = tempfile::tempdir().unwrap();
    let path = pull(&file(), dir.path(), &options(&hub)).unwrap();
    assert_eq!(path, dir.path().join("hf/acme/tiny-GGUF/tiny-q4_k_m.gguf"));
    assert_eq!(fs::read(&path).unwrap(), hub.data);
    assert_eq!(downloads(&hub), [None]);
    assert_eq!(leftovers(dir.path()), ["tiny-q4_k_m.gguf"]);
    // Present and valid: the listing is asked again (a new revision would show), the file is not.
    assert_eq!(pull(&file(), dir.path(), &options(&hub)).unwrap(), path);
    assert_eq!(downloads(&hub).len(), 1);
}

#[test]
fn an_interrupted_download_resumes_where_it_stopped() {
    let hub = serve(data(250_000));
    let dir = tempfile::tempdir().unwrap();
    hub.behaviour.lock().unwrap().cut_after = Some(100_000);
    let e = pull(&file(), dir.path(), &options(&hub)).unwrap_err();
    assert!(matches!(e, PullError::Interrupted { .. }), "{e}");
    assert!(e.to_string().contains("pull again to resume"), "{e}");
    let kept = leftovers(dir.path());
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert!(kept[0].starts_with(".tiny-q4_k_m.gguf.") && kept[0].ends_with(".incomplete"), "{kept:?}");
    let path = pull(&file(), dir.path(), &options(&hub)).unwrap();
    assert_eq!(fs::read(&path).unwrap(), hub.data);
    let ranges = downloads(&hub);
    assert_eq!(ranges.len(), 2);
    let from: usize = ranges[1].as_deref().unwrap().trim_start_matches("bytes=").trim_end_matches('-').parse().unwrap();
    assert!(from > 0 && from <= 100_000, "resumed from {from}");
    assert_eq!(leftovers(dir.path()), ["tiny-q4_k_m.gguf"]);
}

#[test]
fn a_server_that_ignores_ranges_is_followed_from_the_start() {
    let hub = serve(data(120_000));
    let dir = tempfile::tempdir().unwrap();
    hub.behaviour.lock().unwrap().cut_after = Some(50_000);
    assert!(pull(&file(), dir.path(), &options(&hub)).is_err());
    hub.behaviour.lock().unwrap().ignore_range = true;
    let path = pull(&file(), dir.path(), &options(&hub)).unwrap();
    assert_eq!(fs::read(&path).unwrap(), hub.data);
    assert!(downloads(&hub)[1].is_some(), "the second pull asked for a range");
}

#[test]
fn corrupt_bytes_fail_the_hash_and_leave_nothing() {
    let hub = serve(data(64_000));
    let dir = tempfile::tempdir().unwrap();
    // A partial file whose bytes are wrong (as if the disk or an earlier server lied).
    let sha = format!("{:x}", Sha256::digest(&hub.data));
    let folder = dir.path().join("hf/acme/tiny-GGUF");
    fs::create_dir_all(&folder).unwrap();
    fs::write(folder.join(format!(".tiny-q4_k_m.gguf.{}.incomplete", &sha[..16])), vec![0u8; 1000]).unwrap();
    let e = pull(&file(), dir.path(), &options(&hub)).unwrap_err();
    assert!(matches!(e, PullError::FileHash { .. }), "{e}");
    assert!(leftovers(dir.path()).is_empty(), "{:?}", leftovers(dir.path()));
    // The next pull starts clean and succeeds.
    assert_eq!(fs::read(pull(&file(), dir.path(), &options(&hub)).unwrap()).unwrap(), hub.data);

    // A wrong published hash: refused, nothing kept under the final name.
    let hub = serve(data(10_000));
    let dir = tempfile::tempdir().unwrap();
    hub.behaviour.lock().unwrap().published_sha = Some("ab".repeat(32));
    let e = pull(&file(), dir.path(), &options(&hub)).unwrap_err();
    assert!(matches!(e, PullError::FileHash { .. }), "{e}");
    assert!(leftovers(dir.path()).is_empty());

    // A file already in place but altered is replaced.
    let hub = serve(data(20_000));
    let dir = tempfile::tempdir().unwrap();
    let path = pull(&file(), dir.path(), &options(&hub)).unwrap();
    let mut bytes = fs::read(&path).unwrap();
    bytes[7] ^= 1;
    fs::write(&path, bytes).unwrap();
    assert_eq!(fs::read(pull(&file(), dir.path(), &options(&hub)).unwrap()).unwrap(), hub.data);
    assert_eq!(downloads(&hub).len(), 2);
}

#[test]
fn missing_gated_and_unhashed_files_are_clear_errors() {
    let hub = serve(data(1000));
    let dir = tempfile::tempdir().unwrap();
    let missing: HfFile = "hf:acme/tiny-GGUF/tiny-q2.gguf".parse().unwrap();
    let e = pull(&missing, dir.path(), &options(&hub)).unwrap_err().to_string();
    assert!(e.contains("has no file") && e.contains("tiny-q4_k_m.gguf, tiny-q8_0.gguf"), "{e}");
    let unhashed: HfFile = "hf:acme/tiny-GGUF/README.md".parse().unwrap();
    let e = pull(&unhashed, dir.path(), &options(&hub)).unwrap_err().to_string();
    assert!(e.contains("no SHA-256"), "{e}");
    let other: HfFile = "hf:acme/nothing/x.gguf".parse().unwrap();
    let e = pull(&other, dir.path(), &options(&hub)).unwrap_err().to_string();
    assert!(e.contains("404") && e.contains("no such repository"), "{e}");

    hub.behaviour.lock().unwrap().token = Some("s3cret".into());
    let e = pull(&file(), dir.path(), &options(&hub)).unwrap_err().to_string();
    assert!(e.contains("HF_TOKEN"), "{e}");
    let opts = HfOptions { token: Some("s3cret".into()), ..options(&hub) };
    assert_eq!(fs::read(pull(&file(), dir.path(), &opts).unwrap()).unwrap(), hub.data);
    assert!(fs::read_dir(dir.path()).unwrap().count() > 0);

    // Nothing listening: a clean error, no panic.
    let closed = HfOptions { endpoint: "http://127.0.0.1:9".into(), ..options(&hub) };
    assert!(pull(&file(), tempfile::tempdir().unwrap().path(), &closed).is_err());
}

#[test]
fn a_large_read_is_not_needed_to_refuse_an_oversized_listing() {
    // The listing is capped: a hub answering an endless body is refused, not buffered.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        if let Some(Ok(mut s)) = listener.incoming().next() {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
            let chunk = vec![b' '; 1 << 20];
            for _ in 0..40 {
                let _ = s.write_all(format!("{:x}\r\n", chunk.len()).as_bytes());
                if s.write_all(&chunk).is_err() || s.write_all(b"\r\n").is_err() {
                    return;
                }
            }
        }
    });
    let opts = HfOptions { endpoint: url, token: None, progress: Progress::Quiet };
    let e = pull(&file(), tempfile::tempdir().unwrap().path(), &opts).unwrap_err().to_string();
    assert!(e.contains("larger than"), "{e}");
}
