//! The KV pool: K and V of every layer for a fixed number of token slots, in
//! backend memory, plus the allocator that hands slots out. The pool is owned
//! outside the model; a sequence is just the list of its slots.

use crate::config::ModelConfig;
use crate::EngineError;
use cachet_kernels::backend::{Backend, BackendError, KvFormat, KvLayout};

/// Index of one token slot in the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(transparent)]
pub struct SlotId(pub u32);

impl SlotId {
    /// The raw indices of a slice of slots (what the kernels take).
    pub fn raw(slots: &[SlotId]) -> &[u32] {
        // SAFETY: SlotId is #[repr(transparent)] over u32.
        unsafe { std::slice::from_raw_parts(slots.as_ptr().cast::<u32>(), slots.len()) }
    }
}

/// How big to make the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolSize {
    /// This many token slots.
    Tokens(usize),
    /// As many slots as fit in this many bytes.
    Bytes(usize),
    /// The model's whole context this many times over (requests at full context, or many
    /// shorter ones), within half the memory available (see [`PoolSize::fit`]).
    Contexts(usize),
}

impl PoolSize {
    /// Number of slots for a model whose K/V are stored in `format`.
    pub fn slots(self, config: &ModelConfig, format: KvFormat) -> usize {
        match self {
            PoolSize::Tokens(n) => n,
            PoolSize::Bytes(b) => b / kv_layout(config, 1, format).bytes_per_slot(),
            PoolSize::Contexts(n) => n.saturating_mul(config.max_context),
        }
    }

    /// The size to allocate when `available` bytes of memory are free: `Contexts` shrinks to
    /// what half of them hold (a whole number of 256-token blocks, at least 256); the others
    /// are taken as asked.
    pub fn fit(self, config: &ModelConfig, format: KvFormat, available: Option<u64>) -> PoolSize {
        let PoolSize::Contexts(_) = self else { return self };
        let wanted = self.slots(config, format);
        let per_slot = kv_layout(config, 1, format).bytes_per_slot() as u64;
        let fits = available.map_or(usize::MAX, |a| (a / 2 / per_slot.max(1)) as usize);
        PoolSize::Tokens(if wanted <= fits { wanted } else { (fits / 256 * 256).max(256) })
    }
}

/// The K/V layout of `slots` slots of a model, stored in `format`.
pub fn kv_layout(config: &ModelConfig, slots: usize, format: KvFormat) -> KvLayout {
    KvLayout { layers: config.n_layers, slots, kv_heads: config.n_kv_heads, head_dim: config.head_dim, format }
}

/// Broken allocator invariants, reported by `check_integrity`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("KV pool integrity: {0}")]
pub struct IntegrityError(pub String);

/// The allocator of a pool's slots, apart from their storage: what the scheduler owns (the
/// storage goes to the model runner).
#[derive(Debug)]
pub struct Slots {
    /// Free slots; allocation pops from the end (lowest indices first).
    free: Vec<SlotId>,
    in_use: Vec<bool>,
}

impl Slots {
    /// `n` slots, all free.
    pub fn new(n: usize) -> Slots {
        Slots { free: (0..n as u32).rev().map(SlotId).collect(), in_use: vec![false; n] }
    }

    /// Total slots.
    pub fn capacity(&self) -> usize {
        self.in_use.len()
    }

    /// Slots not in use.
    pub fn free_slots(&self) -> usize {
        self.free.len()
    }

    /// Whether `n` slots can be allocated now.
    pub fn can_allocate(&self, n: usize) -> bool {
        n <= self.free.len()
    }

    /// Takes `n` slots, or fails without taking any.
    pub fn allocate(&mut self, n: usize) -> Result<Vec<SlotId>, EngineError> {
        let mut slots = Vec::with_capacity(n);
        self.allocate_into(n, &mut slots)?;
        Ok(slots)
    }

    /// Takes `n` slots and appends them to `out` (no allocation when `out`
    /// has room), or fails without taking any.
    pub fn allocate_into(&mut self, n: usize, out: &mut Vec<SlotId>) -> Result<(), EngineError> {
        if !self.can_allocate(n) {
            return Err(EngineError::OutOfSlots { needed: n, free: self.free.len() });
        }
        for _ in 0..n {
            let s = self.free.pop().expect("can_allocate checked the count");
            self.in_use[s.0 as usize] = true;
            out.push(s);
        }
        Ok(())
    }

    /// Returns slots to the pool. Slots that are not in use (a double free)
    /// are reported and ignored, leaving the pool consistent.
    pub fn free(&mut self, slots: &[SlotId]) -> Result<(), IntegrityError> {
        let mut bad = Vec::new();
        for &s in slots {
            match self.in_use.get_mut(s.0 as usize) {
                Some(u) if *u => {
                    *u = false;
                    self.free.push(s);
                }
                _ => bad.push(s.0),
            }
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(IntegrityError(format!("freed slots that were not in use: {bad:?}")))
        }
    }

    /// Checks that every slot is exactly once either free or in use.
    pub fn check_integrity(&self) -> Result<(), IntegrityError> {
        let mut seen = vec![false; self.capacity()];
        for s in &self.free {
            let i = s.0 as usize;
            if i >= seen.len() {
                return Err(IntegrityError(format!("free slot {i} out of range")));
            }
            if seen[i] {
                return Err(IntegrityError(format!("slot {i} is free twice")));
            }
            if self.in_use[i] {
                return Err(IntegrityError(format!("slot {i} is both free and in use")));
            }
            seen[i] = true;
        }
        let used = self.in_use.iter().filter(|&&u| u).count();
        if used + self.free.len() != self.capacity() {
            return Err(IntegrityError(format!(
                "{used} in use + {} free != {} slots",
                self.free.len(),
                self.capacity()
            )));
        }
        Ok(())
    }
}

/// K/V storage and its slot allocator.
pub struct KvPool<B: Backend> {
    storage: B::Kv,
    layout: KvLayout,
    slots: Slots,
}

impl<B: Backend> std::fmt::Debug for KvPool<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvPool").field("layout", &self.layout).field("free", &self.slots.free_slots()).finish()
    }
}

impl<B: Backend> KvPool<B> {
    /// Allocates a pool of `size` for `config` on backend `b`, K/V in f16.
    pub fn new(b: &B, config: &ModelConfig, size: PoolSize) -> Result<KvPool<B>, BackendError> {
        KvPool::with_format(b, config, size, KvFormat::F16)
    }

    /// Allocates a pool of `size` for `config` on backend `b`, K/V stored in `format`.
    pub fn with_format(
        b: &B,
        config: &ModelConfig,
        size: PoolSize,
        format: KvFormat,
    ) -> Result<KvPool<B>, BackendError> {
        let slots = size.slots(config, format);
        if slots == 0 || slots > u32::MAX as usize {
            return Err(BackendError::Unsupported(format!("a KV pool of {slots} slots")));
        }
        let layout = kv_layout(config, slots, format);
        let storage = b.kv(layout)?;
        Ok(KvPool { storage, layout, slots: Slots::new(slots) })
    }

    /// The pool's shape.
    pub fn layout(&self) -> KvLayout {
        self.layout
    }

    /// Total slots.
    pub fn capacity(&self) -> usize {
        self.slots.capacity()
    }

    /// Slots not in use.
    pub fn free_slots(&self) -> usize {
        self.slots.free_slots()
    }

    /// Whether `n` slots can be allocated now.
    pub fn can_allocate(&self, n: usize) -> bool {
        self.slots.can_allocate(n)
    }

    /// Takes `n` slots, or fails without taking any.
    pub fn allocate(&mut self, n: usize) -> Result<Vec<SlotId>, EngineError> {
        self.slots.allocate(n)
    }

    /// Takes `n` slots and appends them to `out`, or fails without taking any.
    pub fn allocate_into(&mut self, n: usize, out: &mut Vec<SlotId>) -> Result<(), EngineError> {
        self.slots.allocate_into(n, out)
    }

    /// Returns slots to the pool (see [`Slots::free`]).
    pub fn free(&mut self, slots: &[SlotId]) -> Result<(), IntegrityError> {
        self.slots.free(slots)
    }

    /// Checks that every slot is exactly once either free or in use.
    pub fn check_integrity(&self) -> Result<(), IntegrityError> {
        self.slots.check_integrity()
    }

    /// The backend storage, for the forward pass.
    pub fn storage_mut(&mut self) -> &mut B::Kv {
        &mut self.storage
    }

    /// The allocator and the storage apart (the engine's scheduler takes one, its runner the
    /// other).
    pub fn into_parts(self) -> (Slots, B::Kv) {
        (self.slots, self.storage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Arch;
    use cachet_kernels::backend::RopeStyle;
    use cachet_kernels::cpu::CpuBackend;

    fn config() -> ModelConfig {
        ModelConfig {
            arch: Arch::Qwen2,
            vocab_size: 10,
            hidden: 8,
            intermediate: 16,
            n_layers: 2,
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 4,
            rope_theta: 10000.0,
            rope_style: RopeStyle::Neox,
            rms_eps: 1e-6,
            max_context: 64,
            yarn: None,
            qkv_bias: false,
            qk_norm: false,
            moe: None,
        }
    }

    #[test]
    fn a_pool_of_contexts_fits_half_the_free_memory() {
        let c = ModelConfig { max_context: 4096, ..config() };
        // 2 layers × K and V × 1 head × 4 dims × 2 bytes = 32 bytes a slot.
        let per_slot = 32;
        assert_eq!(PoolSize::Contexts(2).fit(&c, KvFormat::F16, None), PoolSize::Tokens(8192));
        assert_eq!(PoolSize::Contexts(2).fit(&c, KvFormat::F16, Some(2 * 8192 * per_slot)), PoolSize::Tokens(8192));
        assert_eq!(
            PoolSize::Contexts(2).fit(&c, KvFormat::F16, Some(2 * 5000 * per_slot)),
            PoolSize::Tokens(4864),
            "256-token blocks"
        );
        assert_eq!(PoolSize::Contexts(2).fit(&c, KvFormat::F16, Some(10)), PoolSize::Tokens(256), "never empty");
        assert_eq!(
            PoolSize::Tokens(77).fit(&c, KvFormat::F16, Some(10)),
            PoolSize::Tokens(77),
            "an explicit size is kept"
        );
    }

    /// The same memory holds 2 × 16 / 17 = 1.88 times the slots in `Q8_0` (8.5 bits a value): with
    /// heads of 32 values (the smallest a block allows), 2 layers × K and V × 34 bytes a slot.
    #[test]
    fn a_q8_0_pool_holds_more_slots_in_the_same_bytes() {
        let c = ModelConfig { head_dim: 32, max_context: 4096, ..config() };
        let bytes = 136 * 1000;
        assert_eq!(PoolSize::Bytes(bytes).slots(&c, KvFormat::Q8_0), 1000);
        assert_eq!(PoolSize::Bytes(bytes).slots(&c, KvFormat::F16), 531);
        assert_eq!(PoolSize::Contexts(2).fit(&c, KvFormat::Q8_0, Some(2 * 2000 * 136)), PoolSize::Tokens(1792));
        // A head of 4 values cannot hold a block: a clear error, not a misread pool.
        let b = CpuBackend::new(1).unwrap();
        let err = KvPool::with_format(&b, &config(), PoolSize::Tokens(8), KvFormat::Q8_0).unwrap_err();
        assert!(err.to_string().contains("q8_0"), "{err}");
    }

    /// `kv_format = "auto"`: `Q8_0` where the backend stores it and a head is whole blocks, else
    /// f16; a format chosen is kept.
    #[test]
    fn auto_takes_q8_0_where_the_backend_and_the_heads_allow_it() {
        use crate::runtime::resolve_kv_format;
        let b = CpuBackend::new(1).unwrap();
        assert_eq!(resolve_kv_format(None, &b, &config()), KvFormat::F16, "heads of 4 values");
        let wide = ModelConfig { head_dim: 64, ..config() };
        assert_eq!(resolve_kv_format(None, &b, &wide), KvFormat::Q8_0);
        assert_eq!(resolve_kv_format(Some(KvFormat::F16), &b, &wide), KvFormat::F16);
    }

    #[test]
    fn allocate_and_free_keep_the_pool_consistent() {
        let b = CpuBackend::new(1).unwrap();
        let mut pool = KvPool::new(&b, &config(), PoolSize::Tokens(10)).unwrap();
        let a = pool.allocate(4).unwrap();
        assert_eq!(SlotId::raw(&a), &[0, 1, 2, 3]);
        pool.check_integrity().unwrap();
        assert!(pool.can_allocate(6) && !pool.can_allocate(7));
        assert!(matches!(pool.allocate(7), Err(EngineError::OutOfSlots { needed: 7, free: 6 })));
        pool.check_integrity().unwrap();
        let c = pool.allocate(6).unwrap();
        assert_eq!(pool.free_slots(), 0);
        pool.free(&a).unwrap();
        pool.check_integrity().unwrap();
        assert!(pool.free(&a[..1]).is_err(), "double free is reported");
        assert!(pool.free(&[SlotId(99)]).is_err(), "unknown slot is reported");
        pool.check_integrity().unwrap();
        pool.free(&c).unwrap();
        assert_eq!(pool.free_slots(), 10);
        pool.check_integrity().unwrap();
    }

    #[test]
    fn size_in_bytes() {
        let c = config();
        // 2 layers × (K + V) × 1 head × 4 dims × 2 bytes = 32 bytes a slot.
        assert_eq!(PoolSize::Bytes(320).slots(&c, KvFormat::F16), 10);
        let b = CpuBackend::new(1).unwrap();
        assert!(KvPool::new(&b, &c, PoolSize::Bytes(16)).is_err(), "zero slots is an error");
    }
}
