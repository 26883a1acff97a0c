//! The kernel programs: `.cu` sources of `kernels/cuda/`, embedded in the
//! binary, compiled by NVRTC the first time a backend needs them (once per
//! process and GPU architecture) and loaded once per backend.

use crate::quant::DType;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock};

const COMMON: &str = include_str!("../../cuda/common.cuh");
const DEQUANT: &str = include_str!("../../cuda/dequant.cuh");

/// A `.cu` file and the headers put in front of it (name, text).
struct Source {
    file: &'static str,
    headers: &'static [(&'static str, &'static str)],
    body: &'static str,
}

const PROGRAMS: [Source; 4] = [
    Source { file: "ops.cu", headers: &[("common.cuh", COMMON)], body: include_str!("../../cuda/ops.cu") },
    Source {
        file: "dequant.cu",
        headers: &[("common.cuh", COMMON), ("dequant.cuh", DEQUANT)],
        body: include_str!("../../cuda/dequant.cu"),
    },
    Source {
        file: "matmul.cu",
        headers: &[("common.cuh", COMMON), ("dequant.cuh", DEQUANT)],
        body: include_str!("../../cuda/matmul.cu"),
    },
    Source { file: "attention.cu", headers: &[("common.cuh", COMMON)], body: include_str!("../../cuda/attention.cu") },
];

/// Header files of `kernels/cuda/` (put in front of programs, not compiled alone).
pub const HEADERS: [&str; 2] = ["common.cuh", "dequant.cuh"];

/// A kernel program as NVRTC compiles it.
#[derive(Clone, Debug)]
pub struct Program {
    /// Its `.cu` file in `kernels/cuda/`.
    pub file: &'static str,
    /// The headers followed by the file.
    pub source: String,
}

/// Every program the backend compiles.
pub fn programs() -> Vec<Program> {
    PROGRAMS
        .iter()
        .map(|p| {
            let mut source = String::new();
            for (name, text) in p.headers {
                source.push_str(&format!("// ---- {name}\n{text}\n"));
            }
            source.push_str(&format!("// ---- {}\n{}", p.file, p.body));
            Program { file: p.file, source }
        })
        .collect()
}

/// NVRTC options for `arch` (`"sm_90"` gives a CUBIN, `"compute_80"` PTX).
/// `--fmad=false` keeps every multiply-add rounded as written (see common.cuh).
pub fn nvrtc_options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        "--fmad=false".into(),
        "--prec-div=true".into(),
        "--prec-sqrt=true".into(),
        "--ftz=false".into(),
    ]
}

/// An NVRTC failure.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CompileError {
    /// libnvrtc cannot be loaded.
    #[error(
        "libnvrtc could not be loaded (install it with scripts/nvrtc.sh and add its directory to LD_LIBRARY_PATH)"
    )]
    NoNvrtc,
    /// A program did not compile; `log` is NVRTC's.
    #[error("NVRTC failed on {file} for {arch}: {error}\n{log}")]
    Failed { file: String, arch: String, error: String, log: String },
}

/// Whether libnvrtc can be loaded.
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to open the library (libloading), touching no state.
    catch_unwind(|| unsafe { cudarc::nvrtc::sys::is_culib_present() }).unwrap_or(false)
}

/// Compiles `program` for `arch`: a CUBIN for a real architecture (`sm_XY`),
/// PTX text for a virtual one (`compute_XY`).
pub fn compile(program: &Program, arch: &str) -> Result<Vec<u8>, CompileError> {
    if !nvrtc_available() {
        return Err(CompileError::NoNvrtc);
    }
    let fail =
        |error: String, log: String| CompileError::Failed { file: program.file.into(), arch: arch.into(), error, log };
    let run = || nvrtc_compile(program, arch).map_err(|(e, log)| fail(e, log));
    catch_unwind(AssertUnwindSafe(run)).unwrap_or_else(|_| Err(fail("NVRTC panicked".into(), String::new())))
}

/// One NVRTC program: create, compile, fetch the CUBIN or PTX, destroy.
fn nvrtc_compile(program: &Program, arch: &str) -> Result<Vec<u8>, (String, String)> {
    use cudarc::nvrtc::{result, sys};
    let src = CString::new(program.source.as_str()).map_err(|e| (e.to_string(), String::new()))?;
    let name = CString::new(program.file).map_err(|e| (e.to_string(), String::new()))?;
    let prog = result::create_program(&src, Some(&name)).map_err(|e| (format!("{e:?}"), String::new()))?;
    let options = nvrtc_options(arch);
    // SAFETY: `prog` was just created and is destroyed below, exactly once;
    // the buffers handed to NVRTC are sized by the matching size queries.
    let out = unsafe {
        let compiled = result::compile_program(prog, &options);
        let out = match compiled {
            Err(e) => {
                let log = result::get_program_log(prog).map(|l| c_chars(&l)).unwrap_or_default();
                Err((format!("{e:?}"), log))
            }
            Ok(()) if arch.starts_with("sm_") => {
                let mut size = 0usize;
                sys::nvrtcGetCUBINSize(prog, &mut size).result().map_err(|e| (format!("{e:?}"), String::new()))?;
                let mut cubin = vec![0u8; size];
                sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast::<c_char>())
                    .result()
                    .map_err(|e| (format!("{e:?}"), String::new()))?;
                Ok(cubin)
            }
            Ok(()) => {
                result::get_ptx(prog).map(|p| c_chars(&p).into_bytes()).map_err(|e| (format!("{e:?}"), String::new()))
            }
        };
        let _ = result::destroy_program(prog);
        out
    };
    out
}

/// A NUL-terminated C string buffer as a Rust string.
fn c_chars(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The compiled images of every program, in the order of [`PROGRAMS`].
type Images = Arc<Vec<Vec<u8>>>;

/// Compiled images per architecture, shared by every backend of the process.
fn cached_images(arch: &str) -> Result<Images, CompileError> {
    static CACHE: OnceLock<Mutex<HashMap<String, Images>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut map = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(images) = map.get(arch) {
        return Ok(images.clone());
    }
    let images = Arc::new(programs().iter().map(|p| compile(p, arch)).collect::<Result<Vec<_>, _>>()?);
    map.insert(arch.to_string(), images.clone());
    Ok(images)
}

/// The suffix of a format's kernels (`matmul_q4_k`).
fn suffix(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::Q4_0 => "q4_0",
        DType::Q5_0 => "q5_0",
        DType::Q8_0 => "q8_0",
        DType::Q4_K => "q4_k",
        DType::Q5_K => "q5_k",
        DType::Q6_K => "q6_k",
    }
}

/// One kernel per weight format, indexed like `DType::ALL`.
#[derive(Debug)]
pub(crate) struct PerFormat([CudaFunction; 9]);

impl PerFormat {
    pub(crate) fn get(&self, dtype: DType) -> &CudaFunction {
        let i = DType::ALL.iter().position(|&d| d == dtype).expect("every format is in DType::ALL");
        &self.0[i]
    }
}

/// The kernels of ops.cu, in the order of [`Kernels`]' fields.
const OPS: [&str; 12] = [
    "add_f32",
    "silu_mul_f32",
    "rms_norm_f32",
    "rms_norm_inplace_f32",
    "rope_table_f32",
    "rope_f32",
    "gather_rows_f32",
    "kv_store_f16",
    "activations_to_bf16",
    "kv_gather_f16",
    "kv_scatter_f16",
    "add_rows_scaled_f32",
];
/// The kernels of attention.cu.
const ATTENTION: [&str; 2] = ["attention_chunk", "attention_combine"];
/// Per-format kernel families: `(file, prefix)`, named `{prefix}_{format}`.
const PER_FORMAT: [(&str, &str); 3] = [("matmul.cu", "matmul"), ("dequant.cu", "embed"), ("dequant.cu", "to_bf16")];

/// `(file, kernel)` of every kernel the backend loads.
pub fn kernel_names() -> Vec<(&'static str, String)> {
    let mut names: Vec<(&'static str, String)> = OPS.iter().map(|n| ("ops.cu", n.to_string())).collect();
    names.extend(ATTENTION.iter().map(|n| ("attention.cu", n.to_string())));
    for (file, prefix) in PER_FORMAT {
        names.extend(DType::ALL.iter().map(|&d| (file, format!("{prefix}_{}", suffix(d)))));
    }
    names
}

/// Every kernel of the backend, loaded into its context.
#[derive(Debug)]
pub(crate) struct Kernels {
    pub add: CudaFunction,
    pub silu_mul: CudaFunction,
    pub rms_norm: CudaFunction,
    pub rms_norm_inplace: CudaFunction,
    pub rope_table: CudaFunction,
    pub rope: CudaFunction,
    pub gather_rows: CudaFunction,
    pub kv_store: CudaFunction,
    pub activations_to_bf16: CudaFunction,
    pub kv_gather: CudaFunction,
    pub kv_scatter: CudaFunction,
    pub add_rows_scaled: CudaFunction,
    pub attention_chunk: CudaFunction,
    pub attention_combine: CudaFunction,
    pub matmul: PerFormat,
    pub embed: PerFormat,
    pub to_bf16: PerFormat,
    /// The modules stay loaded while the backend lives.
    _modules: Vec<Arc<CudaModule>>,
}

impl Kernels {
    /// Compiles (or takes from the process cache) and loads every program for
    /// the device of `ctx`, whose compute capability is `(major, minor)`.
    pub(crate) fn load(ctx: &Arc<CudaContext>, (major, minor): (u32, u32)) -> Result<Kernels, String> {
        let arch = format!("sm_{major}{minor}");
        let images = cached_images(&arch).map_err(|e| e.to_string())?;
        let modules = images
            .iter()
            .map(|img| ctx.load_module(Ptx::from_binary(img.clone())).map_err(|e| format!("loading a module: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        let f = |file: &str, name: &str| -> Result<CudaFunction, String> {
            let i = PROGRAMS.iter().position(|p| p.file == file).expect("a known program");
            modules[i].load_function(name).map_err(|e| format!("kernel {name} of {file}: {e}"))
        };
        let all = |file: &str, names: &[&str]| names.iter().map(|n| f(file, n)).collect::<Result<Vec<_>, _>>();
        let per = |(file, prefix): (&str, &str)| -> Result<PerFormat, String> {
            let names: Vec<String> = DType::ALL.iter().map(|&d| format!("{prefix}_{}", suffix(d))).collect();
            let fns = names.iter().map(|n| f(file, n)).collect::<Result<Vec<_>, _>>()?;
            Ok(PerFormat(fns.try_into().map_err(|_| "one kernel per format".to_string())?))
        };
        let Ok(
            [add, silu_mul, rms_norm, rms_norm_inplace, rope_table, rope, gather_rows, kv_store, activations_to_bf16, kv_gather, kv_scatter, add_rows_scaled],
        ) = <[CudaFunction; 12]>::try_from(all("ops.cu", &OPS)?)
        else {
            unreachable!("OPS has twelve kernels")
        };
        let Ok([attention_chunk, attention_combine]) = <[CudaFunction; 2]>::try_from(all("attention.cu", &ATTENTION)?)
        else {
            unreachable!("ATTENTION has two kernels")
        };
        let [matmul, embed, to_bf16] = PER_FORMAT;
        Ok(Kernels {
            add,
            silu_mul,
            rms_norm,
            rms_norm_inplace,
            rope_table,
            rope,
            gather_rows,
            kv_store,
            activations_to_bf16,
            kv_gather,
            kv_scatter,
            add_rows_scaled,
            attention_chunk,
            attention_combine,
            matmul: per(matmul)?,
            embed: per(embed)?,
            to_bf16: per(to_bf16)?,
            _modules: modules,
        })
    }
}
