//! Row dot products between a quantized (or dense) weight row and an
//! activation row, one implementation per SIMD level, chosen at run time.

/// Runs `$body` for the tokens `$toks` in tiles of up to 4: `$t` is a tile's first token and
/// `$c` its size as a constant, for the const-generic tile kernels' token count.
#[cfg(target_arch = "x86_64")]
macro_rules! token_tiles {
    ($toks:expr, |$t:ident, $c:ident| $body:block) => {{
        let toks = $toks;
        let mut $t = toks.start;
        while $t < toks.end {
            let tt = (toks.end - $t).min(4);
            match tt {
                4 => {
                    const $c: usize = 4;
                    $body
                }
                3 => {
                    const $c: usize = 3;
                    $body
                }
                2 => {
                    const $c: usize = 2;
                    $body
                }
                _ => {
                    const $c: usize = 1;
                    $body
                }
            }
            $t += tt;
        }
    }};
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_op_in_unsafe_fn)]
mod avx2;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_op_in_unsafe_fn)]
mod avx512;
pub mod scalar;

use super::attention::{attend_scalar, Attend, AttendFn, Tile, TileFn, TileScratch};
use crate::quant::*;
use half::{bf16, f16};

/// Bytes of scratch a worker thread holds for decode-sized jobs without allocating: at the
/// AVX-512 level one-token jobs lay a row's activations out in about 3 bytes per value; at AVX2
/// jobs of a few tokens (several sequences' decode steps, speculative decoding's verification)
/// repack 8-row groups of the 32-value formats in 17 bytes per value. Rows of up to ~40,000
/// values (a longer row's first such job grows the buffer once).
const GEMV_LAYOUT_BYTES: usize = 128 * 1024;

/// Sizes this thread's buffers for `level`'s kernels; the CPU backend runs it on every worker thread when it
/// starts, so that a decode step's first one-token job on a thread does not allocate (which
/// thread runs which job is rayon's choice; `engine/tests/no_alloc.rs`).
pub(crate) fn warm_thread(level: SimdLevel) {
    match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => avx2::reserve(GEMV_LAYOUT_BYTES),
        #[cfg(target_arch = "x86_64")]
        // The AVX-512 level's tables hold AVX2 kernels too (the exact families' jobs of 2–4 tokens:
        // several sequences' decode steps), whose buffers a worker must not grow mid-step either.
        SimdLevel::Avx512 => {
            avx512::reserve(GEMV_LAYOUT_BYTES);
            avx2::reserve(GEMV_LAYOUT_BYTES);
        }
        _ => {}
    }
}

/// Gives a thread-local buffer room for `bytes` of its elements.
#[cfg(target_arch = "x86_64")]
fn reserve<T>(key: &'static std::thread::LocalKey<std::cell::RefCell<Vec<T>>>, bytes: usize) {
    key.with(|cell| {
        let mut buf = cell.borrow_mut();
        let want = bytes / std::mem::size_of::<T>();
        if buf.capacity() < want {
            let len = buf.len();
            buf.reserve(want - len);
        }
    });
}

/// A block of a matrix product: for `r` in `rows` and `t` in `toks`,
/// `out[t * ldo + r] = dot(w row r, x row t)`. Rows of `w` are `wpr` blocks
/// long, rows of `x` `apr` blocks.
#[derive(Debug)]
pub struct GemmJob<'a, W, A> {
    pub w: &'a [W],
    pub wpr: usize,
    pub x: &'a [A],
    pub apr: usize,
    pub rows: std::ops::Range<usize>,
    pub toks: std::ops::Range<usize>,
    pub out: *mut f32,
    pub ldo: usize,
}

/// A tiled GEMM kernel.
///
/// # Safety
/// `job.out` must be valid for writes at every `t * ldo + r` of the job and
/// not written by anyone else meanwhile; `w` and `x` must hold the rows the
/// job names, each `x` row at least `wpr` blocks long (`apr >= wpr`: the SIMD
/// kernels read `wpr` blocks of every activation row); the CPU must support
/// the kernel's level.
pub type GemmFn<W, A> = unsafe fn(&GemmJob<'_, W, A>);

/// The same job through the row dot product, one element at a time.
///
/// # Safety
/// As for [`GemmFn`].
pub unsafe fn gemm_by_dot<W, A>(job: &GemmJob<'_, W, A>, dot: fn(&[W], &[A]) -> f32) {
    for r in job.rows.clone() {
        let wr = &job.w[r * job.wpr..(r + 1) * job.wpr];
        for t in job.toks.clone() {
            let v = dot(wr, &job.x[t * job.apr..(t + 1) * job.apr]);
            // SAFETY: the caller guarantees the output region.
            unsafe { *job.out.add(t * job.ldo + r) = v };
        }
    }
}

/// The SIMD instruction set a kernel uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SimdLevel {
    /// Portable Rust; the reference.
    Scalar,
    /// AVX2 with FMA and F16C.
    Avx2,
    /// AVX-512 F/BW/DQ/VL with VNNI (plus AVX2, FMA, F16C).
    Avx512,
}

impl SimdLevel {
    /// Every level, lowest first.
    pub const ALL: [SimdLevel; 3] = [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512];

    /// Whether this CPU can run the level.
    pub fn is_supported(self) -> bool {
        match self {
            SimdLevel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => {
                is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => {
                SimdLevel::Avx2.is_supported()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512dq")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The best level this CPU supports, capped by `CACHET_SIMD`
    /// (`scalar`, `avx2`, `avx512`) when that is set.
    pub fn detect() -> SimdLevel {
        let cap = match std::env::var("CACHET_SIMD").ok().as_deref().map(str::to_ascii_lowercase).as_deref() {
            Some("scalar") => SimdLevel::Scalar,
            Some("avx2") => SimdLevel::Avx2,
            _ => SimdLevel::Avx512,
        };
        Self::ALL.into_iter().rev().find(|l| *l <= cap && l.is_supported()).unwrap_or(SimdLevel::Scalar)
    }

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
        }
    }
}

/// The level whose kernels the K formats (`Q4_K`, `Q5_K`, `Q6_K`: dot products and GEMMs
/// together, so that one token and a tile of tokens still give the same bits) use at `level` on
/// this CPU: at the AVX-512 level, the AVX-512 level's own kernels (float steps per lane, FMA) or
/// the exact ones (AVX2: the scalar path's bits; prompt-sized jobs through the AVX-512 VNNI
/// 16-row tiles, `avx512/qk16.rs`). The exact ones are the default on every CPU: their prompt
/// passes ran 1.7× (Intel Emerald Rapids) and 2.2× (AMD Zen 4, the 1.5B) as fast as the AVX-512
/// level's own (`docs/performance.md`). `CACHET_SIMD_K=avx2|avx512` overrides.
pub fn k_formats_level(level: SimdLevel) -> SimdLevel {
    choose(level, "CACHET_SIMD_K", SimdLevel::Avx2, SimdLevel::Avx2)
}

/// The level whose kernels the 32-value formats (`Q4_0`, `Q5_0`, `Q8_0`; dot products and GEMMs
/// together, as for [`k_formats_level`]) use at `level` on this CPU: the AVX-512 level's own
/// (`vpdpbusd`, two blocks per 512-bit step) or the exact ones (AVX2's, 8 rows side by side in a
/// register's lanes, and the AVX-512 VNNI 16-row tiles for prompt-sized jobs). The exact ones are
/// the default on every CPU (the default model's pp512 1.9× on Zen 4 with both families exact).
/// `CACHET_SIMD_Q32=avx2|avx512` overrides.
pub fn q32_formats_level(level: SimdLevel) -> SimdLevel {
    choose(level, "CACHET_SIMD_Q32", SimdLevel::Avx2, SimdLevel::Avx2)
}

/// The level of the kernels that take jobs of 1–4 tokens (a decode step's) where a format family
/// uses the exact kernels at the AVX-512 level ([`k_formats_level`], [`q32_formats_level`] AVX2):
/// AVX2's, or the AVX-512 ones beside the 16-row tiles (`avx512/qk.rs` `gemv_exact`,
/// `avx512/q32x16.rs` `gemv16`), which give the same bits. On
/// Intel the AVX2 ones (port 5, as above); elsewhere the AVX-512 ones, which decoded the 1.5B's
/// K formats faster on Zen 4 (`docs/performance.md`). `CACHET_SIMD_FEW=avx2|avx512` overrides.
pub fn few_tokens_level(level: SimdLevel) -> SimdLevel {
    choose(level, "CACHET_SIMD_FEW", SimdLevel::Avx2, SimdLevel::Avx512)
}

/// A per-CPU choice at the AVX-512 level: the override in `var`, else `intel` on Intel CPUs and
/// `other` elsewhere. Other levels keep their own kernels.
fn choose(level: SimdLevel, var: &str, intel: SimdLevel, other: SimdLevel) -> SimdLevel {
    if level != SimdLevel::Avx512 {
        return level;
    }
    match std::env::var(var).ok().as_deref().map(str::trim) {
        Some("avx2") => SimdLevel::Avx2,
        Some("avx512") => SimdLevel::Avx512,
        _ if cpu_vendor() == *b"GenuineIntel" => intel,
        _ => other,
    }
}

/// The CPUID vendor string (`GenuineIntel`, `AuthenticAMD`, …); zeros off x86.
fn cpu_vendor() -> [u8; 12] {
    #[cfg(target_arch = "x86_64")]
    {
        let r = std::arch::x86_64::__cpuid(0);
        let mut v = [0u8; 12];
        v[..4].copy_from_slice(&r.ebx.to_le_bytes());
        v[4..8].copy_from_slice(&r.edx.to_le_bytes());
        v[8..].copy_from_slice(&r.ecx.to_le_bytes());
        v
    }
    #[cfg(not(target_arch = "x86_64"))]
    [0; 12]
}

/// The dot products of one SIMD level.
#[derive(Clone, Copy, Debug)]
pub struct Kernels {
    pub level: SimdLevel,
    /// The level of the K formats' kernels (see [`k_formats_level`]).
    pub k_level: SimdLevel,
    /// The level of the 32-value formats' kernels (see [`q32_formats_level`]).
    pub q32_level: SimdLevel,
    /// Where a family takes the exact kernels at the AVX-512 level ([`Kernels::has_exact`]): the
    /// level of their kernels for jobs of 1–4 tokens (see [`few_tokens_level`]); else `level`.
    pub few_level: SimdLevel,
    pub q4_0: fn(&[BlockQ4_0], &[BlockQ8A]) -> f32,
    pub q5_0: fn(&[BlockQ5_0], &[BlockQ8A]) -> f32,
    pub q8_0: fn(&[BlockQ8_0], &[BlockQ8A]) -> f32,
    pub q4_k: fn(&[BlockQ4K], &[BlockQ8K]) -> f32,
    pub q5_k: fn(&[BlockQ5K], &[BlockQ8K]) -> f32,
    pub q6_k: fn(&[BlockQ6K], &[BlockQ8K]) -> f32,
    pub f32: fn(&[f32], &[f32]) -> f32,
    pub f16: fn(&[f16], &[f32]) -> f32,
    pub bf16: fn(&[bf16], &[f32]) -> f32,
    /// Attention of one (query row, KV head) task.
    pub attend: AttendFn,
    /// Attention of a tile of query rows (levels that have one; see
    /// `attention`), used instead of `attend` for the whole batch.
    pub tile: Option<TileFn>,
    /// `gate = silu(gate) * up` over one row.
    pub silu_mul: fn(&mut [f32], &[f32]),
    /// Register-tiled GEMMs where the level has them (else `gemm_by_dot`).
    /// They compute each element exactly as the level's dot product does.
    pub gemm_q4_0: Option<GemmFn<BlockQ4_0, BlockQ8A>>,
    pub gemm_q5_0: Option<GemmFn<BlockQ5_0, BlockQ8A>>,
    pub gemm_q8_0: Option<GemmFn<BlockQ8_0, BlockQ8A>>,
    pub gemm_q4_k: Option<GemmFn<BlockQ4K, BlockQ8K>>,
    pub gemm_q5_k: Option<GemmFn<BlockQ5K, BlockQ8K>>,
    pub gemm_q6_k: Option<GemmFn<BlockQ6K, BlockQ8K>>,
    /// Activation quantizers (the same bits at every level; vectorized where the level allows).
    pub quant_q8a: fn(&[f32], &mut [BlockQ8A]),
    pub quant_q8k: fn(&[f32], &mut [BlockQ8K]),
}

/// Wraps `unsafe fn`s that need CPU features into safe `fn`s. Only
/// `Kernels::for_level` uses the wrappers, after checking the features.
macro_rules! safe_table {
    ($level:expr, $m:ident) => {{
        mod safe {
            use super::*;
            pub fn q4_0(w: &[BlockQ4_0], x: &[BlockQ8A]) -> f32 {
                // SAFETY: reachable only through `Kernels::for_level`, which checked the features.
                unsafe { super::$m::q4_0(w, x) }
            }
            pub fn q5_0(w: &[BlockQ5_0], x: &[BlockQ8A]) -> f32 {
                // SAFETY: as above.
                unsafe { super::$m::q5_0(w, x) }
            }
            pub fn q8_0(w: &[BlockQ8_0], x: &[BlockQ8A]) -> f32 {
                // SAFETY: as above.
                unsafe { super::$m::q8_0(w, x) }
            }
            pub fn q4_k(w: &[BlockQ4K], x: &[BlockQ8K]) -> f32 {
                // SAFETY: as above.
                unsafe { super::$m::q4_k(w, x) }
            }
            pub fn q5_k(w: &[BlockQ5K], x: &[BlockQ8K]) -> f32 {
                // SAFETY: as above.
                unsafe { super::$m::q5_k(w, x) }
            }
            pub fn q6_k(w: &[BlockQ6K], x: &[BlockQ8K]) -> f32 {
                // SAFETY: as above.
                unsafe { super::$m::q6_k(w, x) }
            }
            pub fn f32(w: &[f32], x: &[f32]) -> f32 {
                // SAFETY: as above.
                unsafe { super::$m::f32(w, x) }
            }
            pub fn f16(w: &[f16], x: &[f32]) -> f32 {
                // SAFETY: as above.
                unsafe { super::$m::f16(w, x) }
            }
            pub fn bf16(w: &[bf16], x: &[f32]) -> f32 {
                // SAFETY: as above.
                unsafe { super::$m::bf16(w, x) }
            }
        }
        Kernels {
            level: $level,
            k_level: $level,
            q32_level: $level,
            few_level: $level,
            q4_0: safe::q4_0,
            q5_0: safe::q5_0,
            q8_0: safe::q8_0,
            q4_k: safe::q4_k,
            q5_k: safe::q5_k,
            q6_k: safe::q6_k,
            f32: safe::f32,
            f16: safe::f16,
            bf16: safe::bf16,
            attend: attend_scalar,
            tile: None,
            silu_mul: super::ops::silu_mul_scalar,
            gemm_q4_0: None,
            gemm_q5_0: None,
            gemm_q8_0: None,
            gemm_q4_k: None,
            gemm_q5_k: None,
            gemm_q6_k: None,
            quant_q8a: crate::quant::quantize_q8a,
            quant_q8k: crate::quant::quantize_q8k,
        }
    }};
}

#[cfg(target_arch = "x86_64")]
fn attend_avx2(a: &Attend<'_>, scores: &mut [f32], out: &mut [f32]) {
    // SAFETY: reachable only through `Kernels::for_level`, which checked the features.
    unsafe { super::attention::avx2::attend(a, scores, out) }
}

#[cfg(target_arch = "x86_64")]
fn attend_avx512(a: &Attend<'_>, scores: &mut [f32], out: &mut [f32]) {
    // SAFETY: reachable only through `Kernels::for_level`, which checked the features.
    unsafe { super::attention::avx512::attend(a, scores, out) }
}

/// # Safety
/// As for [`TileFn`]; reachable only through `Kernels::for_level`, which
/// checked the features.
#[cfg(target_arch = "x86_64")]
unsafe fn tile_avx2(t: &Tile<'_>, sc: &mut TileScratch, out: *mut f32) {
    // SAFETY: the caller's contract, and the CPU was checked.
    unsafe { super::attention::avx2::tile(t, sc, out) }
}

/// # Safety
/// As for [`TileFn`]; reachable only through `Kernels::for_level`, which
/// checked the features.
#[cfg(target_arch = "x86_64")]
unsafe fn tile_avx512(t: &Tile<'_>, sc: &mut TileScratch, out: *mut f32) {
    // SAFETY: the caller's contract, and the CPU was checked.
    unsafe { super::attention::avx512::tile(t, sc, out) }
}

#[cfg(target_arch = "x86_64")]
fn silu_mul_avx2(gate: &mut [f32], up: &[f32]) {
    // SAFETY: reachable only through `Kernels::for_level`, which checked the features.
    unsafe { super::attention::avx2::silu_mul(gate, up) }
}

#[cfg(target_arch = "x86_64")]
fn silu_mul_avx512(gate: &mut [f32], up: &[f32]) {
    // SAFETY: reachable only through `Kernels::for_level`, which checked the features.
    unsafe { super::attention::avx512::silu_mul(gate, up) }
}

#[cfg(target_arch = "x86_64")]
fn quant_q8a_avx2(x: &[f32], out: &mut [BlockQ8A]) {
    // SAFETY: reachable only through `Kernels::for_level`, which checked the features.
    unsafe { crate::quant::simd::q8a_avx2(x, out) }
}

#[cfg(target_arch = "x86_64")]
fn quant_q8k_avx2(x: &[f32], out: &mut [BlockQ8K]) {
    // SAFETY: as above.
    unsafe { crate::quant::simd::q8k_avx2(x, out) }
}

#[cfg(target_arch = "x86_64")]
fn quant_q8a_avx512(x: &[f32], out: &mut [BlockQ8A]) {
    // SAFETY: as above.
    unsafe { crate::quant::simd::q8a_avx512(x, out) }
}

#[cfg(target_arch = "x86_64")]
fn quant_q8k_avx512(x: &[f32], out: &mut [BlockQ8K]) {
    // SAFETY: as above.
    unsafe { crate::quant::simd::q8k_avx512(x, out) }
}

impl Kernels {
    /// The portable reference.
    pub fn scalar() -> Kernels {
        Kernels {
            level: SimdLevel::Scalar,
            k_level: SimdLevel::Scalar,
            q32_level: SimdLevel::Scalar,
            few_level: SimdLevel::Scalar,
            q4_0: scalar::q4_0,
            q5_0: scalar::q5_0,
            q8_0: scalar::q8_0,
            q4_k: scalar::q4_k,
            q5_k: scalar::q5_k,
            q6_k: scalar::q6_k,
            f32: scalar::f32,
            f16: scalar::f16,
            bf16: scalar::bf16,
            attend: attend_scalar,
            tile: None,
            silu_mul: super::ops::silu_mul_scalar,
            gemm_q4_0: None,
            gemm_q5_0: None,
            gemm_q8_0: None,
            gemm_q4_k: None,
            gemm_q5_k: None,
            gemm_q6_k: None,
            quant_q8a: crate::quant::quantize_q8a,
            quant_q8k: crate::quant::quantize_q8k,
        }
    }

    /// The kernels of `level` with this CPU's choices for the K formats ([`k_formats_level`])
    /// and the 32-value formats ([`q32_formats_level`]), or `None` when this CPU cannot run them.
    pub fn for_level(level: SimdLevel) -> Option<Kernels> {
        Kernels::with_levels(level, k_formats_level(level), q32_formats_level(level))?.with_few(few_tokens_level(level))
    }

    /// This table with the exact families' jobs of 1–4 tokens through `few`'s kernels (AVX2's, or
    /// the AVX-512 ones that give the same bits); `None` where the choice does not apply (a
    /// table without an exact family at the AVX-512 level takes only its own level).
    pub fn with_few(self, few: SimdLevel) -> Option<Kernels> {
        use SimdLevel::{Avx2, Avx512};
        if !self.has_exact() {
            // Nothing to choose: the table's own few-token kernels.
            return (few == self.level || self.level == Avx512).then_some(self);
        }
        match few {
            // The exact families' tables come with AVX2's few-token kernels (`with_levels`).
            Avx2 => Some(self),
            #[cfg(target_arch = "x86_64")]
            Avx512 => {
                let mut k = Kernels { few_level: few, ..self };
                if k.k_level == Avx2 {
                    k.gemm_q4_k = Some(avx512::gemm16w_q4_k);
                    k.gemm_q5_k = Some(avx512::gemm16w_q5_k);
                    k.gemm_q6_k = Some(avx512::gemm16w_q6_k);
                }
                if k.q32_level == Avx2 {
                    k.gemm_q4_0 = Some(avx512::gemm16w_q4_0);
                    k.gemm_q5_0 = Some(avx512::gemm16w_q5_0);
                    k.gemm_q8_0 = Some(avx512::gemm16w_q8_0);
                }
                Some(k)
            }
            _ => None,
        }
    }

    /// Whether a format family of this table takes the exact kernels at the AVX-512 level.
    pub fn has_exact(&self) -> bool {
        use SimdLevel::{Avx2, Avx512};
        self.level == Avx512 && (self.k_level == Avx2 || self.q32_level == Avx2)
    }

    /// Every kernel table this CPU can run: each level, and the AVX-512 level with either
    /// choice for the K formats and for the 32-value formats (what the tests compare).
    pub fn variants() -> Vec<Kernels> {
        use SimdLevel::{Avx2, Avx512};
        let mut v: Vec<Kernels> = SimdLevel::ALL.iter().filter_map(|&l| Kernels::with_levels(l, l, l)).collect();
        v.extend(
            [(Avx2, Avx512), (Avx512, Avx2), (Avx2, Avx2)]
                .into_iter()
                .filter_map(|(k, q)| Kernels::with_levels(Avx512, k, q)),
        );
        // The exact kernels with the AVX-512 few-token kernels too (the AVX2 ones are above).
        let exact: Vec<Kernels> = v.iter().filter(|k| k.has_exact()).copied().collect();
        v.extend(exact.into_iter().filter_map(|k| k.with_few(Avx512)));
        v
    }

    /// The kernels of `level`, the K formats' from `k_level` and the 32-value formats' from
    /// `q32_level` (each `level`, or AVX2 at the AVX-512 level); `None` when this CPU cannot run
    /// them or the choice is not one of those.
    pub fn with_levels(level: SimdLevel, k_level: SimdLevel, q32_level: SimdLevel) -> Option<Kernels> {
        let allowed = |l: SimdLevel| l == level || (level, l) == (SimdLevel::Avx512, SimdLevel::Avx2);
        if !level.is_supported() || !allowed(k_level) || !allowed(q32_level) {
            return None;
        }
        match level {
            SimdLevel::Scalar => Some(Kernels::scalar()),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => Some(Kernels {
                attend: attend_avx2,
                tile: Some(tile_avx2),
                silu_mul: silu_mul_avx2,
                gemm_q4_0: Some(avx2::gemm_q4_0),
                gemm_q5_0: Some(avx2::gemm_q5_0),
                gemm_q8_0: Some(avx2::gemm_q8_0),
                gemm_q4_k: Some(avx2::gemm_q4_k),
                gemm_q5_k: Some(avx2::gemm_q5_k),
                gemm_q6_k: Some(avx2::gemm_q6_k),
                quant_q8a: quant_q8a_avx2,
                quant_q8k: quant_q8k_avx2,
                ..safe_table!(SimdLevel::Avx2, avx2)
            }),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 if k_level != level || q32_level != level => {
                let avx2 = Kernels::with_levels(SimdLevel::Avx2, SimdLevel::Avx2, SimdLevel::Avx2)?;
                // The exact families' few-token jobs go through AVX2's kernels here (`with_few`).
                let mut k = Kernels { k_level, q32_level, few_level: SimdLevel::Avx2, ..Kernels::avx512() };
                if k_level == SimdLevel::Avx2 {
                    // The AVX2 dot products, and prompt-sized jobs through the AVX-512 VNNI 16-row
                    // tiles (`avx512/qk16.rs`), which give the same bits (the scalar path's).
                    (k.q4_k, k.q5_k, k.q6_k) = (avx2.q4_k, avx2.q5_k, avx2.q6_k);
                    k.gemm_q4_k = Some(avx512::gemm16_q4_k);
                    k.gemm_q5_k = Some(avx512::gemm16_q5_k);
                    k.gemm_q6_k = Some(avx512::gemm16_q6_k);
                }
                if q32_level == SimdLevel::Avx2 {
                    // As for the K formats: AVX2's dot products, AVX-512 VNNI 16-row tiles
                    // (`avx512/q32x16.rs`) for prompt-sized jobs, the same bits.
                    (k.q4_0, k.q5_0, k.q8_0) = (avx2.q4_0, avx2.q5_0, avx2.q8_0);
                    k.gemm_q4_0 = Some(avx512::gemm16_q4_0);
                    k.gemm_q5_0 = Some(avx512::gemm16_q5_0);
                    k.gemm_q8_0 = Some(avx512::gemm16_q8_0);
                }
                Some(k)
            }
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => Some(Kernels::avx512()),
            #[cfg(not(target_arch = "x86_64"))]
            _ => None,
        }
    }

    /// The AVX-512 level's own kernels for every format (the CPU must have been checked).
    #[cfg(target_arch = "x86_64")]
    fn avx512() -> Kernels {
        Kernels {
            attend: attend_avx512,
            tile: Some(tile_avx512),
            silu_mul: silu_mul_avx512,
            gemm_q4_0: Some(avx512::gemm_q4_0),
            gemm_q5_0: Some(avx512::gemm_q5_0),
            gemm_q8_0: Some(avx512::gemm_q8_0),
            gemm_q4_k: Some(avx512::gemm_q4_k),
            gemm_q5_k: Some(avx512::gemm_q5_k),
            gemm_q6_k: Some(avx512::gemm_q6_k),
            quant_q8a: quant_q8a_avx512,
            quant_q8k: quant_q8k_avx512,
            ..safe_table!(SimdLevel::Avx512, avx512)
        }
    }

    /// The kernels of the best level this CPU supports (see `SimdLevel::detect`).
    pub fn detect() -> Kernels {
        Kernels::for_level(SimdLevel::detect()).unwrap_or_else(Kernels::scalar)
    }
}
