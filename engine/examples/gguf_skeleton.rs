//! A model's layout without its weights, and random weights in that layout: for timing a real
//! model's shapes on a machine the model file cannot reach (the GPU check's machine has no
//! network and takes 64 MiB of files; the default model is 491 MB).
//!
//!   gguf_skeleton strip MODEL.gguf SKELETON.gguf   # metadata (tokenizer included) and the
//!                                                  # tensor list, no tensor data (a few MB)
//!   gguf_skeleton fill SKELETON.gguf OUT.gguf      # the same metadata and tensors, each
//!                                                  # filled with valid random blocks
//!
//! The filled file reads the same bytes per token as the original (same types and shapes), so
//! its speed is the original's; its outputs are meaningless.

use cachet_engine::gguf::{GgufFile, GgufWriter, Value};
use cachet_engine::testing::Lcg;
use cachet_kernels::quant::{quantize_row, DType};
use std::path::Path;

const LAYOUT_KEY: &str = "cachet.skeleton.tensors";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let result = match args.get(1).map(String::as_str) {
        Some("strip") if args.len() == 4 => strip(Path::new(&args[2]), Path::new(&args[3])),
        Some("fill") if args.len() == 4 => fill(Path::new(&args[2]), Path::new(&args[3])),
        _ => Err("usage: gguf_skeleton strip MODEL.gguf SKELETON.gguf | fill SKELETON.gguf OUT.gguf".into()),
    };
    if let Err(e) = result {
        eprintln!("gguf_skeleton: {e}");
        std::process::exit(1);
    }
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn dtype_from(name: &str) -> Result<DType> {
    DType::ALL.into_iter().find(|d| d.name() == name).ok_or_else(|| format!("unknown tensor type {name}").into())
}

fn strip(src: &Path, dst: &Path) -> Result<()> {
    let file = GgufFile::open(src)?;
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata() {
        w.metadata(k, v.clone());
    }
    let layout: Vec<String> = file
        .tensors()
        .iter()
        .map(|t| {
            let dims: Vec<String> = t.shape.iter().map(usize::to_string).collect();
            format!("{}|{}|{}", t.name, t.dtype.name(), dims.join("x"))
        })
        .collect();
    w.metadata(LAYOUT_KEY, Value::strings(&layout));
    w.write(dst)?;
    println!("{}: {} tensors, {} bytes", dst.display(), layout.len(), std::fs::metadata(dst)?.len());
    Ok(())
}

fn fill(src: &Path, dst: &Path) -> Result<()> {
    let file = GgufFile::open(src)?;
    let layout = file.get_strings(LAYOUT_KEY)?.ok_or("not a skeleton: no tensor list")?;
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata() {
        if k != LAYOUT_KEY {
            w.metadata(k, v.clone());
        }
    }
    let mut rng = Lcg(7);
    let mut total = 0usize;
    for entry in &layout {
        let parts: Vec<&str> = entry.split('|').collect();
        let [name, dtype, dims] = parts[..] else { return Err(format!("bad layout entry {entry:?}").into()) };
        let dtype = dtype_from(dtype)?;
        let shape = dims.split('x').map(str::parse).collect::<std::result::Result<Vec<usize>, _>>()?;
        let inner = *shape.last().ok_or("a tensor without dimensions")?;
        let rows: usize = shape[..shape.len() - 1].iter().product();
        // One valid random row, repeated: the bytes read per token are the real ones.
        let scale = if shape.len() == 1 { 0.0 } else { 0.05 };
        let offset = if shape.len() == 1 { 1.0 } else { 0.0 };
        let row: Vec<f32> = (0..inner).map(|_| offset + scale * rng.f()).collect();
        let mut encoded = vec![0u8; dtype.bytes_for(inner)?];
        quantize_row(dtype, &row, &mut encoded)?;
        let data = encoded.repeat(rows);
        total += data.len();
        w.tensor(name, dtype, &shape, data);
    }
    w.write(dst)?;
    println!("{}: {} tensors, {} tensor bytes", dst.display(), layout.len(), total);
    Ok(())
}
