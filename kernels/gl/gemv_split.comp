/* Matrix times a few vectors, R = A x B for small batches, with K split ACROSS work-groups and the
 * fused epilogue (matmul.glsl): the GLSL ES 3.10 twin of gemv_split.cl, from the same library
 * entries (gemv_split, gemv_split_c) and defines; read gemv_split.cl for the design.
 *
 *   work-group  MDIM x KSPLIT invocations; it computes ROWS = MDIM * VW rows by NB columns of R over
 *               one of SLICES slices of K (slice s: k in [s * chunk, (s + 1) * chunk))
 *   invocation (tm, tk)  VW rows as VW / VL loads of VL rows (VL = 4 floats, or VW where VW is
 *               smaller: vec4, vec2 or float), load p at work-group row (p * MDIM + tm) * VL;
 *               UNROLL columns of A per step, all loaded before the first is used
 *   the KSPLIT partial sums of each result are added in shared memory in a fixed tree, then
 *   SLICES == 1: the epilogue writes R (its padding as 0);
 *   SLICES > 1: the work-group stores its ROWS x NB partial sums in the scratch buffer (binding 6,
 *               uint: the tiles' counters, then the partial sums as float bits) with atomicExchange,
 *               counts itself in its tile's counter (atomicAdd) after memoryBarrierBuffer; the
 *               work-group that counts last reads the SLICES partial sums back with atomicExchange
 *               (leaving 0), adds them in slice order (bit-identical whichever finishes last), writes
 *               R through the epilogue and sets the counter back to 0.
 *   WIDE        the OpenCL source's choice of load instruction: every load here is one vector load
 *   WEIGHT_BITS 32, 16 or 8: A in fp32, fp16-storage or int8-weights (gl/weights.glsl), float
 *               sums; UNROLL * 32 / WEIGHT_BITS columns per step, as in the OpenCL kernel (the same
 *               columns per invocation: the same sums in the same order)
 * KERAS_ORDER=1 (gemv_split_c) reads B and writes R column-major (matmul.glsl). GLSL ES 3.10.
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

#define ROWS (MDIM * VW)          /* rows of R per work-group */
#define OUTS (ROWS * NB)          /* results per work-group */
#define THREADS (MDIM * KSPLIT)
#ifndef WEIGHT_BITS
#define WEIGHT_BITS 32
#endif
#define U (UNROLL * 32 / WEIGHT_BITS)   /* columns of A per invocation per step */
#if VW > 4                        /* VL: rows per load, at most 16 bytes */
#define VL 4
#else
#define VL VW
#endif
#define NV (VW / VL)              /* loads per invocation and column */
#if SLICES < 32                   /* partial sums the last work-group's invocations read at once */
#define TAIL SLICES
#else
#define TAIL 32
#endif

#if VL == 4                       /* LOAD_V(i): the VL weights from element i (a multiple of VL) */
#define accv vec4
#define LOAD_V(i) LOAD_A4((i) / 4u)
#elif VL == 2
#define accv vec2
#define LOAD_V(i) LOAD_A2((i) / 2u)
#else
#define accv float
#define LOAD_V(i) LOAD_A1(i)
#endif

shared float part[KSPLIT * OUTS];      /* [tk][column in group][row in group] */
#if SLICES > 1
layout(std430, binding = 6) coherent buffer BufScratch { uint scratch[]; };
shared uint last;
#endif

void main() {
    MALINN_GROUP_GUARD   /* a folded dispatch's extra work-groups (GLDevice.bind) */
    uint tm = gl_LocalInvocationID.x;
    uint tk = gl_LocalInvocationID.y;
    uint t = tk * uint(MDIM) + tm;
    uint rowg = MALINN_GROUP_X * uint(ROWS);   /* first row of the work-group */
    uint block = MALINN_GROUP_Y / uint(SLICES);
    uint slice = MALINN_GROUP_Y % uint(SLICES);
    uint col0 = block * uint(NB);                /* first column of the work-group */
    uint chunk = (l + uint(SLICES) - 1u) / uint(SLICES);
    uint k0 = slice * chunk;
    uint k1 = min(l, k0 + chunk);

    /* which of the invocation's loads hold a logical row (the others count as 0: R's padding) */
    bool live[NV];
    bool any = false;
    for (int p = 0; p < NV; ++p) {
        live[p] = rowg + (uint(p * MDIM) + tm) * uint(VL) < m;
        any = any || live[p];
    }

    accv acc[NV][NB];
    for (int p = 0; p < NV; ++p)
        for (int j = 0; j < NB; ++j)
            acc[p][j] = accv(0.0);

    for (uint kb = any ? k0 + tk * uint(U) : k1; kb < k1; kb += uint(KSPLIT * U)) {
        /* every load of the step (A's U x NV vectors, B's U x NB values) before the first use */
        accv av[U][NV];
        float bv[U][NB];
        for (int u = 0; u < U; ++u) {
            uint ak = (kb + uint(u)) * H + rowg + tm * uint(VL);
            bool inside = kb + uint(u) < k1;
            for (int p = 0; p < NV; ++p)
                av[u][p] = (live[p] && inside) ? LOAD_V(ak + uint(p * MDIM * VL)) : accv(0.0);
            for (int j = 0; j < NB; ++j)
                bv[u][j] = inside ? B_AT(kb + uint(u), col0 + uint(j)) : 0.0;
        }
        for (int u = 0; u < U; ++u)
            for (int p = 0; p < NV; ++p)
                for (int j = 0; j < NB; ++j)
                    acc[p][j] += av[u][p] * bv[u][j];
    }

    for (int p = 0; p < NV; ++p)
        for (int j = 0; j < NB; ++j) {
            uint at = tk * uint(OUTS) + uint(j * ROWS) + (uint(p * MDIM) + tm) * uint(VL);
#if VL == 1
            part[at] = acc[p][j];
#else
            for (int i = 0; i < VL; ++i)
                part[at + uint(i)] = acc[p][j][i];
#endif
        }
    /* the KSPLIT partial sums of each result, added pairwise in a fixed tree: slice tk += slice
     * tk + s, for s = KSPLIT / 2, ..., 1; the sums end in slice 0 */
    for (uint s = uint(KSPLIT) / 2u; s > 0u; s >>= 1) {
        memoryBarrierShared();
        barrier();
        for (uint e = t; e < s * uint(OUTS); e += uint(THREADS))
            part[e] += part[e + s * uint(OUTS)];
    }
    memoryBarrierShared();
    barrier();

#if SLICES == 1
    for (uint e = t; e < uint(OUTS); e += uint(THREADS)) {
        uint row = rowg + e % uint(ROWS), col = col0 + e / uint(ROWS);
        R_AT(row, col) = EPILOGUE_W(part[e], row, col);
    }
#else
    uint tiles = (h / uint(ROWS)) * (w / uint(NB));
    uint g = block * (h / uint(ROWS)) + MALINN_GROUP_X;
    uint partial = tiles + g * uint(SLICES * OUTS);
    for (uint e = t; e < uint(OUTS); e += uint(THREADS))
        atomicExchange(scratch[partial + slice * uint(OUTS) + e], floatBitsToUint(part[e]));
    memoryBarrierBuffer();
    barrier();
    if (t == 0u)
        last = atomicAdd(scratch[g], 1u) == uint(SLICES - 1) ? 1u : 0u;
    memoryBarrierShared();
    barrier();
    if (last != 0u) {
        memoryBarrierBuffer();
        for (uint e = t; e < uint(OUTS); e += uint(THREADS)) {
            /* in slice order, TAIL reads in flight before they are added */
            float sum = 0.0;
            for (uint q0 = 0u; q0 < uint(SLICES); q0 += uint(TAIL)) {
                float v[TAIL];
                for (int q = 0; q < TAIL; ++q)
                    v[q] = q0 + uint(q) < uint(SLICES)
                        ? uintBitsToFloat(atomicExchange(scratch[partial + (q0 + uint(q)) * uint(OUTS) + e], 0u))
                        : 0.0;
                for (int q = 0; q < TAIL; ++q)
                    sum = q0 + uint(q) == 0u ? v[0] : sum + v[q];
            }
            uint row = rowg + e % uint(ROWS), col = col0 + e / uint(ROWS);
            R_AT(row, col) = EPILOGUE_W(sum, row, col);
        }
        if (t == 0u)
            atomicExchange(scratch[g], 0u);
    }
#endif
}
