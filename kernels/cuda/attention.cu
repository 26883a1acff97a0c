// Causal attention over the slot-indexed f16 K/V pool. Needs common.cuh in
// front.
//
// A query row at position p attends to the keys of its sequence's slots
// 0..=p (n_keys = p + 1). Keys are split into fixed chunks of ATT_CHUNK by key
// index; one block computes one (row, chunk, KV head) with online softmax over
// tiles of ATT_TILE keys, for the `rep` query heads sharing that KV head
// (grouped-query attention), and writes its unnormalised output with its
// running max and sum. `attention_combine` then merges a row's chunks in
// order. The chunking depends only on the row's own position, and every
// reduction has a fixed order, so a row's result is the same in a prefill
// chunk as in a decode step, whatever else is in the batch.
//
// One launch covers a group of consecutive rows (the host splits a large batch
// so that the partials stay small); `q`, `out`, `rows` and `items` start at
// the group's first row, and rows and items are numbered within the group.
// Per row r:  rows[3r] = index in `slots` of the sequence's first slot,
//             rows[3r + 1] = n_keys, rows[3r + 2] = its first work item.
// Per item i: items[2i] = row, items[2i + 1] = chunk; row 0xffffffff is a
// padding item that does nothing.
// Partials, per (item, query head): o[hd] and ml = (max, sum).

// 64 keys per chunk: a decode row over a few hundred keys is then enough blocks to keep
// the GPU busy (256 gave a 640-key decode 6 blocks on an H200 with 132 SMs).
#define ATT_CHUNK 64
#define ATT_TILE 64
#define ATT_MAX_HEAD_DIM 256

// Dynamic shared memory: q[rep*hd], acc[rep*hd], p[rep*ATT_TILE], m[rep],
// l[rep], corr[rep] (floats). Block: a multiple of 32 threads.
extern "C" __global__ void attention_chunk(const float* q, const u16* kc, const u16* vc, const u32* rows,
                                           const u32* items, const u32* slots, float* part_o, float* part_ml,
                                           u32 n_heads, u32 n_kv_heads, u32 head_dim, float scale) {
    extern __shared__ float sm[];
    __shared__ u32 tile_slots[ATT_TILE];
    const u32 item = blockIdx.x;
    const u32 g = blockIdx.y;
    const u32 row = items[2 * item];
    if (row == 0xffffffffu) {
        return;  // padding: the host rounds the launch up to a power of two items
    }
    const u32 chunk = items[2 * item + 1];
    const u32 slot0 = rows[3 * row];
    const u32 n_keys = rows[3 * row + 1];
    const u32 hd = head_dim;
    const u32 rep = n_heads / n_kv_heads;
    const u64 kv_cols = (u64)n_kv_heads * hd;
    const u32 begin = chunk * ATT_CHUNK;
    const u32 end = umin(n_keys, begin + ATT_CHUNK);

    float* qs = sm;
    float* acc = qs + rep * hd;
    float* p = acc + rep * hd;
    float* m = p + rep * ATT_TILE;
    float* l = m + rep;
    float* corr = l + rep;

    const u32 tid = threadIdx.x;
    const u32 lane = tid & 31;
    const u32 warp = tid >> 5;
    const u32 warps = blockDim.x >> 5;

    const float* qrow = q + (u64)row * n_heads * hd + (u64)g * rep * hd;
    for (u32 e = tid; e < rep * hd; e += blockDim.x) {
        qs[e] = qrow[e];
        acc[e] = 0.0f;
    }
    for (u32 h = tid; h < rep; h += blockDim.x) {
        m[h] = NEG_INF;
        l[h] = 0.0f;
    }
    __syncthreads();

    for (u32 t0 = begin; t0 < end; t0 += ATT_TILE) {
        const u32 nt = umin(ATT_TILE, end - t0);
        for (u32 j = tid; j < nt; j += blockDim.x) {
            tile_slots[j] = slots[slot0 + t0 + j];
        }
        __syncthreads();

        // Scores: a warp per key; lane handles dimensions 2*lane + 64*i.
        for (u32 j = warp; j < nt; j += warps) {
            const u16* kr = kc + tile_slots[j] * kv_cols + (u64)g * hd;
            float kf[ATT_MAX_HEAD_DIM / 32];
#pragma unroll
            for (u32 i = 0; i < ATT_MAX_HEAD_DIM / 64; ++i) {
                const u32 d = 2 * lane + 64 * i;
                if (d < hd) {
                    const u32 two = *(const u32*)(kr + d);
                    kf[2 * i] = f16_to_f32((u16)(two & 0xffffu));
                    kf[2 * i + 1] = f16_to_f32((u16)(two >> 16));
                } else {
                    kf[2 * i] = 0.0f;
                    kf[2 * i + 1] = 0.0f;
                }
            }
            for (u32 h = 0; h < rep; ++h) {
                const float* qh = qs + h * hd;
                float s = 0.0f;
#pragma unroll
                for (u32 i = 0; i < ATT_MAX_HEAD_DIM / 64; ++i) {
                    const u32 d = 2 * lane + 64 * i;
                    if (d < hd) {
                        s = fmaf(qh[d], kf[2 * i], s);
                        s = fmaf(qh[d + 1], kf[2 * i + 1], s);
                    }
                }
                s = warp_sum(s);
                if (lane == 0) {
                    p[h * ATT_TILE + j] = s * scale;
                }
            }
        }
        __syncthreads();

        // Online softmax: a warp per query head; lane holds keys lane, lane+32.
        for (u32 h = warp; h < rep; h += warps) {
            float* ph = p + h * ATT_TILE;
            const float s0 = lane < nt ? ph[lane] : NEG_INF;
            const float s1 = lane + 32 < nt ? ph[lane + 32] : NEG_INF;
            const float old = m[h];
            const float mx = fmaxf(old, warp_max(fmaxf(s0, s1)));
            const float e0 = lane < nt ? expf(s0 - mx) : 0.0f;
            const float e1 = lane + 32 < nt ? expf(s1 - mx) : 0.0f;
            const float sum = warp_sum(e0 + e1);
            if (lane < nt) {
                ph[lane] = e0;
            }
            if (lane + 32 < nt) {
                ph[lane + 32] = e1;
            }
            if (lane == 0) {
                const float c = expf(old - mx);
                corr[h] = c;
                l[h] = l[h] * c + sum;
                m[h] = mx;
            }
        }
        __syncthreads();

        // acc = acc * corr + Σ_j p_j v_j, a thread per (head, dimension), keys in order. The
        // loads of 8 keys' values are issued before their sums (same order of additions).
        for (u32 e = tid; e < rep * hd; e += blockDim.x) {
            const u32 h = e / hd;
            const u32 d = e % hd;
            const float* ph = p + h * ATT_TILE;
            const u16* vd = vc + (u64)g * hd + d;
            float a = acc[e] * corr[h];
            u32 j = 0;
            for (; j + 8 <= nt; j += 8) {
                float v[8];
#pragma unroll
                for (u32 i = 0; i < 8; ++i) {
                    v[i] = f16_to_f32(vd[tile_slots[j + i] * kv_cols]);
                }
#pragma unroll
                for (u32 i = 0; i < 8; ++i) {
                    a = fmaf(ph[j + i], v[i], a);
                }
            }
            for (; j < nt; ++j) {
                a = fmaf(ph[j], f16_to_f32(vd[tile_slots[j] * kv_cols]), a);
            }
            acc[e] = a;
        }
        __syncthreads();
    }

    const u64 base = (u64)item * n_heads + (u64)g * rep;
    for (u32 e = tid; e < rep * hd; e += blockDim.x) {
        part_o[base * hd + e] = acc[e];
    }
    for (u32 h = tid; h < rep; h += blockDim.x) {
        part_ml[(base + h) * 2] = m[h];
        part_ml[(base + h) * 2 + 1] = l[h];
    }
}

// One block per row: merges the row's chunks in order,
// out = Σ_c o_c e^(m_c - M) / Σ_c l_c e^(m_c - M) with M the largest m_c.
extern "C" __global__ void attention_combine(const u32* rows, const float* part_o, const float* part_ml, float* out,
                                             u32 n_heads, u32 head_dim) {
    const u32 row = blockIdx.x;
    const u32 n_keys = rows[3 * row + 1];
    const u32 first = rows[3 * row + 2];
    const u32 chunks = (n_keys + ATT_CHUNK - 1) / ATT_CHUNK;
    const u32 width = n_heads * head_dim;
    for (u32 e = threadIdx.x; e < width; e += blockDim.x) {
        const u32 h = e / head_dim;
        float mx = NEG_INF;
        for (u32 c = 0; c < chunks; ++c) {
            mx = fmaxf(mx, part_ml[((u64)(first + c) * n_heads + h) * 2]);
        }
        float o = 0.0f;
        float l = 0.0f;
        for (u32 c = 0; c < chunks; ++c) {
            const u64 ph = (u64)(first + c) * n_heads + h;
            const float w = expf(part_ml[ph * 2] - mx);
            o = fmaf(part_o[ph * head_dim + (e % head_dim)], w, o);
            l = fmaf(part_ml[ph * 2 + 1], w, l);
        }
        out[(u64)row * width + e] = o / l;
    }
}
