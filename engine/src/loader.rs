//! Loading a model from a path: a `.gguf` file (weights, tokenizer and chat
//! template from its metadata) or a Hugging Face directory (`config.json`,
//! `*.safetensors`, `tokenizer.json`, `tokenizer_config.json`).

use crate::chat_template::ChatTemplate;
use crate::config::ModelConfig;
use crate::gguf::GgufFile;
use crate::host_weights::HostWeights;
use crate::model::Model;
use crate::tokenizer::{GgufTokenizerSpec, Tokenizer};
use crate::weights::{SafetensorsDir, WeightSource};
use crate::LoadError;
use cachet_kernels::backend::Backend;
use std::path::{Path, PathBuf};

/// A model with everything needed to talk to it.
pub struct LoadedModel<B: Backend> {
    pub model: Model<B>,
    pub tokenizer: Tokenizer,
    /// The model's own chat template, if it has one.
    pub chat_template: Option<ChatTemplate>,
    /// A display name (`general.name`, or the file/directory name).
    pub name: String,
    /// Bytes of the weight files.
    pub file_bytes: u64,
    /// Where those bytes are held while the model runs.
    pub host_weights: HostWeights,
    /// An identity of the weight files (see [`weights_fingerprint`]): K/V stored by one model is
    /// never loaded into another.
    pub fingerprint: [u8; 32],
}

impl<B: Backend> std::fmt::Debug for LoadedModel<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedModel").field("name", &self.name).field("model", &self.model).finish()
    }
}

/// Loads the model at `path` onto backend `b`.
pub fn load<B: Backend>(path: &Path, b: &B) -> Result<LoadedModel<B>, LoadError> {
    let file_name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    if path.is_dir() {
        load_hf_dir(path, b, file_name)
    } else {
        load_gguf(path, b, file_name)
    }
}

fn tok_err(e: impl std::fmt::Display) -> LoadError {
    LoadError::Tokenizer(e.to_string())
}

/// How to hold `files` for backend `b` (see [`HostWeights::choose`]), logged.
fn host_weights<B: Backend>(b: &B, files: &[PathBuf]) -> Result<HostWeights, LoadError> {
    let mut bytes = 0;
    for f in files {
        bytes += std::fs::metadata(f).map_err(|e| LoadError::Io { path: f.display().to_string(), source: e })?.len();
    }
    let (how, why) = HostWeights::choose(b.reads_host_weights(), bytes, b.memory_available())
        .map_err(|e| LoadError::BadConfig(e.to_string()))?;
    tracing::info!("weights: {} MiB {} ({why})", bytes >> 20, how.describe());
    Ok(how)
}

fn load_gguf<B: Backend>(path: &Path, b: &B, file_name: String) -> Result<LoadedModel<B>, LoadError> {
    let host_weights = host_weights(b, &[path.to_path_buf()])?;
    let file = GgufFile::open_as(path, host_weights)?;
    let config = ModelConfig::from_gguf(&file)?;
    let spec = GgufTokenizerSpec::from_gguf_file(&file).map_err(tok_err)?;
    let tokenizer = Tokenizer::from_gguf(spec).map_err(tok_err)?;
    check_vocab(&tokenizer, &config)?;
    let chat_template = match file.get_str("tokenizer.chat_template")? {
        Some(src) => Some(
            ChatTemplate::new(src, tokenizer.bos_token().as_deref(), tokenizer.eos_token().as_deref())
                .map_err(|e| LoadError::BadFile { path: path.display().to_string(), reason: e.to_string() })?,
        ),
        None => None,
    };
    let name = file.get_str("general.name")?.map_or(file_name, str::to_owned);
    let file_bytes = file.file_bytes();
    let model = Model::load(b, &file, config)?;
    let fingerprint = weights_fingerprint(&[path.to_path_buf()])?;
    Ok(LoadedModel { model, tokenizer, chat_template, name, file_bytes, host_weights, fingerprint })
}

fn load_hf_dir<B: Backend>(dir: &Path, b: &B, name: String) -> Result<LoadedModel<B>, LoadError> {
    let config_path = dir.join("config.json");
    let read = |p: &Path| std::fs::read(p).map_err(|e| LoadError::Io { path: p.display().to_string(), source: e });
    let json: serde_json::Value = serde_json::from_slice(&read(&config_path)?)
        .map_err(|e| LoadError::BadFile { path: config_path.display().to_string(), reason: e.to_string() })?;
    let config = ModelConfig::from_hf(&json)?;
    let tokenizer = Tokenizer::from_file(dir.join("tokenizer.json")).map_err(tok_err)?;
    check_vocab(&tokenizer, &config)?;
    let chat_template = match ChatTemplate::source_from_hf_dir(dir).map_err(tok_err)? {
        Some(src) => Some(
            ChatTemplate::new(&src, tokenizer.bos_token().as_deref(), tokenizer.eos_token().as_deref())
                .map_err(|e| LoadError::BadFile { path: dir.display().to_string(), reason: e.to_string() })?,
        ),
        None => None,
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| LoadError::Io { path: dir.display().to_string(), source: e })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors") || p.ends_with("config.json"))
        .collect();
    files.sort();
    let tensor_files: Vec<PathBuf> = files.iter().filter(|p| !p.ends_with("config.json")).cloned().collect();
    let host_weights = host_weights(b, &tensor_files)?;
    let weights = SafetensorsDir::open_as(dir, host_weights)?;
    let file_bytes = weights.file_bytes();
    let model = Model::load(b, &weights, config)?;
    let fingerprint = weights_fingerprint(&files)?;
    Ok(LoadedModel { model, tokenizer, chat_template, name, file_bytes, host_weights, fingerprint })
}

/// An identity of weight files that costs little to compute for a large model: per file (in the
/// order given), its length, its first and last MiB, and 64 samples of 4 KiB spread evenly
/// over it, hashed with SHA-256. Two different trainings or quantisations of a model differ in
/// their headers or in nearly every sampled block.
pub fn weights_fingerprint(files: &[PathBuf]) -> Result<[u8; 32], LoadError> {
    use sha2::{Digest, Sha256};
    use std::os::unix::fs::FileExt;
    const EDGE: u64 = 1 << 20;
    const SAMPLES: u64 = 64;
    const SAMPLE: u64 = 4096;
    let mut h = Sha256::new();
    h.update(b"cachet-weights-1");
    for path in files {
        let io = |e| LoadError::Io { path: path.display().to_string(), source: e };
        let f = std::fs::File::open(path).map_err(io)?;
        let len = f.metadata().map_err(io)?.len();
        h.update(len.to_le_bytes());
        let mut read = |at: u64, n: u64| -> Result<(), LoadError> {
            let n = n.min(len.saturating_sub(at));
            let mut buf = vec![0u8; n as usize];
            f.read_exact_at(&mut buf, at).map_err(io)?;
            h.update(&buf);
            Ok(())
        };
        read(0, EDGE)?;
        read(len.saturating_sub(EDGE), EDGE)?;
        for i in 0..SAMPLES {
            read(len / SAMPLES * i, SAMPLE)?;
        }
    }
    Ok(h.finalize().into())
}

/// Every token the tokenizer can produce must have an embedding row.
fn check_vocab(tokenizer: &Tokenizer, config: &ModelConfig) -> Result<(), LoadError> {
    if tokenizer.vocab_size() > config.vocab_size {
        return Err(LoadError::BadConfig(format!(
            "the tokenizer has {} tokens but the model only {} embeddings",
            tokenizer.vocab_size(),
            config.vocab_size
        )));
    }
    Ok(())
}
