//! `#[repr(C)]` block layouts of the GGML quantized formats, byte for byte as
//! they sit in a GGUF file, plus the two activation formats the integer dot
//! products use. Every block has a compile-time size assertion.

use half::f16;

/// A plain-old-data block: every bit pattern is a valid value and the type has
/// no padding, so a suitably aligned byte slice can be viewed as `[Self]`.
///
/// # Safety
/// Implementors must be `#[repr(C)]`, contain only integer/float fields (or
/// arrays of them) and have no padding bytes.
pub unsafe trait Block: Copy + Send + Sync + 'static {
    /// Values per block.
    const LEN: usize;
}

/// `Q4_0`: 32 values, `d * (q - 8)` with 4-bit `q`.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ4_0 {
    pub d: f16,
    /// Value `j` in the low nibble of `qs[j]`, value `j + 16` in its high nibble.
    pub qs: [u8; 16],
}

/// `Q5_0`: 32 values, `d * (q - 16)` with 5-bit `q`; the fifth bits live in `qh`.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ5_0 {
    pub d: f16,
    /// Bit `j` (little-endian u32) is the fifth bit of value `j`.
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}

/// `Q8_0`: 32 values, `d * q` with 8-bit `q`.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; 32],
}

/// `Q4_K`: 256 values in 8 sub-blocks of 32, `d * sc * q - dmin * m` with
/// 6-bit per-sub-block scales `sc` and mins `m` packed in `scales`.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ4K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; 12],
    pub qs: [u8; 128],
}

/// `Q5_K`: like `Q4_K` with a fifth bit per value in `qh`.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ5K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; 12],
    pub qh: [u8; 32],
    pub qs: [u8; 128],
}

/// `Q6_K`: 256 values in 16 sub-blocks of 16, `d * sc * (q - 32)` with 6-bit
/// `q` (low 4 bits in `ql`, high 2 in `qh`) and signed 8-bit scales.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ6K {
    pub ql: [u8; 128],
    pub qh: [u8; 64],
    pub scales: [i8; 16],
    pub d: f16,
}

/// Activations quantized for the 32-value formats (`Q4_0`, `Q5_0`, `Q8_0`):
/// `d * q` with 8-bit `q`, and `sum` = Σ q so that kernels can work on the
/// weights' unsigned (offset) form and correct once per block.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub struct BlockQ8A {
    pub d: f32,
    pub sum: i32,
    pub qs: [i8; 32],
}

/// Activations quantized for the K formats: 256 values, `d * q`, with the sum
/// of every 16 values in `bsums` (as llama.cpp's `block_q8_K`), and
/// `msum[j] = d * (bsums[2j] + bsums[2j+1])`, the dequantized sum of each
/// 32-value sub-block (what the mins of `Q4_K`/`Q5_K` multiply), and the same sums as
/// integers in `ssums` (two to a 32-bit word for the AVX-512 tiles' `vpdpwssd`).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; 256],
    pub bsums: [i16; 16],
    pub msum: [f32; 8],
    pub ssums: [i16; 8],
}

impl Default for BlockQ8K {
    fn default() -> Self {
        Self { d: 0.0, qs: [0; 256], bsums: [0; 16], msum: [0.0; 8], ssums: [0; 8] }
    }
}

const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);
const _: () = assert!(std::mem::size_of::<BlockQ8A>() == 40);
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 340);

// SAFETY: all of these are #[repr(C)] aggregates of integers and f16/f32 with
// no padding (the size assertions above equal the sums of the field sizes).
unsafe impl Block for BlockQ4_0 {
    const LEN: usize = 32;
}
// SAFETY: as above: `#[repr(C)]` f16 + [u8; 4] + [u8; 16] = 22 bytes, the asserted size.
unsafe impl Block for BlockQ5_0 {
    const LEN: usize = 32;
}
// SAFETY: as above: `#[repr(C)]` f16 + [i8; 32] = 34 bytes, the asserted size.
unsafe impl Block for BlockQ8_0 {
    const LEN: usize = 32;
}
// SAFETY: as above: `#[repr(C)]` 2 × f16 + [u8; 12] + [u8; 128] = 144 bytes, the asserted size.
unsafe impl Block for BlockQ4K {
    const LEN: usize = 256;
}
// SAFETY: as above: `#[repr(C)]` 2 × f16 + [u8; 12] + [u8; 32] + [u8; 128] = 176 bytes, the
// asserted size.
unsafe impl Block for BlockQ5K {
    const LEN: usize = 256;
}
// SAFETY: as above: `#[repr(C)]` [u8; 128] + [u8; 64] + [i8; 16] + f16 = 210 bytes, the asserted
// size.
unsafe impl Block for BlockQ6K {
    const LEN: usize = 256;
}
// SAFETY: as above: `#[repr(C)]` f32 + i32 + [i8; 32] = 40 bytes, the asserted size.
unsafe impl Block for BlockQ8A {
    const LEN: usize = 32;
}
// SAFETY: as above: `#[repr(C)]` f32 + [i8; 256] + [i16; 16] + [f32; 8] + [i16; 8] = 340 bytes, the asserted
// size (each field lands aligned, so nothing is padded).
unsafe impl Block for BlockQ8K {
    const LEN: usize = 256;
}
// SAFETY: a primitive float: no padding, and every bit pattern is a valid value.
unsafe impl Block for f32 {
    const LEN: usize = 1;
}
// SAFETY: `half::f16` is `#[repr(transparent)]` over a `u16`: no padding, every bit pattern valid.
unsafe impl Block for f16 {
    const LEN: usize = 1;
}
// SAFETY: `half::bf16` is `#[repr(transparent)]` over a `u16`: no padding, every bit pattern valid.
unsafe impl Block for half::bf16 {
    const LEN: usize = 1;
}

/// Views `bytes` as a slice of blocks. `None` when the length is not a whole
/// number of blocks or the start is not aligned for `T`.
pub fn cast_blocks<T: Block>(bytes: &[u8]) -> Option<&[T]> {
    let size = std::mem::size_of::<T>();
    if !bytes.len().is_multiple_of(size) || !(bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()) {
        return None;
    }
    // SAFETY: T is POD (Block contract), the pointer is aligned for T and the
    // slice covers exactly len/size elements of initialised bytes.
    Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<T>(), bytes.len() / size) })
}

/// The bytes of a slice of blocks.
pub fn block_bytes<T: Block>(blocks: &[T]) -> &[u8] {
    // SAFETY: T has no padding (Block contract), so every byte is initialised.
    unsafe { std::slice::from_raw_parts(blocks.as_ptr().cast::<u8>(), std::mem::size_of_val(blocks)) }
}

/// Unpacks the 6-bit scale and min of sub-block `j` (0..8) of a `Q4_K`/`Q5_K`
/// block.
#[inline]
pub fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}
