//! Host side of attention over the slot pool (attention.cu): the tables that
//! tell each block its row, chunk and keys, the split of a large batch into
//! launches, and the two kernels.

use super::graph::launch;
use super::scratch::{grown, upload_cached};
use super::{CudaBackend, CudaBuf, CudaKv};
use crate::backend::{AttnSeq, AttnShape, Backend};
use cudarc::driver::LaunchConfig;
use std::ops::Range;

/// ATT_CHUNK, ATT_TILE and ATT_MAX_HEAD_DIM of attention.cu.
const CHUNK: usize = 64;
const TILE: usize = 64;
const MAX_HEAD_DIM: usize = 256;
/// Threads of both kernels (256: a decode row's 7 query heads × 64 dimensions per KV head take
/// two passes, not four; each output is still one thread's sum in key order).
const THREADS: u32 = 256;
/// Bytes of partial results one launch may use (rows are split to fit).
const PARTIAL_BYTES: usize = 64 << 20;
/// Dynamic shared memory a block may use without opting in.
const SHARED_LIMIT: usize = 48 << 10;

/// One launch: rows `rows` of the batch; their tables start at `table` in
/// [`Plan::host`] (3 values per row, then 2 per work item). `items` work items
/// are real; the launch covers `launched` (the next power of two), the rest
/// being [`NO_ROW`] items that do nothing: the launch's shape then changes only
/// when the count crosses a power of two, not whenever a row gains a chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Group {
    rows: Range<usize>,
    table: usize,
    items: usize,
    launched: usize,
}

/// The row of a padding work item (attention.cu returns at once).
const NO_ROW: u32 = u32::MAX;

/// Everything uploaded for one attention call: per group its row table (first
/// slot, number of keys, first work item) and work items (row in the group,
/// chunk), then every slot of the call's slot table from `slots_at`, padded to
/// a power of two (at least [`SLOT_PAD`]). Tables first and padding keep the
/// upload's size, the tables' places and the launch shapes the same over many
/// decode steps, so that those steps can replay as a CUDA graph.
#[derive(Debug)]
struct Plan {
    host: Vec<u32>,
    slots_at: usize,
    groups: Vec<Group>,
    most_items: usize,
}

/// The shortest padded slot table.
const SLOT_PAD: usize = 256;

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
    let mut host: Vec<u32> = Vec::new();
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
        let launched = items.next_power_of_two();
        host.extend((items..launched).flat_map(|_| [NO_ROW, 0]));
        most_items = most_items.max(items);
        groups.push(Group { rows: start..end, table, items, launched });
        start = end;
    }
    let slots_at = host.len();
    host.extend_from_slice(slots);
    host.resize(slots_at + slots.len().next_power_of_two().max(SLOT_PAD), 0);
    Plan { host, slots_at, groups, most_items }
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
    let idx = upload_cached(be, &mut scratch.attention, &plan.host);
    let part_o = grown(be, &mut scratch.part_o, plan.most_items * nh * hd);
    let part_ml = grown(be, &mut scratch.part_ml, plan.most_items * nh * 2);
    let (kc, vc) = &kv.layers[layer];
    let width = nh * hd;
    let (nh32, nkv32, hd32, scale) = (nh as u32, nkv as u32, hd as u32, s.scale);
    let slot_table = idx.slice(plan.slots_at..plan.slots_at + slots.len());
    for g in &plan.groups {
        let n = g.rows.len();
        let row_table = idx.slice(g.table..g.table + 3 * n);
        let items = idx.slice(g.table + 3 * n..g.table + 3 * n + 2 * g.launched);
        let qv = q.slice().slice(g.rows.start * width..g.rows.end * width);
        let chunk_cfg = LaunchConfig {
            grid_dim: (g.launched as u32, nkv as u32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: shared as u32,
        };
        {
            // SAFETY: attention_chunk(const float*, const u16*, const u16*,
            // const u32*, const u32*, const u32*, float*, float*, u32, u32,
            // u32, float): q holds the group's rows; the plan's tables only
            // name slots inside the pool (checked) and positions that have a
            // slot; the partials hold most_items ≥ g.items items (the
            // padding items up to g.launched write nothing); `shared`
            // bytes of dynamic shared memory are what the kernel lays out.
            launch!(be, "attention", &be.kernels.attention_chunk, chunk_cfg; qv, kc, vc, row_table, items, slot_table, *part_o, *part_ml, nh32, nkv32, hd32, scale);
        }
        let ov = out.slice_mut().slice_mut(g.rows.start * width..g.rows.end * width);
        let combine_cfg = LaunchConfig { grid_dim: (n as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        {
            // SAFETY: attention_combine(const u32*, const float*, const float*,
            // float*, u32, u32): one block per row of the group; the partials
            // of its items were written by the launch above on this stream.
            launch!(be, "attention combine", &be.kernels.attention_combine, combine_cfg; row_table, *part_o, *part_ml, ov, nh32, hd32);
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
            let mut per_row: Vec<Vec<u32>> = vec![Vec::new(); n];
            assert!(g.launched.is_power_of_two() && g.launched >= g.items);
            for (i, it) in p.host[g.table + 3 * n..g.table + 3 * n + 2 * g.launched].chunks(2).enumerate() {
                if i >= g.items {
                    assert_eq!(it[0], NO_ROW, "padding items after the real ones");
                    continue;
                }
                let (row, chunk) = (it[0] as usize, it[1] as usize);
                let (slot0, keys, first) = (rows[3 * row] as usize, rows[3 * row + 1] as usize, rows[3 * row + 2]);
                assert_eq!(first as usize + chunk, i, "a row's items are consecutive, chunks in order");
                for j in chunk * CHUNK..((chunk + 1) * CHUNK).min(keys) {
                    assert!(slot0 + j < slots_len);
                    per_row[row].push(p.host[p.slots_at + slot0 + j]);
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
