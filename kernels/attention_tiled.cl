/* Fused attention, tiled: what attention.cl computes (the same arguments, layouts, defines and
 * arithmetic, item for item), with the keys and values of a work-group's sample read from global
 * memory once per work-group instead of once per query.
 *
 * A, B, R, the scores (SCORE, SCALE, CW, USE_VECTOR), the masks (AMASK, QMASK, QMROW, VMASK, VMROW,
 * CAUSAL) and what a masked key's score becomes (MODE, LARGE_NEG): as in attention.cl's header;
 * the score and the online softmax step come from attention.clh, as attention.cl's do.
 *
 * A work-group is BQ items along the columns (the range is (h / VD) x w, as attention.cl's; the
 * entry pads R's columns to a multiple of BQ, so every work-group is whole): work-group g holds one
 * head and the query blocks g, g + G, ... (G work-groups along the columns) of the list of
 * (sample, block of BQ queries of that sample), item i the query i of the block. A block never
 * spans two samples, so its items share every key: the work-group loads the sample's keys and
 * values BK at a time into local memory, all items together (consecutive items read consecutive
 * rows of a key's column: one contiguous run in Keras's order), and each item runs the online
 * softmax of attention.cl over the tile for its own query, which it holds in registers with its
 * running maximum, sum and output accumulator. With TQ a multiple of BQ there are as many blocks as
 * work-groups (one each); else at most twice as many where TQ >= BQ (the entry's constraint: with
 * fewer queries than items most items would idle). Items past the sample's last query run the
 * block's first query and write nothing: every item takes one path between the barriers (PoCL 3.1
 * computed wrong values for the other items where the idle ones skipped the tile's loop; Oclgrind
 * computed them right). R's padding (rows past NH * VD, columns past n) is written as 0 by the item
 * whose global position it is, as attention.cl does.
 *
 * Defines besides attention.cl's: BQ the queries of a work-group (its items), BK the keys of a
 * tile; the entry bounds KD and VD by MAXD (each item keeps KD + VD floats in registers) and the
 * local memory (BK * (KD + VD + VMASK) floats; the values are the key tile where VROW is 0 and
 * KD == VD). reqd_work_group_size(1, BQ, 1). The runtime prepends MALINN_INDEX_A / _B / _R.
 * OpenCL C 1.2.
 */

#ifndef BQ
#define BQ 64
#endif
#ifndef BK
#define BK 32
#endif
#ifndef MAXD
#define MAXD 64
#endif

#if VROW == 0 && KD == VD
#define SHARED_TILE 1   /* the values are the keys: one tile serves both */
#else
#define SHARED_TILE 0
#endif

__kernel __attribute__((reqd_work_group_size(1, BQ, 1)))
void attention_tiled(uint m, uint n, uint h, uint w, uint H, uint W, uint l, uint c,
                     __global const float *a,
                     __global const float *b,
                     __global float *r,
                     __global const float *scale)
{
    __local float keys[BK * KD];
#if SHARED_TILE
    __local float *values = keys;
#else
    __local float values[BK * VD];
#endif
#if VMASK
    __local float kept[BK];
#endif
    const uint head = get_global_id(0);   /* one head per work-group: its local size is 1 */
    const uint item = get_local_id(1);
    const uint heads = get_global_size(0);
    const uint last = head + 1 == heads ? h : head * VD + VD;
    const uint place = get_global_id(1);
    if (head >= NH || place >= n) {   /* R's padding at this item's place */
        for (uint row = head * VD; row < last; ++row) {
            r[MALINN_INDEX_R(row, place, h, w)] = 0.0f;
        }
    }
    if (head >= NH) {   /* the whole work-group */
        return;
    }
    const uint per_sample = (TQ + BQ - 1) / BQ;
    const uint blocks = n / TQ * per_sample;
    for (uint block = get_group_id(1); block < blocks; block += get_num_groups(1)) {
        const uint s = block / per_sample;
        const uint t = (block - s * per_sample) * BQ + item;
        const bool active = t < TQ;
        const uint col = s * TQ + (active ? t : 0);
        float q[KD];
        float acc[VD];
        for (uint d = 0; d < KD; ++d) {
            q[d] = a[MALINN_INDEX_A(head * KD + d, col, H, W)];
        }
        for (uint d = 0; d < VD; ++d) {
            acc[d] = 0.0f;
        }
        float top = -FLT_MAX, total = 0.0f;   /* below every score (Keras 3's lowest is -0.7 FLT_MAX) */
        for (uint first = 0; first < TS; first += BK) {
            const uint count = min((uint)BK, (uint)TS - first);
            barrier(CLK_LOCAL_MEM_FENCE);   /* every item is done with the last tile */
            for (uint i = item; i < count * KD; i += BQ) {
                const uint j = i / KD;
                keys[i] = b[MALINN_INDEX_B(head * KD + (i - j * KD), s * TS + first + j, l, c)];
            }
#if !SHARED_TILE
            for (uint i = item; i < count * VD; i += BQ) {
                const uint j = i / VD;
                values[i] = b[MALINN_INDEX_B(VROW + head * VD + (i - j * VD), s * TS + first + j, l, c)];
            }
#endif
#if VMASK
            for (uint i = item; i < count; i += BQ) {
                kept[i] = b[MALINN_INDEX_B(VMROW, s * TS + first + i, l, c)];
            }
#endif
            barrier(CLK_LOCAL_MEM_FENCE);
            for (uint jj = 0; jj < count; ++jj) {   /* every item (an idle one on query 0): one path */
                const uint j = first + jj;
                float score = 0.0f;
                for (uint d = 0; d < KD; ++d) {
                    const float k = keys[jj * KD + d];
                    score += SCORE_TERM(q[d], k, d);
                }
                score = SCORED(score);
                float keep = 1.0f, given = 1.0f;
#if AMASK
                given = a[MALINN_INDEX_A(NH * KD + j, col, H, W)];
                keep = given != 0.0f ? 1.0f : 0.0f;
#endif
#if VMASK
                keep = kept[jj] != 0.0f ? keep : 0.0f;
#endif
#if QMASK == 2
                keep = a[MALINN_INDEX_A(QMROW, col, H, W)] != 0.0f ? keep : 0.0f;
#endif
#if CAUSAL
                keep = j <= t ? keep : 0.0f;
#endif
                const float weight = online_step(masked_score(score, keep, given), keep, &top, &total, acc);
                for (uint d = 0; d < VD; ++d) {
                    acc[d] += weight * values[jj * VD + d];
                }
            }
        }
        if (active) {
            float factor = 1.0f / total;
#if QMASK == 1
            factor = a[MALINN_INDEX_A(QMROW, col, H, W)] != 0.0f ? factor : 0.0f;
#endif
            for (uint d = 0; d < VD; ++d) {
                r[MALINN_INDEX_R(head * VD + d, col, h, w)] = acc[d] * factor;
            }
            for (uint row = head * VD + VD; row < last; ++row) {
                r[MALINN_INDEX_R(row, col, h, w)] = 0.0f;
            }
        }
    }
}
