//! Replays the committed fuzzing corpus (`fuzz/corpus/<target>/`: seeds, and every input a
//! fuzzing run found that once crashed, hung or ran out of memory) through the fuzz targets'
//! entry points, on the stable compiler. `scripts/fuzz.sh` runs the targets themselves.

use std::path::PathBuf;

type Target = fn(&[u8]);

const TARGETS: [(&str, Target); 6] = [
    ("gguf", cachet_api::fuzz::gguf),
    ("tokenizer", cachet_api::fuzz::tokenizer_bytes),
    ("chat_template", cachet_api::fuzz::chat_template),
    ("openai_request", cachet_api::fuzz::openai_request),
    ("webhook_payload", cachet_api::fuzz::webhook_payload),
    ("tool_calls", cachet_api::fuzz::tool_calls),
];

#[test]
fn every_corpus_input_is_handled() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    for (name, target) in TARGETS {
        let dir = root.join(name);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "no corpus for {name}");
        for file in files {
            let data = std::fs::read(&file).unwrap();
            let outcome = std::panic::catch_unwind(|| target(&data));
            assert!(outcome.is_ok(), "{name} panicked on {}", file.display());
        }
    }
}
