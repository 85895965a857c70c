/* Register-blocked GEMM in Keras's memory order, for the batch products of inference on GPUs:
 * R = A x B with the fused epilogue of epilogue.clh (R = AFFINE(ACTIVATION(A x B + bias)), R's
 * padding written as 0).
 *
 * A is M x K column-major (a Dense kernel as Keras stores it, (inputs, units) row-major), B is K x N
 * column-major (the layer's input as Keras holds it, (batch, inputs) row-major) and R is M x N
 * column-major ((batch, units) row-major). In Keras's terms a work-group computes a TN x TM block of
 * the (batch, units) output: TN samples by TM units.
 *
 * Per K step of KT, the work-group stages KT rows of the weights (TM contiguous units each: coalesced
 * vector loads) and KT features of its TN samples in local memory; each item then accumulates RN
 * samples x RM units in registers, reading its units as float4s (RM / 4 of them, TM / RM * 4 floats
 * apart, so a warp's reads and its final stores are contiguous) and its samples as scalars (a
 * broadcast within the warp). The work-group's items are flat: item t has unit slot t % TPU and sample
 * slot t / TPU (TPU = TM / RM). Dimension 0 of the range runs along the samples' blocks, so the
 * work-groups that read the same weights run together and share them through the cache.
 *
 * A is H x W (H >= h, W >= l), B is l x w, R is h x w (padded shapes; the library's restrictions
 * make l a multiple of KT, h of TM and w of TN); m and n are R's logical rows and columns.
 *
 * Compile-time parameters (-D defines; the tuner picks them per device, see `malinn tune`):
 *   TM, TN   units and samples of R per work-group
 *   RM       units per item (a multiple of 4)
 *   RN       samples per item (any; TN is RN x the number of sample slots)
 *   KT       K step staged per iteration (4 times a power of two)
 *   PREFETCH 1: the next K step's tiles are loaded into registers while the current one is
 *            computed (global latency hidden behind the arithmetic); 0: load, then compute
 *   BUFFERS  local tiles: 1, or 2 (with PREFETCH: the next K step is stored into the other tile
 *            while some items still compute the current one, so one barrier per K step, not two)
 *   SLICES   work-groups along K per tile of R, a power of 2 (1: none). With SLICES > 1, a
 *            layer whose tiles alone would leave most of a large GPU idle (a batch of 100 has few
 *            tiles) has SLICES times more work-groups: each stores its partial sums in the scratch
 *            buffer and counts itself in its tile's counter (atomic_inc); the work-group that counts
 *            last adds the SLICES partial sums in slice order (the same order whichever finishes
 *            last: bit-identical results; its own slice from its registers), applies the epilogue,
 *            writes R and sets the counter back to 0. Partial sums are written and read with
 *            atomic_xchg (no data race), item-major within each result, so that a warp's 32
 *            exchanges of one result touch 128 consecutive bytes (on the H100, exchanges scattered
 *            over the tile cost 10-15% of a 4096 x 3072 x 100 product: gemm_keras_sweep4/5). The scratch
 *            (uint): (h / TM) * (w / TN) counters, 0 before a launch (every launch leaves them 0),
 *            then SLICES * h * w floats (library.json "scratch_bytes"; the runtime clears it once).
 *   BIAS, ACTIVATION, AFFINE  the fused epilogue (epilogue.clh)
 *   WEIGHT_BITS, HALF_ARITHMETIC  the precision of A and of the sums (weights.clh)
 * OpenCL C 1.2.
 */

#ifndef TM
#define TM 128
#endif
#ifndef TN
#define TN 16
#endif
#ifndef RM
#define RM 8
#endif
#ifndef RN
#define RN 4
#endif
#ifndef KT
#define KT 16
#endif
#ifndef PREFETCH
#define PREFETCH 1
#endif
#ifndef SLICES
#define SLICES 1
#endif
#ifndef BUFFERS
#define BUFFERS 1
#endif

#define TPU (TM / RM)            /* unit slots of a work-group */
#define TPB (TN / RN)            /* sample slots */
#define THREADS (TPU * TPB)
#define VM (RM / 4)              /* float4s of units per item */
#define WLOADS ((KT * TM / 4 + THREADS - 1) / THREADS)   /* float4s of weights per item and K step */
#define XLOADS ((TN * KT / 4 + THREADS - 1) / THREADS)   /* float4s of inputs per item and K step */

/* Vector e of a K step's weight tile (KT rows of TM units, TM / 4 vectors a row) and of its input
 * tile (TN samples of KT features, KT / 4 vectors a sample: consecutive items read consecutive
 * vectors of one sample; no division by TN, which need not be a power of two). */
#define W_AT(k0, e) ((size_t)((k0) + (e) / (TM / 4)) * H + m0 + 4 * ((e) % (TM / 4)))
#define W_LOCAL(e) (((e) / (TM / 4)) * TM + 4 * ((e) % (TM / 4)))
#define X_AT(k0, e) ((size_t)(n0 + (e) / (KT / 4)) * l + (k0) + 4 * ((e) % (KT / 4)))
/* where result (j, i) of an item lies in a tile's partial sums (TN samples x TM units) */
/* where an item's result (j, i) lies in its slice's partial sums: item-major within each result, so
 * a warp's exchange of one result covers consecutive words (the tile's work-groups share the map) */
#define PART_AT(j, i) (((j) * RM + (i)) * THREADS + t)
#define STORE_X(v, e) do { \
        const uint s_ = (e) / (KT / 4), k_ = 4 * ((e) % (KT / 4)); \
        xl[(k_ + 0) * TN + s_] = TO_ACC((v).s0); \
        xl[(k_ + 1) * TN + s_] = TO_ACC((v).s1); \
        xl[(k_ + 2) * TN + s_] = TO_ACC((v).s2); \
        xl[(k_ + 3) * TN + s_] = TO_ACC((v).s3); \
    } while (0)

__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void gemm_keras(MATMUL_SCALARS,
                __global const WEIGHT *a,
                __global const float *b,
                __global float *r,
                EPILOGUE_BUFFERS,
                __global uint *scratch
                R_VIEW_ARGS)
{
    const uint t = get_local_id(0);
    const uint tu = t % TPU;
    const uint tb = t / TPU;
    const uint n0 = get_group_id(0) * TN;
    const uint tile_m = get_group_id(1) / SLICES;
    const uint slice = get_group_id(1) % SLICES;
    const uint m0 = tile_m * TM;
    /* this work-group's slice of K: whole K steps, the last slices shorter (or empty) */
    const uint chunk = (l / KT + SLICES - 1) / SLICES * KT;
    const uint kbegin = min(l, slice * chunk);
    const uint kend = min(l, kbegin + chunk);

    __local acc_t wtiles[BUFFERS * KT * TM];   /* wl[kk * TM + unit] */
    __local acc_t xtiles[BUFFERS * KT * TN];   /* xl[kk * TN + sample] */
    __local acc_t *wl = wtiles;
    __local acc_t *xl = xtiles;

    acc_t acc[RN][RM];
    #pragma unroll
    for (uint j = 0; j < RN; ++j)
        #pragma unroll
        for (uint i = 0; i < RM; ++i)
            acc[j][i] = ACC_ZERO;

#if PREFETCH
    /* the next K step's share of this item, held in registers while the current one is computed */
    acc4_t wr[WLOADS];
    float4 xr[XLOADS];
    #pragma unroll
    for (uint q = 0; q < WLOADS; ++q)
        if (kbegin < kend && t + q * THREADS < KT * TM / 4)
            wr[q] = LOAD_W4(0, a + W_AT(kbegin, t + q * THREADS));
    #pragma unroll
    for (uint q = 0; q < XLOADS; ++q)
        if (kbegin < kend && t + q * THREADS < TN * KT / 4)
            xr[q] = vload4(0, b + X_AT(kbegin, t + q * THREADS));
#endif
    for (uint k0 = kbegin; k0 < kend; k0 += KT) {
#if BUFFERS == 2
        wl = wtiles + ((k0 - kbegin) / KT % 2) * (KT * TM);
        xl = xtiles + ((k0 - kbegin) / KT % 2) * (KT * TN);
#endif
#if PREFETCH
        #pragma unroll
        for (uint q = 0; q < WLOADS; ++q)
            if (t + q * THREADS < KT * TM / 4)
                vstore4(wr[q], 0, wl + W_LOCAL(t + q * THREADS));
        #pragma unroll
        for (uint q = 0; q < XLOADS; ++q)
            if (t + q * THREADS < TN * KT / 4)
                STORE_X(xr[q], t + q * THREADS);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (k0 + KT < kend) {
            #pragma unroll
            for (uint q = 0; q < WLOADS; ++q)
                if (t + q * THREADS < KT * TM / 4)
                    wr[q] = LOAD_W4(0, a + W_AT(k0 + KT, t + q * THREADS));
            #pragma unroll
            for (uint q = 0; q < XLOADS; ++q)
                if (t + q * THREADS < TN * KT / 4)
                    xr[q] = vload4(0, b + X_AT(k0 + KT, t + q * THREADS));
        }
#else
        for (uint e = t; e < KT * TM / 4; e += THREADS)
            vstore4(LOAD_W4(0, a + W_AT(k0, e)), 0, wl + W_LOCAL(e));
        for (uint e = t; e < TN * KT / 4; e += THREADS)
            STORE_X(vload4(0, b + X_AT(k0, e)), e);
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
        #pragma unroll
        for (uint kk = 0; kk < KT; ++kk) {
            acc_t wv[RM], xv[RN];
            #pragma unroll
            for (uint c = 0; c < VM; ++c) {
                const acc4_t q = vload4(0, wl + kk * TM + 4 * (tu + c * TPU));
                wv[4 * c + 0] = q.s0;
                wv[4 * c + 1] = q.s1;
                wv[4 * c + 2] = q.s2;
                wv[4 * c + 3] = q.s3;
            }
#if RN % 4 == 0 && TN % 4 == 0
            #pragma unroll
            for (uint c = 0; c < RN / 4; ++c) {
                const acc4_t q = vload4(0, xl + kk * TN + tb * RN + 4 * c);
                xv[4 * c + 0] = q.s0;
                xv[4 * c + 1] = q.s1;
                xv[4 * c + 2] = q.s2;
                xv[4 * c + 3] = q.s3;
            }
#else
            #pragma unroll
            for (uint j = 0; j < RN; ++j)
                xv[j] = xl[kk * TN + tb * RN + j];
#endif
            #pragma unroll
            for (uint j = 0; j < RN; ++j)
                #pragma unroll
                for (uint i = 0; i < RM; ++i)
                    acc[j][i] += xv[j] * wv[i];
        }
#if BUFFERS == 1 || !PREFETCH
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
    }

#if SLICES > 1
    /* this slice's partial sums into the scratch buffer; the tile's last work-group adds them */
    __local uint last;
    const uint g = tile_m * (w / TN) + get_group_id(0);
    volatile __global uint *counter = scratch + g;
    volatile __global float *partial = (volatile __global float *)(scratch + (h / TM) * (w / TN))
                                       + (size_t)g * SLICES * TM * TN;
    #pragma unroll
    for (uint j = 0; j < RN; ++j)
        #pragma unroll
        for (uint i = 0; i < RM; ++i)
            atomic_xchg(partial + slice * TM * TN + PART_AT(j, i), (float)acc[j][i]);
    DEVICE_FENCE();
    barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
    if (t == 0)
        last = atomic_inc(counter) == SLICES - 1;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (!last)
        return;
    DEVICE_FENCE();
    /* the slices in slice order; this work-group's own from its registers (the same value) */
    float sum[RN][RM];
    for (uint q = 0; q < SLICES; ++q)
        #pragma unroll
        for (uint j = 0; j < RN; ++j)
            #pragma unroll
            for (uint i = 0; i < RM; ++i) {
                const float v = q == slice ? (float)acc[j][i]
                                           : atomic_xchg(partial + q * TM * TN + PART_AT(j, i), 0.0f);
                sum[j][i] = q == 0 ? v : sum[j][i] + v;
            }
    if (t == 0)
        atomic_xchg(counter, 0u);
#else
#define sum acc
#endif

    #pragma unroll
    for (uint j = 0; j < RN; ++j) {
        const uint col = n0 + tb * RN + j;
        #pragma unroll
        for (uint c = 0; c < VM; ++c) {
            const uint row = m0 + 4 * (tu + c * TPU);
            float4 v;
            v.s0 = EPILOGUE(sum[j][4 * c + 0], row + 0, col);
            v.s1 = EPILOGUE(sum[j][4 * c + 1], row + 1, col);
            v.s2 = EPILOGUE(sum[j][4 * c + 2], row + 2, col);
            v.s3 = EPILOGUE(sum[j][4 * c + 3], row + 3, col);
            vstore4(v, 0, &R_AT(row, col));
        }
    }
}
