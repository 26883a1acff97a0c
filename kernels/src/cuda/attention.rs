//! Host side of attention over the slot pool (attention.cu): the tables that
//! tell each block its row, chunk and keys, the split of a large batch into
//! launches, and the two kernels.

use super::scratch::{grown, upload_cached};
use super::{check, CudaBackend, CudaBuf, CudaKv};
use crate::backend::{AttnSeq, AttnShape, Backend};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use std::ops::Range;

/// ATT_CHUNK, ATT_TILE and ATT_MAX_HEAD_DIM of attention.cu.
const CHUNK: usize = 64;
const TILE: usize = 64;
const MAX_HEAD_DIM: usize = 256;
/// Threads of both kernels.
const THREADS: u32 = 128;
/// Bytes of partial results one launch may use (rows are split to fit).
const PARTIAL_BYTES: usize = 64 << 20;
/// Dynamic shared memory a block may use without opting in.
const SHARED_LIMIT: usize = 48 << 10;

/// One launch: rows `rows` of the batch; their tables start at `table` in
/// [`Plan::host`] (3 values per row, then 2 per work item).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Group {
    rows: Range<usize>,
    table: usize,
    items: usize,
}

/// Everything uploaded for one attention call: every slot of the call's slot
/// table, then per group its row table (first slot, number of keys, first
/// work item) and work items (row in the group, chunk).
#[derive(Debug)]
struct Plan {
    host: Vec<u32>,
    groups: Vec<Group>,
    most_items: usize,
}

/// The tables of a call; `max_items` bounds the work items of one group (a
/// row with more chunks still gets a group of its own).
fn plan(seqs: &[AttnSeq], slots: &[u32], max_items: usize) -> Plan {
    let mut per_row: Vec<(u32, u32)> = Vec::new();
    for seq in seqs {
        assert!(seq.slots.end <= slots.len(), "a sequence's slots outside the slot table");
        assert_eq!(seq.rows.start, per_row.len(), "sequences cover consecutive rows from 0");
        for r in seq.rows.clone() {
            let keys = seq.first_pos + (r - seq.rows.start) + 1;
            assert!(keys <= seq.slots.len(), "row {r} attends to {keys} positions but has {} slots", seq.slots.len());
            per_row.push((seq.slots.start as u32, keys as u32));
        }
    }
    let chunks = |keys: u32| (keys as usize).div_ceil(CHUNK);
    let mut host: Vec<u32> = slots.to_vec();
    let mut groups = Vec::new();
    let mut most_items = 0;
    let mut start = 0;
    while start < per_row.len() {
        let (mut end, mut items) = (start, 0);
        while end < per_row.len() && (end == start || items + chunks(per_row[end].1) <= max_items) {
            items += chunks(per_row[end].1);
            end += 1;
        }
        let table = host.len();
        let mut first = 0;
        for &(slot0, keys) in &per_row[start..end] {
            host.extend([slot0, keys, first as u32]);
            first += chunks(keys);
        }
        for (i, &(_, keys)) in per_row[start..end].iter().enumerate() {
            host.extend((0..chunks(keys)).flat_map(|c| [i as u32, c as u32]));
        }
        most_items = most_items.max(items);
        groups.push(Group { rows: start..end, table, items });
        start = end;
    }
    Plan { host, groups, most_items }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn attention(
    be: &CudaBackend,
    q: &CudaBuf,
    kv: &CudaKv,
    layer: usize,
    seqs: &[AttnSeq],
    slots: &[u32],
    s: &AttnShape,
    out: &mut CudaBuf,
) {
    be.resize(out, q.rows, q.cols);
    let (hd, nh, nkv) = (s.head_dim, s.n_heads, s.n_kv_heads);
    assert!(nkv > 0 && nh.is_multiple_of(nkv), "{nh} heads over {nkv} KV heads");
    assert!(hd.is_multiple_of(2) && hd <= MAX_HEAD_DIM, "head_dim {hd} (even, at most {MAX_HEAD_DIM})");
    assert_eq!(q.cols, nh * hd, "q rows hold every head");
    assert_eq!((kv.layout.kv_heads, kv.layout.head_dim), (nkv, hd), "the pool's head shape");
    let rep = nh / nkv;
    let shared = (2 * rep * hd + rep * TILE + 3 * rep) * 4;
    assert!(shared <= SHARED_LIMIT, "{rep} query heads per KV head of {hd} need {shared} bytes of shared memory");
    if let Some(&slot) = slots.iter().find(|&&x| x as usize >= kv.layout.slots) {
        panic!("slot {slot} outside a pool of {} slots", kv.layout.slots);
    }
    let plan = plan(seqs, slots, (PARTIAL_BYTES / (nh * (hd + 2) * 4)).max(1));
    let rows = plan.groups.last().map_or(0, |g| g.rows.end);
    assert!(rows <= q.rows, "{rows} attention rows for a q of {} rows", q.rows);
    if rows == 0 {
        return;
    }

    let mut scratch = be.scratch();
    let scratch = &mut *scratch;
    let idx = upload_cached(&be.stream, &mut scratch.attention, &plan.host);
    let part_o = grown(&be.stream, &mut scratch.part_o, plan.most_items * nh * hd);
    let part_ml = grown(&be.stream, &mut scratch.part_ml, plan.most_items * nh * 2);
    let (kc, vc) = &kv.layers[layer];
    let width = nh * hd;
    let (nh32, nkv32, hd32, scale) = (nh as u32, nkv as u32, hd as u32, s.scale);
    let slot_table = idx.slice(0..slots.len());
    for g in &plan.groups {
        let n = g.rows.len();
        let row_table = idx.slice(g.table..g.table + 3 * n);
        let items = idx.slice(g.table + 3 * n..g.table + 3 * n + 2 * g.items);
        let qv = q.slice().slice(g.rows.start * width..g.rows.end * width);
        let chunk_cfg = LaunchConfig {
            grid_dim: (g.items as u32, nkv as u32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: shared as u32,
        };
        {
            let mut b = be.stream.launch_builder(&be.kernels.attention_chunk);
            b.arg(&qv).arg(kc).arg(vc).arg(&row_table).arg(&items).arg(&slot_table);
            b.arg(&mut *part_o).arg(&mut *part_ml).arg(&nh32).arg(&nkv32).arg(&hd32).arg(&scale);
            // SAFETY: attention_chunk(const float*, const u16*, const u16*,
            // const u32*, const u32*, const u32*, float*, float*, u32, u32,
            // u32, float): q holds the group's rows; the plan's tables only
            // name slots inside the pool (checked) and positions that have a
            // slot; the partials hold most_items ≥ g.items items; `shared`
            // bytes of dynamic shared memory are what the kernel lays out.
            check("attention", unsafe { b.launch(chunk_cfg) });
        }
        let mut ov = out.slice_mut().slice_mut(g.rows.start * width..g.rows.end * width);
        let combine_cfg = LaunchConfig { grid_dim: (n as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        {
            let mut b = be.stream.launch_builder(&be.kernels.attention_combine);
            b.arg(&row_table).arg(&*part_o).arg(&*part_ml).arg(&mut ov).arg(&nh32).arg(&hd32);
            // SAFETY: attention_combine(const u32*, const float*, const float*,
            // float*, u32, u32): one block per row of the group; the partials
            // of its items were written by the launch above on this stream.
            check("attention combine", unsafe { b.launch(combine_cfg) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads the plan back the way the kernels do: for every row, the slots
    /// of the keys each work item covers.
    fn keys_per_row(p: &Plan, slots_len: usize) -> Vec<Vec<u32>> {
        let mut out = Vec::new();
        for g in &p.groups {
            let n = g.rows.len();
            let rows = &p.host[g.table..g.table + 3 * n];
            let items = &p.host[g.table + 3 * n..g.table + 3 * n + 2 * g.items];
            let mut per_row: Vec<Vec<u32>> = vec![Vec::new(); n];
            for (i, it) in items.chunks(2).enumerate() {
                let (row, chunk) = (it[0] as usize, it[1] as usize);
                let (slot0, keys, first) = (rows[3 * row] as usize, rows[3 * row + 1] as usize, rows[3 * row + 2]);
                assert_eq!(first as usize + chunk, i, "a row's items are consecutive, chunks in order");
                for j in chunk * CHUNK..((chunk + 1) * CHUNK).min(keys) {
                    assert!(slot0 + j < slots_len);
                    per_row[row].push(p.host[slot0 + j]);
                }
            }
            out.extend(per_row);
        }
        out
    }

    #[test]
    fn every_row_sees_exactly_its_causal_keys() {
        let slots: Vec<u32> = (0..2000u32).map(|i| i * 7 % 2003).collect();
        let seqs = vec![
            AttnSeq { rows: 0..3, first_pos: 0, slots: 0..3 },
            AttnSeq { rows: 3..4, first_pos: 700, slots: 3..704 },
            AttnSeq { rows: 4..10, first_pos: 250, slots: 704..960 },
        ];
        for max_items in [1, 3, 1000] {
            let p = plan(&seqs, &slots, max_items);
            assert_eq!(p.groups.first().unwrap().rows.start, 0);
            assert_eq!(p.groups.last().unwrap().rows.end, 10);
            assert!(p.groups.windows(2).all(|w| w[0].rows.end == w[1].rows.start));
            for g in &p.groups {
                assert!(g.items <= max_items || g.rows.len() == 1, "{g:?}");
                assert!(g.items <= p.most_items);
            }
            let keys = keys_per_row(&p, slots.len());
            let mut r = 0;
            for s in &seqs {
                for (i, _) in s.rows.clone().enumerate() {
                    let n = s.first_pos + i + 1;
                    assert_eq!(keys[r], slots[s.slots.start..s.slots.start + n], "row {r}");
                    r += 1;
                }
            }
        }
    }

    #[test]
    fn chunks_depend_only_on_the_row() {
        // The same row (position 600 of a sequence) alone and inside a batch
        // gets the same chunks (ten: 9 × 64 + 25 keys).
        let slots: Vec<u32> = (0..1000).collect();
        let alone = plan(&[AttnSeq { rows: 0..1, first_pos: 600, slots: 0..601 }], &slots, 1000);
        assert_eq!(alone.groups[0].items, 10);
        let batch = plan(
            &[AttnSeq { rows: 0..5, first_pos: 0, slots: 0..5 }, AttnSeq { rows: 5..6, first_pos: 600, slots: 0..601 }],
            &slots,
            1000,
        );
        assert_eq!(batch.groups[0].items, 5 + 10);
    }
}
