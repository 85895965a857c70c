/* Matrix times a few vectors, R = A x B for small batches (a Dense layer at batch 1..8), with K
 * split ACROSS work-groups, so that even a layer with few rows keeps enough loads in flight to read
 * its weights at memory bandwidth on a large GPU; the fused epilogue of epilogue.clh.
 *
 * A is M x K column-major (Keras's kernel (K, units) row-major: the layout gemm_tiled and gemv
 * read, so one weight buffer serves them all), read with stride H, in columns < l and in the vectors
 * that hold a logical row only (any padding with H >= m rounded up to VW and W >= l serves:
 * "logicalRows"). B is K x N and R is M x N, row-major (KERAS_ORDER 0) or column-major
 * (KERAS_ORDER 1, the gemv_split_c entry), as in gemv.cl.
 *
 *   work-group  MDIM x KSPLIT items; it computes ROWS = MDIM * VW rows by NB columns of R over one
 *               of SLICES slices of K (slice s: k in [s * chunk, (s + 1) * chunk), chunk = l / SLICES
 *               rounded up)
 *   item (tm, tk)  VW rows: VW / VL vectors of VL rows each (VL = 16 bytes of weights: 4 floats,
 *               8 halves, 16 chars, or VW where VW is smaller), vector p at work-group row
 *               (p * MDIM + tm) * VL, so that the consecutive items of a warp read one contiguous
 *               run of a column per load; per step U columns of A (every load of the step issued
 *               before the first is used), columns tk * U, tk * U + KSPLIT * U, ... of the slice:
 *               U = COLS where given, else UNROLL * 32 / WEIGHT_BITS (the same VW then moves the
 *               same bytes per item and step in every precision, in narrower loads)
 *   then the KSPLIT partial sums of each result are added in local memory in a fixed tree, and
 *   SLICES == 1: the epilogue writes R (its padding as 0);
 *   SLICES > 1: the work-group stores its ROWS x NB partial sums in the scratch buffer and counts
 *               itself in its tile's counter (atomic_inc); the work-group that counts last adds
 *               the SLICES partial sums of each result in slice order 0, 1, ... (the same order
 *               whichever group finishes last: bit-identical results on every run), writes R through
 *               the epilogue and sets the counter back to 0 for the next launch. Partial sums are
 *               written and read with atomic_xchg (no data race for the memory model or Oclgrind).
 *
 * scratch (uint): tiles = (h / ROWS) * (w / NB) counters, all 0 before a launch (the runtime
 * clears the buffer once; every launch leaves them 0), then SLICES * h * w floats of partial sums,
 * tile g's slice s at tiles + (g * SLICES + s) * ROWS * NB ("scratch_bytes" in library.json).
 *
 * HEAD 1 (gemv_split_c_head): a small Dense layer after this one (a classifier head of HEAD_UNITS
 * units reading R) runs in the same launch, and R is never written to memory. The work-group that
 * holds a row tile's final values (its last, with SLICES > 1) keeps them in local memory, multiplies
 * them by the head's weights of those ROWS inputs (an item per row, the rows then added in a fixed
 * tree in local memory) (the buffer head: HEAD_UNITS x H column-major
 * with stride HEAD_STRIDE, in the weights' precision, HEAD_COLS columns padded, int8 scales after
 * them as for A) and stores the HEAD_UNITS x NB partial sums in scratch, then counts itself in its
 * column block's head counter; the work-group that counts last adds the h / ROWS tiles' partial
 * sums, ROWS tiles at a time in a fixed tree, the chunks in tile order (bit-identical results), adds head_bias (HEAD_BIAS), applies HEAD_ACTIVATION
 * or, with HEAD_SOFTMAX, a softmax over the HEAD_UNITS units of each sample, writes the head's
 * output r (column-major; its padding as 0) and sets the counter back to 0. The arguments h and m
 * are then the head's output rows (padded, logical); the first layer's are H and HEAD_INPUTS
 * (compile-time), and the scratch holds, after the layer's, w / NB head counters and (h / ROWS) * HEAD_UNITS * w
 * floats of head partial sums.
 *
 * The global range is (h / VW) x (w / NB * KSPLIT * SLICES) (library.json: "ndrange", "scale",
 * "split"); h is a multiple of ROWS and w of NB.
 *
 * Compile-time parameters (-D defines; candidates in kernels/library.json):
 *   VW      rows per item (1, 2, 4, 8 or 16)
 *   MDIM    items along M per work-group
 *   KSPLIT  items along K per work-group, a power of 2
 *   SLICES  work-groups along K per block of results, a power of 2 (1: no scratch)
 *   UNROLL  columns of A per item per step for 32-bit weights (x2 for half, x4 for char), where
 *           COLS is 0
 *   COLS    columns of A per item per step in any precision (0: from UNROLL). The reduced
 *           precisions' defaults (kernels/library.json) read 16 bytes of rows per load (VW 8
 *           halves, 16 chars) with COLS 2: the 32 bytes per item and step of fp32's VW 4 UNROLL 2,
 *           in two 16-byte loads; more SLICES or KSPLIT keep fp32's number of items
 *           ((m / VW) * KSPLIT * SLICES), hence its bytes in flight
 *   NB      columns of B (samples) per work-group
 *   WIDE    1: each vector of A read as one aligned load of its vector type (float4, char16, ushort8
 *           converted with vload_half8 in registers: one 16-byte load where a vloadN, which may only
 *           assume the element's alignment, can become N loads); 0: vloadN (LOAD_Wn of weights.clh).
 *           A vector starts at a multiple of VL elements from a column's start and H is a multiple
 *           of VW, so it is aligned to its size.
 *   INT8_BIAS  1 (int8 weights, WIDE 1, VW > 1): each byte converted to float through the
 *           exponent bias (its sign bit flipped, zero-extended into the mantissa of 2^23, less
 *           2^23 + 128: exact) with integer operations and one add, where convert_floatN issues
 *           type conversions (on NVIDIA GPUs a quarter of the float rate); the same values
 *   BIAS, ACTIVATION, AFFINE  the fused epilogue (epilogue.clh)
 *   WEIGHT_BITS, HALF_ARITHMETIC  the precision of A and of the sums (weights.clh)
 * OpenCL C 1.2.
 */

#ifndef VW
#define VW 4
#endif
#ifndef MDIM
#define MDIM 64
#endif
#ifndef KSPLIT
#define KSPLIT 4
#endif
#ifndef SLICES
#define SLICES 8
#endif
#ifndef UNROLL
#define UNROLL 4
#endif
#ifndef NB
#define NB 1
#endif
#ifndef WIDE
#define WIDE 1
#endif
#ifndef COLS
#define COLS 0
#endif
#ifndef INT8_BIAS
#define INT8_BIAS 0
#endif
#ifndef HEAD
#define HEAD 0
#endif
#ifndef HEAD_UNITS
#define HEAD_UNITS 64
#endif
#ifndef HEAD_BIAS
#define HEAD_BIAS 0
#endif
#ifndef HEAD_ACTIVATION
#define HEAD_ACTIVATION act_linear
#endif
#ifndef HEAD_SOFTMAX
#define HEAD_SOFTMAX 0
#endif
/* the head's weights' padded rows and columns and the first layer's logical rows (0: none given,
 * then HEAD_UNITS, the first layer's padded rows and those again; the runtime gives all three) */
#ifndef HEAD_STRIDE
#define HEAD_STRIDE 0
#endif
#ifndef HEAD_COLS
#define HEAD_COLS 0
#endif
#ifndef HEAD_INPUTS
#define HEAD_INPUTS 0
#endif
#if HEAD_STRIDE > 0
#define HEAD_LDA HEAD_STRIDE
#else
#define HEAD_LDA HEAD_UNITS
#endif
#if HEAD_COLS > 0
#define HEAD_NA HEAD_COLS
#else
#define HEAD_NA H
#endif
#if HEAD_INPUTS > 0
#define HEAD_M HEAD_INPUTS
#else
#define HEAD_M H
#endif

#define ROWS (MDIM * VW)          /* rows of R per work-group */
#define OUTS (ROWS * NB)          /* results per work-group */
#define THREADS (MDIM * KSPLIT)
#if COLS > 0                      /* U: columns of A per item per step */
#define U COLS
#else
#define U (UNROLL * 32 / WEIGHT_BITS)
#endif

#if VW * WEIGHT_BITS > 128        /* VL: rows per load, at most 16 bytes (a literal: pasted into type names) */
#if WEIGHT_BITS == 32
#define VL 4
#elif WEIGHT_BITS == 16
#define VL 8
#else
#define VL 16
#endif
#else
#define VL VW
#endif
#define NV (VW / VL)              /* loads per item and column */
#if SLICES < 32                   /* partial sums the last work-group's items read at once */
#define TAIL SLICES
#else
#define TAIL 32
#endif

#if VL == 16
typedef acc16_t accv;
#define LOAD_A LOAD_W16
#define TO_FLOATV convert_float16
#define VSTORE vstore16
#elif VL == 8
typedef acc8_t accv;
#define LOAD_A LOAD_W8
#define TO_FLOATV convert_float8
#define VSTORE vstore8
#elif VL == 4
typedef acc4_t accv;
#define LOAD_A LOAD_W4
#define TO_FLOATV convert_float4
#define VSTORE vstore4
#elif VL == 2
typedef acc2_t accv;
#define LOAD_A LOAD_W2
#define TO_FLOATV convert_float2
#define VSTORE vstore2
#else
typedef acc_t accv;
#define LOAD_A LOAD_W
#define TO_FLOATV convert_float
#define VSTORE(v, o, p) ((p)[o] = (v))
#endif

#if HEAD
#define HEAD_W(row, j) ((float)LOAD_W((size_t)(row) * HEAD_LDA + (j), head))
#if WEIGHT_BITS == 8
#define HEAD_SCALE(j) \
    (((__global const float *)((__global const char *)head + ((size_t)HEAD_LDA * HEAD_NA + 3) / 4 * 4))[j])
#else
#define HEAD_SCALE(j) 1.0f
#endif
/* a row tile's final value e (column e / ROWS, row e % ROWS): kept in local memory for the head */
#define STORE_R(e, row, col, v) (part[e] = EPILOGUE(v, row, col))
#define HEAD_ARGS , __global const WEIGHT *head, __global const float *head_bias
/* h and m name the head's output here (R's padded and logical rows): the first layer's are H and
 * HEAD_INPUTS, taken as h and m inside the kernel */
#define GEMV_SCALARS uint l, uint head_h, uint w, uint head_m, uint n, uint H, uint W, \
                     float p0, float p1, float p2, float p3
#else
#define GEMV_SCALARS MATMUL_SCALARS
#define STORE_R(e, row, col, v) (R_AT(row, col) = EPILOGUE(v, row, col))
#define HEAD_ARGS
#endif

#if HEAD
#define HEAD_WIDTH (HEAD_UNITS * NB)
/* the first len rows of HEAD_WIDTH values at x added pairwise in a fixed tree (row i += row i +
 * top, top = len / 2 rounded up, until one row is left): the sums end in row 0; every item of
 * the work-group calls it */
void head_tree(__local float *x, uint len, uint t)
{
    while (len > 1) {
        const uint top = (len + 1) / 2;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (uint i = t; i < (len - top) * HEAD_WIDTH; i += MDIM * KSPLIT)
            x[i] += x[i + top * HEAD_WIDTH];
        len = top;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}
#endif

#define CAT_(x, y) x##y
#define CAT(x, y) CAT_(x, y)
#if WIDE && VL > 1                /* LOAD_V(p): the VL weights at p (aligned to VL elements), as accv */
#if WEIGHT_BITS == 32
#define LOAD_V(p) (*(__global const CAT(float, VL) *)(p))
#elif WEIGHT_BITS == 16 && HALF_ARITHMETIC
#define LOAD_V(p) (*(__global const CAT(half, VL) *)(p))
#elif WEIGHT_BITS == 16
CAT(float, VL) load_half_wide(__global const half *p)
{
    const CAT(ushort, VL) bits = *(__global const CAT(ushort, VL) *)p;
    return CAT(vload_half, VL)(0, (const __private half *)&bits);
}
#define LOAD_V(p) load_half_wide(p)
#elif INT8_BIAS
/* each byte c read as unsigned with its sign bit flipped (c + 128, 0..255), zero-extended into the
 * mantissa of 2^23, less 2^23 + 128: the signed value c, exactly */
#define LOAD_V(p) (CAT(as_float, VL)(CAT(convert_uint, VL)(*(__global const CAT(uchar, VL) *)(p) ^ (uchar)0x80) \
                                     | 0x4B000000u) - 8388736.0f)
#else
#define LOAD_V(p) CAT(convert_float, VL)(*(__global const CAT(char, VL) *)(p))
#endif
#else
#define LOAD_V(p) LOAD_A(0, (p))
#endif

__kernel __attribute__((reqd_work_group_size(MDIM, KSPLIT, 1)))
void gemv_split(GEMV_SCALARS,
                __global const WEIGHT *a,
                __global const float *b,
                __global float *r,
                EPILOGUE_BUFFERS,
                __global uint *scratch
                HEAD_ARGS
                R_VIEW_ARGS)
{
    __local float part[KSPLIT * OUTS];      /* [tk][column in group][row in group] */
#if HEAD
    __local uint head_last;
    __local float head_values[HEAD_UNITS * NB];
    __local float head_rows[ROWS * HEAD_WIDTH];     /* [row or tile][sample][head unit] */
    const uint h = H, m = HEAD_M;
#endif
    const uint tm = get_local_id(0);
    const uint tk = get_local_id(1);
    const uint t = tk * MDIM + tm;
    const uint rowg = get_group_id(0) * ROWS;   /* first row of the work-group */
    const uint block = get_group_id(1) / SLICES;
    const uint slice = get_group_id(1) % SLICES;
    const uint col0 = block * NB;               /* first column of the work-group */
    const uint chunk = (l + SLICES - 1) / SLICES;
    const uint k0 = slice * chunk;
    const uint k1 = min(l, k0 + chunk);

    /* which of the item's vectors hold a logical row (the others count as 0: R's padding) */
    bool live[NV];
    uint any = 0;
    #pragma unroll
    for (uint p = 0; p < NV; ++p) {
        live[p] = rowg + (p * MDIM + tm) * VL < m;
        any |= live[p];
    }

    accv acc[NV][NB];
    #pragma unroll
    for (uint p = 0; p < NV; ++p)
        #pragma unroll
        for (uint j = 0; j < NB; ++j)
            acc[p][j] = (accv)(ACC_ZERO);

    for (uint kb = any ? k0 + tk * U : k1; kb < k1; kb += KSPLIT * U) {
        /* every load of the step (A's U x NV vectors, B's U x NB values) before the first use */
        accv av[U][NV];
        acc_t bv[U][NB];
        #pragma unroll
        for (uint u = 0; u < U; ++u) {
            const __global WEIGHT *ak = a + (size_t)(kb + u) * H + rowg + tm * VL;
            #pragma unroll
            for (uint p = 0; p < NV; ++p)
                av[u][p] = (live[p] && kb + u < k1) ? LOAD_V(ak + p * MDIM * VL) : (accv)(ACC_ZERO);
            #pragma unroll
            for (uint j = 0; j < NB; ++j)
                bv[u][j] = kb + u < k1 ? TO_ACC(B_AT(kb + u, col0 + j)) : ACC_ZERO;
        }
        #pragma unroll
        for (uint u = 0; u < U; ++u)
            #pragma unroll
            for (uint p = 0; p < NV; ++p)
                #pragma unroll
                for (uint j = 0; j < NB; ++j)
                    acc[p][j] += av[u][p] * bv[u][j];
    }

    #pragma unroll
    for (uint p = 0; p < NV; ++p)
        #pragma unroll
        for (uint j = 0; j < NB; ++j)
            VSTORE(TO_FLOATV(acc[p][j]), 0, part + tk * OUTS + j * ROWS + (p * MDIM + tm) * VL);
    /* the KSPLIT partial sums of each result, added pairwise in a fixed tree (KSPLIT is a power
     * of 2): slice tk += slice tk + s, for s = KSPLIT / 2, ..., 1; the sums end in slice 0 */
    for (uint s = KSPLIT / 2; s > 0; s >>= 1) {
        barrier(CLK_LOCAL_MEM_FENCE);
        for (uint e = t; e < s * OUTS; e += THREADS)
            part[e] += part[e + s * OUTS];
    }
    barrier(CLK_LOCAL_MEM_FENCE);

#if SLICES == 1
    for (uint e = t; e < OUTS; e += THREADS) {
        const uint row = rowg + e % ROWS, col = col0 + e / ROWS;
        STORE_R(e, row, col, part[e]);
    }
#if HEAD
    const uint owner = 1;                       /* every work-group holds its tile's final values */
#endif
#else
    __local uint last;
    const uint tiles = (h / ROWS) * (w / NB);
    const uint g = block * (h / ROWS) + get_group_id(0);
    volatile __global uint *counter = scratch + g;
    volatile __global float *partial = (volatile __global float *)(scratch + tiles) + (size_t)g * SLICES * OUTS;
    for (uint e = t; e < OUTS; e += THREADS)
        atomic_xchg(partial + slice * OUTS + e, part[e]);
    DEVICE_FENCE();
    barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
    if (t == 0)
        last = atomic_inc(counter) == SLICES - 1;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (last) {
        DEVICE_FENCE();
        for (uint e = t; e < OUTS; e += THREADS) {
            /* in slice order, TAIL reads in flight before they are added */
            float sum = 0.0f;
            for (uint q0 = 0; q0 < SLICES; q0 += TAIL) {
                float v[TAIL];
                #pragma unroll
                for (uint q = 0; q < TAIL; ++q)
                    v[q] = q0 + q < SLICES ? atomic_xchg(partial + (q0 + q) * OUTS + e, 0.0f) : 0.0f;
                #pragma unroll
                for (uint q = 0; q < TAIL; ++q)
                    sum = q0 + q == 0 ? v[0] : sum + v[q];
            }
            const uint row = rowg + e % ROWS, col = col0 + e / ROWS;
            STORE_R(e, row, col, sum);
        }
        if (t == 0)
            atomic_xchg(counter, 0u);
    }
#if HEAD
    const uint owner = last;
#endif
#endif

#if HEAD
    if (owner) {
        const uint rtiles = h / ROWS;
        const size_t head_base = (size_t)rtiles * (w / NB) + (size_t)SLICES * h * w;
        volatile __global uint *head_counter = scratch + head_base + block;
        /* this column block's tiles' shares: [tile][sample][unit] */
        volatile __global float *head_part = (volatile __global float *)(scratch + head_base + w / NB)
                                             + (size_t)block * rtiles * HEAD_WIDTH;
        /* this row tile's share of each head unit and sample: each item a row q, its values times its
         * weights (one contiguous run of the head's weights) into row q of head_rows ([row][sample]
         * [unit]), then the rows added in a fixed tree */
        barrier(CLK_LOCAL_MEM_FENCE);
        for (uint q = t; q < ROWS; q += THREADS)
            for (uint c = 0; c < NB; ++c) {
                const float v = part[c * ROWS + q];
                #pragma unroll
                for (uint j = 0; j < HEAD_UNITS; ++j)
                    head_rows[q * HEAD_WIDTH + c * HEAD_UNITS + j] = v * HEAD_W(rowg + q, j);
            }
        head_tree(head_rows, ROWS, t);
        for (uint i = t; i < HEAD_WIDTH; i += THREADS)
            atomic_xchg(head_part + (size_t)get_group_id(0) * HEAD_WIDTH + i, head_rows[i]);
        DEVICE_FENCE();
        barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
        if (t == 0)
            head_last = atomic_inc(head_counter) == rtiles - 1;
        barrier(CLK_LOCAL_MEM_FENCE);
        if (head_last) {
            DEVICE_FENCE();
            /* the tiles' shares, ROWS tiles at a time read at once and added in a fixed tree, the
             * chunks in tile order (the same sums whichever tile is last) */
            for (uint g0 = 0; g0 < rtiles; g0 += ROWS) {
                const uint count = min((uint)ROWS, rtiles - g0);
                barrier(CLK_LOCAL_MEM_FENCE);
                for (uint i = t; i < count * HEAD_WIDTH; i += THREADS)
                    head_rows[i] = atomic_xchg(head_part + (size_t)g0 * HEAD_WIDTH + i, 0.0f);
                head_tree(head_rows, count, t);
                for (uint i = t; i < HEAD_WIDTH; i += THREADS)
                    head_values[i] = g0 == 0 ? head_rows[i] : head_values[i] + head_rows[i];
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            for (uint c = 0; c < NB; ++c)
                for (uint j = t; j < HEAD_UNITS; j += THREADS) {
                    float s = head_values[c * HEAD_UNITS + j] * HEAD_SCALE(j);
#if HEAD_BIAS
                    s += head_bias[j];
#endif
                    head_values[c * HEAD_UNITS + j] = HEAD_ACTIVATION(s);
                }
            barrier(CLK_LOCAL_MEM_FENCE);
            for (uint c = 0; c < NB; ++c)
                for (uint j = t; j < head_h; j += THREADS) {
                    const uint col = col0 + c;
                    float v = 0.0f;
                    if (j < HEAD_UNITS && col < n) {
                        __local const float *x = head_values + c * HEAD_UNITS;
#if HEAD_SOFTMAX
                        float top = x[0];
                        for (uint i = 1; i < HEAD_UNITS; ++i)
                            top = fmax(top, x[i]);
                        float total = 0.0f;
                        for (uint i = 0; i < HEAD_UNITS; ++i)
                            total += exp(x[i] - top);
                        v = exp(x[j] - top) / total;
#else
                        v = x[j];
#endif
                    }
                    r[(size_t)col * head_h + j] = v;
                }
            if (t == 0)
                atomic_xchg(head_counter, 0u);
        }
    }
#endif
}
