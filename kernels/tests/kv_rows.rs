//! Moving K/V rows out of a pool and into another (`Backend::kv_export` / `kv_import`): what a
//! disk tier or another server needs to serve a prefix without recomputing it.

use cachet_kernels::backend::{AttnSeq, AttnShape, Backend, BackendError, KvFormat, KvLayout};
use cachet_kernels::cpu::CpuBackend;
use cachet_kernels::testing::Lcg;

const LAYOUT: KvLayout = KvLayout { layers: 2, slots: 16, kv_heads: 2, head_dim: 64, format: KvFormat::F16 };

/// Attention of `q` (one row per key, causal) over `slots` of layer 1 of `kv`.
fn attend(b: &CpuBackend, kv: &<CpuBackend as Backend>::Kv, q: &[f32], slots: &[u32]) -> Vec<f32> {
    let shape = AttnShape { n_heads: 4, n_kv_heads: 2, head_dim: 64, scale: 0.125 };
    let n = slots.len();
    let mut qb = b.buf();
    b.upload(&mut qb, n, 4 * 64, q);
    let seqs = [AttnSeq { rows: 0..n, first_pos: 0, slots: 0..n }];
    let mut out = b.buf();
    b.attention(&qb, kv, 1, &seqs, slots, &shape, &mut out);
    let mut host = Vec::new();
    b.download(&out, &mut host);
    host
}

#[test]
fn exported_rows_imported_into_other_slots_of_another_pool_attend_the_same() {
    for format in KvFormat::ALL {
        exported_rows_attend_the_same(KvLayout { format, ..LAYOUT });
    }
}

fn exported_rows_attend_the_same(layout: KvLayout) {
    let b = CpuBackend::new(2).unwrap();
    let mut rng = Lcg::new(41);
    let cols = layout.cols();
    let mut kv = b.kv(layout).unwrap();
    let (k, v) = (rng.vec(3 * cols, 1.5), rng.vec(3 * cols, 1.0));
    let (mut kb, mut vb) = (b.buf(), b.buf());
    b.upload(&mut kb, 3, cols, &k);
    b.upload(&mut vb, 3, cols, &v);
    let from = [3, 7, 9];
    b.kv_store(&mut kv, 1, &kb, &vb, &from);
    let mut rows = Vec::new();
    b.kv_export(&kv, 1, &from, &mut rows).unwrap();
    // f16: a unit per value; Q8_0: 17 per 32 values (34 bytes).
    assert_eq!(rows.len(), 2 * 3 * layout.row_units());
    assert_eq!(layout.row_units(), if layout.format == KvFormat::F16 { cols } else { cols / 32 * 17 });

    // Another pool, other slots: the same attention, bit for bit.
    let mut other = b.kv(layout).unwrap();
    let to = [0, 15, 1];
    b.kv_import(&mut other, 1, &to, &rows).unwrap();
    let q = rng.vec(3 * 4 * 64, 1.0);
    assert_eq!(attend(&b, &kv, &q, &from), attend(&b, &other, &q, &to));
    let mut again = Vec::new();
    b.kv_export(&other, 1, &to, &mut again).unwrap();
    assert_eq!(again, rows);
    // Layer 0 was not touched.
    b.kv_export(&other, 0, &to, &mut again).unwrap();
    assert!(again.iter().all(|&x| x == 0));
}

#[test]
fn rows_that_do_not_fit_the_pool_are_refused() {
    let b = CpuBackend::new(1).unwrap();
    let mut kv = b.kv(LAYOUT).unwrap();
    let cols = LAYOUT.kv_heads * LAYOUT.head_dim;
    let mut out = Vec::new();
    let refused = |r: Result<(), BackendError>| matches!(r, Err(BackendError::KvRows(_)));
    assert!(refused(b.kv_export(&kv, 0, &[16], &mut out)), "a slot outside the pool");
    assert!(refused(b.kv_export(&kv, 2, &[0], &mut out)), "a layer outside the pool");
    assert!(refused(b.kv_import(&mut kv, 0, &[0, 1], &vec![0; 2 * cols])), "rows for one slot, not two");
    assert!(refused(b.kv_import(&mut kv, 0, &[16], &vec![0; 2 * cols])), "a slot outside the pool");
    b.kv_export(&kv, 0, &[], &mut out).unwrap();
    assert!(out.is_empty());
}
