/* Register-blocked GEMM in Keras's memory order with the fused epilogue (matmul.glsl): the GLSL ES
 * 3.10 twin of gemm_keras.cl, from the same library entries (gemm_keras, gemm_keras_large,
 * gemm_keras_full_batch, gemm_keras_narrow) and defines; read gemm_keras.cl for the design.
 *
 * A is M x K column-major (H x W padded), B is K x N column-major (l x w: a column is one sample's
 * l features) and R is M x N column-major (h x w). A work-group of (TM / RM) x (TN / RN) flat
 * invocations computes TM units x TN samples; per K step of KT it stages KT rows of TM weights and
 * KT features of TN samples in shared memory (loaded as vec4: H and l are multiples of 4, from the
 * entry's restrictions), and each invocation accumulates RN samples x RM units (RM / 4 vec4s) in
 * registers, in the same order as the OpenCL kernel (so the same sums, where the compilers contract
 * a * b + c alike). Its samples are read from shared memory as vec4s where RN % 4 == 0 and
 * TN % 4 == 0 (the staged inputs then held as vec4s of 4 samples), else as floats.
 *
 *   TM, TN, RM, RN, KT, PREFETCH  as in gemm_keras.cl
 *   BUFFERS  1, or 2: two shared tiles, the next K step stored into the other one while some
 *           invocations still compute the current one (with PREFETCH: one barrier per K step)
 *   SLICES  work-groups along K per tile of R (1: none). With SLICES > 1 each work-group stores its
 *           partial sums in the scratch buffer (binding 6, uint: the tiles' counters, then the
 *           partial sums as float bits) with atomicExchange, item-major within each result
 *           (PART_AT: a warp's 32 exchanges of one result are consecutive words), counts itself in
 *           its tile's counter (atomicAdd) after memoryBarrierBuffer, and the work-group that
 *           counts last reads the other slices' partial sums back with atomicExchange (leaving 0),
 *           takes its own from its registers, adds them in slice order (bit-identical whichever
 *           finishes last), applies the epilogue, writes R and sets the counter back to 0
 *           (library.json "scratch_bytes"; the runtime clears it once).
 *   KERAS_ORDER  always 1 here (the entry's define: matmul.glsl's column-major R_AT)
 *   WEIGHT_BITS  32, 16 or 8: A in fp32, fp16-storage or int8-weights (gl/weights.glsl: LOAD_A4,
 *           EPILOGUE_W), float sums; each vec4 of A is read as 4 floats, 2 or 1 uint words
 * GLSL ES 3.10.
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
#define VM (RM / 4)              /* vec4s of units per invocation */
#define WVECS (KT * TM / 4)      /* vec4s of a K step's weight tile */
#define XVECS (TN * KT / 4)      /* vec4s of a K step's input tile */
#define WLOADS ((WVECS + THREADS - 1) / THREADS)   /* vec4s of weights per invocation and K step */
#define XLOADS ((XVECS + THREADS - 1) / THREADS)   /* vec4s of inputs per invocation and K step */

/* B again, as vec4 (A through gl/weights.glsl's LOAD_A4): every vec4 read starts at a multiple of 4 */
layout(std430, binding = 1) readonly buffer BufB4 { vec4 b4[]; };
#if SLICES > 1
layout(std430, binding = 6) coherent buffer BufScratch { uint scratch[]; };
shared uint last;
#endif

/* BUFFERS tiles each: weights wtiles[tile * WVECS + kk * TM / 4 + unit / 4] (vector e of a tile at
 * e), inputs x[tile * KT * TN + kk * TN + sample] (vec4s of 4 samples where they are read so) */
shared vec4 wtiles[BUFFERS * WVECS];
#if RN % 4 == 0 && TN % 4 == 0
#define X_VEC4 1
shared vec4 xtiles4[BUFFERS * KT * TN / 4];
#define X_SET(i, v) xtiles4[(i) / 4u][(i) % 4u] = (v)
#else
#define X_VEC4 0
shared float xtiles[BUFFERS * KT * TN];
#define X_SET(i, v) xtiles[i] = (v)
#endif

/* vector e of a K step's weight tile (KT rows of TM units) and of its input tile (TN samples of KT
 * features), as vec4 indices into A (LOAD_A4) and b4 */
#define W_AT(k0, e) ((((k0) + (e) / uint(TM / 4)) * H + m0) / 4u + (e) % uint(TM / 4))
#define X_AT(k0, e) (((n0 + (e) / uint(KT / 4)) * l + (k0)) / 4u + (e) % uint(KT / 4))

/* vector e of an input tile into the tile at float xbase, transposed: feature k of sample s at k * TN + s */
void store_x(vec4 v, uint e, uint xbase) {
    uint s = e / uint(KT / 4), k = 4u * (e % uint(KT / 4));
    X_SET(xbase + (k + 0u) * uint(TN) + s, v.x);
    X_SET(xbase + (k + 1u) * uint(TN) + s, v.y);
    X_SET(xbase + (k + 2u) * uint(TN) + s, v.z);
    X_SET(xbase + (k + 3u) * uint(TN) + s, v.w);
}

void main() {
    MALINN_GROUP_GUARD   /* a folded dispatch's extra work-groups (GLDevice.bind) */
    uint t = gl_LocalInvocationID.x;
    uint tu = t % uint(TPU);
    uint tb = t / uint(TPU);
    uint n0 = MALINN_GROUP_X * uint(TN);
    uint tile_m = MALINN_GROUP_Y / uint(SLICES);
    uint slice = MALINN_GROUP_Y % uint(SLICES);
    uint m0 = tile_m * uint(TM);
    /* this work-group's slice of K: whole K steps, the last slices shorter (or empty) */
    uint chunk = (l / uint(KT) + uint(SLICES) - 1u) / uint(SLICES) * uint(KT);
    uint kbegin = min(l, slice * chunk);
    uint kend = min(l, kbegin + chunk);

    vec4 acc[RN][VM];
    for (int j = 0; j < RN; ++j)
        for (int c = 0; c < VM; ++c)
            acc[j][c] = vec4(0.0);

#if PREFETCH
    /* the next K step's share of this invocation, held in registers while the current one is computed */
    vec4 wr[WLOADS];
    vec4 xr[XLOADS];
    for (int q = 0; q < WLOADS; ++q) {
        uint e = t + uint(q * THREADS);
        if (kbegin < kend && e < uint(WVECS))
            wr[q] = LOAD_A4(W_AT(kbegin, e));
    }
    for (int q = 0; q < XLOADS; ++q) {
        uint e = t + uint(q * THREADS);
        if (kbegin < kend && e < uint(XVECS))
            xr[q] = b4[X_AT(kbegin, e)];
    }
#endif
    for (uint k0 = kbegin; k0 < kend; k0 += uint(KT)) {
#if BUFFERS == 2
        uint tile = ((k0 - kbegin) / uint(KT)) % 2u;
#else
        uint tile = 0u;
#endif
        uint wbase = tile * uint(WVECS), xbase = tile * uint(KT * TN);
#if PREFETCH
        for (int q = 0; q < WLOADS; ++q) {
            uint e = t + uint(q * THREADS);
            if (e < uint(WVECS))
                wtiles[wbase + e] = wr[q];
        }
        for (int q = 0; q < XLOADS; ++q) {
            uint e = t + uint(q * THREADS);
            if (e < uint(XVECS))
                store_x(xr[q], e, xbase);
        }
        memoryBarrierShared();
        barrier();
        if (k0 + uint(KT) < kend) {
            for (int q = 0; q < WLOADS; ++q) {
                uint e = t + uint(q * THREADS);
                if (e < uint(WVECS))
                    wr[q] = LOAD_A4(W_AT(k0 + uint(KT), e));
            }
            for (int q = 0; q < XLOADS; ++q) {
                uint e = t + uint(q * THREADS);
                if (e < uint(XVECS))
                    xr[q] = b4[X_AT(k0 + uint(KT), e)];
            }
        }
#else
        for (uint e = t; e < uint(WVECS); e += uint(THREADS))
            wtiles[wbase + e] = LOAD_A4(W_AT(k0, e));
        for (uint e = t; e < uint(XVECS); e += uint(THREADS))
            store_x(b4[X_AT(k0, e)], e, xbase);
        memoryBarrierShared();
        barrier();
#endif
        for (int kk = 0; kk < KT; ++kk) {
            vec4 wv[VM];
            float xv[RN];
            for (int c = 0; c < VM; ++c)
                wv[c] = wtiles[wbase + uint(kk * (TM / 4)) + tu + uint(c * TPU)];
#if X_VEC4
            for (int c = 0; c < RN / 4; ++c) {
                vec4 q = xtiles4[(xbase + uint(kk * TN)) / 4u + tb * uint(RN / 4) + uint(c)];
                xv[4 * c + 0] = q.x;
                xv[4 * c + 1] = q.y;
                xv[4 * c + 2] = q.z;
                xv[4 * c + 3] = q.w;
            }
#else
            for (int j = 0; j < RN; ++j)
                xv[j] = xtiles[xbase + uint(kk * TN) + tb * uint(RN) + uint(j)];
#endif
            for (int j = 0; j < RN; ++j)
                for (int c = 0; c < VM; ++c)
                    acc[j][c] += xv[j] * wv[c];
        }
#if BUFFERS == 1 || !PREFETCH
        memoryBarrierShared();
        barrier();
#endif
    }

#if SLICES > 1
    /* this slice's partial sums into the scratch buffer; the tile's last work-group adds them */
    uint g = tile_m * (w / uint(TN)) + MALINN_GROUP_X;
    uint partial = (h / uint(TM)) * (w / uint(TN)) + g * uint(SLICES * TM * TN);
    /* where this invocation's result (sample j, unit 4 c + i) lies in a slice's TM x TN partial sums:
     * item-major, so consecutive invocations exchange consecutive words */
#define PART_AT(j, c, i) ((uint(j) * uint(RM) + 4u * uint(c) + uint(i)) * uint(THREADS) + t)
    for (int j = 0; j < RN; ++j)
        for (int c = 0; c < VM; ++c)
            for (int i = 0; i < 4; ++i)
                atomicExchange(scratch[partial + slice * uint(TM * TN) + PART_AT(j, c, i)],
                               floatBitsToUint(acc[j][c][i]));
    memoryBarrierBuffer();
    barrier();
    if (t == 0u)
        last = atomicAdd(scratch[g], 1u) == uint(SLICES - 1) ? 1u : 0u;
    memoryBarrierShared();
    barrier();
    if (last == 0u)
        return;
    memoryBarrierBuffer();
    /* the slices in slice order (the same sums whoever is last); this work-group's own from its
     * registers (the value it exchanged) */
    vec4 sum[RN][VM];
    for (uint q = 0u; q < uint(SLICES); ++q)
        for (int j = 0; j < RN; ++j)
            for (int c = 0; c < VM; ++c)
                for (int i = 0; i < 4; ++i) {
                    float v = q == slice ? acc[j][c][i]
                                         : uintBitsToFloat(atomicExchange(scratch[partial + q * uint(TM * TN)
                                                                                  + PART_AT(j, c, i)], 0u));
                    sum[j][c][i] = q == 0u ? v : sum[j][c][i] + v;
                }
    if (t == 0u)
        atomicExchange(scratch[g], 0u);
#else
#define sum acc
#endif

    for (int j = 0; j < RN; ++j) {
        uint col = n0 + tb * uint(RN) + uint(j);
        for (int c = 0; c < VM; ++c) {
            uint row = m0 + 4u * (tu + uint(c * TPU));
            for (int i = 0; i < 4; ++i)
                R_AT(row + uint(i), col) = EPILOGUE_W(sum[j][c][i], row + uint(i), col);
        }
    }
}
