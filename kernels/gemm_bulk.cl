/* Two-level tiled GEMM for large batches (scoring a data set: hundreds to thousands of samples) on
 * GPUs, in Keras's memory order: R = A x B with the fused epilogue of epilogue.clh
 * (R = AFFINE(ACTIVATION(A x B + bias)), R's padding written as 0).
 *
 * A is M x K column-major (a Dense kernel as Keras stores it, (inputs, units) row-major), B is K x N
 * column-major (the layer's input, (batch, inputs) row-major) and R is M x N column-major ((batch,
 * units) row-major): gemm_keras's operands and arguments, so the plan may run either on the same
 * buffers. A is H x W (H >= h, W >= l), B is l x w, R is h x w (padded shapes; the library's
 * restrictions make l a multiple of KT, h of TM and w of TN); m and n are R's logical rows and
 * columns.
 *
 * A work-group computes a TM x TN tile of R (TM units by TN samples) with MDIM x NDIM items
 * (MDIM = TM / RM along the units, NDIM = TN / RN along the samples; item t is (t % MDIM, t / MDIM)),
 * each RM x RN results in registers. Per K step of KT:
 *   - the weights' tile (KT rows of TM contiguous units) is read with float4 loads, consecutive
 *     items reading consecutive vectors of a row, and stored in local memory as read (wl[kk][unit]);
 *   - the inputs' tile (TN samples of KT contiguous features) is read in blocks of 4 samples x 4
 *     features, an item loading the 4 samples' float4s (consecutive items: consecutive vectors of a
 *     sample), transposed in registers and stored as 4 float4s of samples (xl[kk][sample]). Where TN
 *     is a multiple of 32, the float4 groups of the rows of each 4-feature quad are XOR-permuted
 *     (SWZ below), so the 8 items of a quarter warp store to 8 distinct groups of 4 banks;
 *   - each item reads, per k, RM / 4 float4s of units and RN / 4 float4s of samples from local
 *     memory and adds RM x RN products. Its units are 4 * (tu + c * MDIM) + 0..3 and its samples
 *     4 * (tn + d * NDIM) + 0..3: the items of a warp read distinct or identical vectors of one row
 *     (no bank conflicts), and store R (column-major) in runs of MDIM float4s per sample.
 * With BUFFERS 2 the next step's tiles, loaded into registers before the current step is
 * computed, are stored into the other local tile: one barrier per K step.
 *
 * Compile-time parameters (-D defines; benchmarks/gemm.py --sweep gemm_bulk times them):
 *   TM, TN   units and samples of R per work-group (multiples of 4 * MDIM and 4 * NDIM)
 *   RM, RN   units and samples per item, multiples of 4 (RM x RN sums in registers)
 *   KT       K step staged in local memory per iteration, a multiple of 4
 *   BUFFERS  local tiles: 1 (two barriers per K step) or 2 (one)
 *   GROUP    0: work-groups run along the samples' tiles of one row of tiles, then the next row;
 *            G > 1: in bands of G rows of tiles, down a column of the band before the next column,
 *            so that the work-groups in flight share G weight panels and fewer input panels in the
 *            cache (the order of dimension 0, then 1, of the range)
 *   SLICES   work-groups along K per tile of R, a power of 2 (1: none): a product with too few tiles
 *            for the compute units (1024 x 1024 in 128 x 128 tiles is 64 work-groups) gets SLICES
 *            times more. Each work-group stores its partial sums in the scratch buffer (atomic_xchg,
 *            item-major within each result: a warp's exchange of one result is 128 consecutive
 *            bytes) and counts itself in its tile's counter (atomic_inc); the one that counts last
 *            adds the SLICES partial sums in slice order (bit-identical results, whichever finishes
 *            last), applies the epilogue, writes R and sets the counter back to 0. The scratch
 *            (uint): (h / TM) * (w / TN) counters, 0 before a launch and after it, then
 *            SLICES * h * w floats (library.json "scratch_bytes").
 *   BIAS, ACTIVATION, AFFINE  the fused epilogue (epilogue.clh)
 *   WEIGHT_BITS, HALF_ARITHMETIC  the precision of A and of the sums (weights.clh)
 * OpenCL C 1.2.
 */

#ifndef TM
#define TM 128
#endif
#ifndef TN
#define TN 128
#endif
#ifndef RM
#define RM 8
#endif
#ifndef RN
#define RN 8
#endif
#ifndef KT
#define KT 16
#endif
#ifndef BUFFERS
#define BUFFERS 2
#endif
#ifndef GROUP
#define GROUP 0
#endif
#ifndef SLICES
#define SLICES 1
#endif

#define MDIM (TM / RM)                       /* items along the units */
#define NDIM (TN / RN)                       /* items along the samples */
#define THREADS (MDIM * NDIM)
#define KQ (KT / 4)                          /* 4-feature quads per K step */
#define A_VECS (KT * TM / 4)                 /* float4s of weights per K step */
#define B_BLOCKS (KQ * (TN / 4))             /* 4 x 4 blocks of inputs per K step */
#define A_PER ((A_VECS + THREADS - 1) / THREADS)
#define B_PER ((B_BLOCKS + THREADS - 1) / THREADS)
#define A_MINE(q) (A_VECS % THREADS == 0 || t + (q) * THREADS < A_VECS)
#define B_MINE(q) (B_BLOCKS % THREADS == 0 || t + (q) * THREADS < B_BLOCKS)

/* the XOR applied to the float4 group of a sample in the local rows of feature quad kq: 8 items of
 * a quarter warp storing one row (KQ consecutive quads by 8 / KQ groups, or 8 quads of one group)
 * land in 8 distinct groups of banks; the groups stay in their run of 8, hence TN % 32 == 0 */
#if TN % 32 == 0
#if KQ >= 8
#define SWZ(kq) ((kq) % 8)
#else
#define SWZ(kq) (((kq) * (8 / KQ)) % 8)
#endif
#else
#define SWZ(kq) 0
#endif

/* where an item's result (j, i) lies in its slice's partial sums (item-major within each result) */
#define PART_AT(j, i) (((j) * RM + (i)) * THREADS + t)

/* 4 weights at p as acc4_t, and 4 inputs at p: one aligned vector load where the type allows (a
 * vload4 may only assume the element's alignment, and NVIDIA's compiler can make it 4 loads).
 * Every vector starts at a multiple of 4 elements from a column's start, and H and l are
 * multiples of 4, so it is aligned to its size. */
#if WEIGHT_BITS == 32
#define A_LOAD4(p) (*(__global const float4 *)(p))
#elif WEIGHT_BITS == 16 && HALF_ARITHMETIC
#define A_LOAD4(p) (*(__global const half4 *)(p))
#else
#define A_LOAD4(p) LOAD_W4(0, (p))
#endif
#define B_LOAD4(p) (*(__global const float4 *)(p))

__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void gemm_bulk(MATMUL_SCALARS,
               __global const WEIGHT *a,
               __global const float *b,
               __global float *r,
               EPILOGUE_BUFFERS,
               __global uint *scratch
               R_VIEW_ARGS)
{
    const uint t = get_local_id(0);
    const uint tu = t % MDIM;
    const uint tn = t / MDIM;
    uint tile_n = get_group_id(0);
    uint tile_m = get_group_id(1) / SLICES;
    const uint slice = get_group_id(1) % SLICES;
#if GROUP > 1
    {
        const uint nt = w / TN, mt = h / TM;
        const uint lin = tile_m * nt + tile_n;
        const uint first = lin / (GROUP * nt) * GROUP;      /* the band's first row of tiles */
        const uint rows = min((uint)GROUP, mt - first);     /* the last band may be shorter */
        const uint idx = lin - first * nt;
        tile_n = idx / rows;
        tile_m = first + (idx - tile_n * rows);   /* not idx % rows: LLVM pairs the division and
                                                    * the remainder through `freeze`, which
                                                    * Oclgrind cannot run */
    }
#endif
    const uint m0 = tile_m * TM;
    const uint n0 = tile_n * TN;
    /* this work-group's K steps: whole steps, the last slices shorter (or empty) */
    const uint steps = l / KT;
    const uint per = (steps + SLICES - 1) / SLICES;
    const uint sbegin = min(steps, slice * per);
    const uint send = min(steps, sbegin + per);

    /* in vectors of 4 (aligned: every local access is one vector load or store) */
    __local acc4_t wtiles[BUFFERS * KT * TM / 4];   /* wl[kk * TM / 4 + unit / 4] */
    __local acc4_t xtiles[BUFFERS * KT * TN / 4];   /* xl[kk * TN / 4 + sample / 4], permuted by SWZ */
    __local acc4_t *wl = wtiles;
    __local acc4_t *xl = xtiles;

    /* this item's share of a K step: weight vector e = t + q * THREADS (row e / (TM / 4), units
     * 4 * (e % (TM / 4))) and input block e (quad e % KQ of samples 4 * (e / KQ) + 0..3), as offsets
     * from the step's first weight and first input */
    uint a_off[A_PER], b_off[B_PER];
    #pragma unroll
    for (uint q = 0; q < A_PER; ++q) {
        const uint e = t + q * THREADS;
        a_off[q] = e / (TM / 4) * H + 4 * (e % (TM / 4));
    }
    #pragma unroll
    for (uint q = 0; q < B_PER; ++q) {
        const uint e = t + q * THREADS;
        b_off[q] = 4 * (e / KQ) * l + 4 * (e % KQ);
    }
    __global const WEIGHT *a_tile = a + (size_t)sbegin * KT * H + m0;
    __global const float *b_tile = b + (size_t)n0 * l + sbegin * KT;

    acc_t acc[RN][RM];
    #pragma unroll
    for (uint j = 0; j < RN; ++j)
        #pragma unroll
        for (uint i = 0; i < RM; ++i)
            acc[j][i] = ACC_ZERO;

    /* the next K step, held in registers while the current one is computed (LOAD_STEP's loops
     * have constant trip counts: unrolled, ar and br stay in registers) */
    acc4_t ar[A_PER];
    float4 br[B_PER][4];
#define LOAD_STEP() do { \
        for (uint q = 0; q < A_PER; ++q) \
            if (A_MINE(q)) \
                ar[q] = A_LOAD4(a_tile + a_off[q]); \
        for (uint q = 0; q < B_PER; ++q) \
            if (B_MINE(q)) { \
                for (uint s_ = 0; s_ < 4; ++s_) \
                    br[q][s_] = B_LOAD4(b_tile + b_off[q] + s_ * l); \
            } \
    } while (0)
    if (sbegin < send)
        LOAD_STEP();

    for (uint s = sbegin; s < send; ++s) {
#if BUFFERS == 2
        wl = wtiles + ((s - sbegin) % 2) * (KT * TM / 4);
        xl = xtiles + ((s - sbegin) % 2) * (KT * TN / 4);
#endif
        #pragma unroll
        for (uint q = 0; q < A_PER; ++q)
            if (A_MINE(q))
                wl[t + q * THREADS] = ar[q];   /* as read: vector e is row e / (TM / 4) */
        #pragma unroll
        for (uint q = 0; q < B_PER; ++q)
            if (B_MINE(q)) {
                const uint e = t + q * THREADS, kq = e % KQ, g = (e / KQ) ^ SWZ(kq);
                __local acc4_t *row = xl + kq * TN + g;   /* row 4 * kq, vector g */
                /* the 4 x 4 block transposed: c[4 * i + s] is feature 4 * kq + i of sample s (a
                 * private array, then vload4: Oclgrind's uninitialised-value check crashes on the
                 * shuffles that a float4 built from components of other float4s compiles to) */
                float c[16];
                #pragma unroll
                for (uint s_ = 0; s_ < 4; ++s_) {
                    c[s_] = br[q][s_].s0;
                    c[4 + s_] = br[q][s_].s1;
                    c[8 + s_] = br[q][s_].s2;
                    c[12 + s_] = br[q][s_].s3;
                }
                #pragma unroll
                for (uint i_ = 0; i_ < 4; ++i_)
                    row[i_ * TN / 4] = TO_ACC4(vload4(i_, c));
            }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (s + 1 < send) {
            a_tile += (size_t)KT * H;
            b_tile += KT;
            LOAD_STEP();
        }
        #pragma unroll
        for (uint kq = 0; kq < KQ; ++kq) {
            #pragma unroll
            for (uint i4 = 0; i4 < 4; ++i4) {
                const uint kk = 4 * kq + i4;
                acc_t wv[RM], xv[RN];
                #pragma unroll
                for (uint c = 0; c < RM / 4; ++c) {
                    const acc4_t v = wl[kk * TM / 4 + tu + c * MDIM];
                    wv[4 * c + 0] = v.s0;
                    wv[4 * c + 1] = v.s1;
                    wv[4 * c + 2] = v.s2;
                    wv[4 * c + 3] = v.s3;
                }
                #pragma unroll
                for (uint d = 0; d < RN / 4; ++d) {
                    const acc4_t v = xl[kk * TN / 4 + ((tn + d * NDIM) ^ SWZ(kq))];
                    xv[4 * d + 0] = v.s0;
                    xv[4 * d + 1] = v.s1;
                    xv[4 * d + 2] = v.s2;
                    xv[4 * d + 3] = v.s3;
                }
                #pragma unroll
                for (uint j = 0; j < RN; ++j)
                    #pragma unroll
                    for (uint i = 0; i < RM; ++i)
                        acc[j][i] += xv[j] * wv[i];
            }
        }
#if BUFFERS == 1
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
    }
#undef LOAD_STEP

#if SLICES > 1
    /* this slice's partial sums into the scratch buffer; the tile's last work-group adds them */
    const uint g = tile_m * (w / TN) + tile_n;
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
    /* whether this work-group counted last, in the first word of the weights' tiles (free now:
     * the barrier above follows every item's last read of them) */
    if (t == 0)
        wtiles[0] = atomic_inc(counter) == SLICES - 1 ? (acc4_t)((acc_t)1) : (acc4_t)(ACC_ZERO);
    barrier(CLK_LOCAL_MEM_FENCE);
    if (wtiles[0].s0 == ACC_ZERO)
        return;
    DEVICE_FENCE();
    float sum[RN][RM];
    for (uint q = 0; q < SLICES; ++q)
        #pragma unroll
        for (uint j = 0; j < RN; ++j)
            #pragma unroll
            for (uint i = 0; i < RM; ++i) {
                /* its own slice from its registers (the same value), the others' from the scratch */
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
        const uint col = n0 + 4 * (tn + j / 4 * NDIM) + j % 4;
        #pragma unroll
        for (uint c = 0; c < RM / 4; ++c) {
            const uint row = m0 + 4 * (tu + c * MDIM);
            float4 v;
            v.s0 = EPILOGUE(sum[j][4 * c + 0], row + 0, col);
            v.s1 = EPILOGUE(sum[j][4 * c + 1], row + 1, col);
            v.s2 = EPILOGUE(sum[j][4 * c + 2], row + 2, col);
            v.s3 = EPILOGUE(sum[j][4 * c + 3], row + 3, col);
            vstore4(v, 0, &R_AT(row, col));
        }
    }
}
