//! Steady-state decoding allocates nothing: after a warm-up step has grown the
//! scratch buffers, a forward pass (one sequence or several) makes no heap
//! allocation on any thread. Counted with a global allocator in this test
//! binary (its own process, so other tests cannot interfere).

use cachet_engine::config::ModelConfig;
use cachet_engine::gguf::GgufFile;
use cachet_engine::kv_pool::{KvPool, PoolSize, SlotId};
use cachet_engine::model::{ForwardScratch, LogitsFor, Model, SeqChunk};
use cachet_engine::testing::{Tiny, TinyArch};
use cachet_kernels::cpu::CpuBackend;
use cachet_kernels::quant::DType;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn decode_steps_do_not_allocate() {
    let dir = tempfile::tempdir().unwrap();
    for dtype in [DType::Q5_0, DType::Q4_K, DType::F16] {
        let path = dir.path().join(format!("m-{dtype}.gguf"));
        Tiny::random(TinyArch::Qwen2, 3, false).write_gguf(dtype, &path).unwrap();
        let file = GgufFile::open(&path).unwrap();
        let config = ModelConfig::from_gguf(&file).unwrap();
        let b = CpuBackend::new(2).unwrap();
        let mut pool = KvPool::new(&b, &config, PoolSize::Tokens(256)).unwrap();
        let model = Model::load(&b, &file, config).unwrap();
        let mut scratch = ForwardScratch::new(&b);
        let mut logits = Vec::new();

        let seqs = 3;
        let steps = 24;
        let mut slots: Vec<Vec<SlotId>> = (0..seqs).map(|_| Vec::with_capacity(64)).collect();
        let prompt = [5u32, 9, 200, 17];
        for s in slots.iter_mut() {
            pool.allocate_into(prompt.len(), s).unwrap();
        }
        // Prefill; then warm-up steps size every buffer.
        let chunks: Vec<SeqChunk<'_>> = slots
            .iter()
            .map(|s| SeqChunk { tokens: &prompt, start_pos: 0, slots: SlotId::raw(s), logits: LogitsFor::Last })
            .collect();
        model.forward(&b, pool.storage_mut(), &chunks, &mut scratch, &mut logits).unwrap();
        let mut step = |slots: &mut Vec<Vec<SlotId>>, pool: &mut KvPool<CpuBackend>, n_seqs: usize, count: bool| {
            for s in slots.iter_mut().take(n_seqs) {
                pool.allocate_into(1, s).unwrap();
            }
            let before = ALLOCATIONS.load(Ordering::SeqCst);
            let chunks: [SeqChunk<'_>; 3] = std::array::from_fn(|i| SeqChunk {
                tokens: &prompt[i..i + 1],
                start_pos: slots[i].len() - 1,
                slots: SlotId::raw(&slots[i]),
                logits: LogitsFor::Last,
            });
            model.forward(&b, pool.storage_mut(), &chunks[..n_seqs], &mut scratch, &mut logits).unwrap();
            let made = ALLOCATIONS.load(Ordering::SeqCst) - before;
            assert!(!count || made == 0, "{dtype}: a decode step of {n_seqs} sequences made {made} allocations");
        };
        step(&mut slots, &mut pool, seqs, false);
        step(&mut slots, &mut pool, seqs, false);
        for i in 0..steps {
            // Alternate batch sizes: buffers sized for 3 fit 1 and 2 too.
            step(&mut slots, &mut pool, 1 + i % seqs, true);
        }
    }
}
