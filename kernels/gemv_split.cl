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
void gemv_split(MATMUL_SCALARS,
                __global const WEIGHT *a,
                __global const float *b,
                __global float *r,
                EPILOGUE_BUFFERS,
                __global uint *scratch)
{
    __local float part[KSPLIT * OUTS];      /* [tk][column in group][row in group] */
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
        R_AT(row, col) = EPILOGUE(part[e], row, col);
    }
#else
    __local uint last;
    const uint tiles = (h / ROWS) * (w / NB);
    const uint g = block * (h / ROWS) + get_group_id(0);
    volatile __global uint *counter = scratch + g;
    volatile __global float *partial = (volatile __global float *)(scratch + tiles) + (size_t)g * SLICES * OUTS;
    for (uint e = t; e < OUTS; e += THREADS)
        atomic_xchg(partial + slice * OUTS + e, part[e]);
    mem_fence(CLK_GLOBAL_MEM_FENCE);
    barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
    if (t == 0)
        last = atomic_inc(counter) == SLICES - 1;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (last) {
        mem_fence(CLK_GLOBAL_MEM_FENCE);
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
            R_AT(row, col) = EPILOGUE(sum, row, col);
        }
        if (t == 0)
            atomic_xchg(counter, 0u);
    }
#endif
}
