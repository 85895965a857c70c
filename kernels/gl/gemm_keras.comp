/* Register-blocked GEMM in Keras's memory order with the fused epilogue (matmul.glsl): the GLSL ES
 * 3.10 twin of gemm_keras.cl, from the same library entries (gemm_keras, gemm_keras_large,
 * gemm_keras_narrow) and defines; read gemm_keras.cl for the design.
 *
 * A is M x K column-major (H x W padded), B is K x N column-major (l x w: a column is one sample's
 * l features) and R is M x N column-major (h x w). A work-group of (TM / RM) x (TN / RN) flat
 * invocations computes TM units x TN samples; per K step of KT it stages KT rows of TM weights and
 * KT features of TN samples in shared memory (loaded as vec4: H and l are multiples of 4, from the
 * entry's restrictions), and each invocation accumulates RN samples x RM units (RM / 4 vec4s) in
 * registers, in the same order as the OpenCL kernel.
 *
 *   TM, TN, RM, RN, KT, PREFETCH  as in gemm_keras.cl
 *   SLICES  work-groups along K per tile of R (1: none). With SLICES > 1 each work-group stores its
 *           partial sums in the scratch buffer (binding 6, uint: the tiles' counters, then the
 *           partial sums as float bits) with atomicExchange, counts itself in its tile's counter
 *           (atomicAdd) after memoryBarrierBuffer, and the work-group that counts last reads the
 *           SLICES partial sums back with atomicExchange (leaving 0), adds them in slice order
 *           (bit-identical whichever finishes last), applies the epilogue, writes R and sets the
 *           counter back to 0 (library.json "scratch_bytes"; the runtime clears it once).
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

shared vec4 wl[WVECS];           /* wl[kk * TM / 4 + unit / 4]: vector e of the tile at e */
shared float xl[KT * TN];        /* xl[kk * TN + sample] */

/* vector e of a K step's weight tile (KT rows of TM units) and of its input tile (TN samples of KT
 * features), as vec4 indices into A (LOAD_A4) and b4 */
#define W_AT(k0, e) ((((k0) + (e) / uint(TM / 4)) * H + m0) / 4u + (e) % uint(TM / 4))
#define X_AT(k0, e) (((n0 + (e) / uint(KT / 4)) * l + (k0)) / 4u + (e) % uint(KT / 4))

void store_x(vec4 v, uint e) {
    uint s = e / uint(KT / 4), k = 4u * (e % uint(KT / 4));
    xl[(k + 0u) * uint(TN) + s] = v.x;
    xl[(k + 1u) * uint(TN) + s] = v.y;
    xl[(k + 2u) * uint(TN) + s] = v.z;
    xl[(k + 3u) * uint(TN) + s] = v.w;
}

void main() {
    uint t = gl_LocalInvocationID.x;
    uint tu = t % uint(TPU);
    uint tb = t / uint(TPU);
    uint n0 = gl_WorkGroupID.x * uint(TN);
    uint tile_m = gl_WorkGroupID.y / uint(SLICES);
    uint slice = gl_WorkGroupID.y % uint(SLICES);
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
#if PREFETCH
        for (int q = 0; q < WLOADS; ++q) {
            uint e = t + uint(q * THREADS);
            if (e < uint(WVECS))
                wl[e] = wr[q];
        }
        for (int q = 0; q < XLOADS; ++q) {
            uint e = t + uint(q * THREADS);
            if (e < uint(XVECS))
                store_x(xr[q], e);
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
            wl[e] = LOAD_A4(W_AT(k0, e));
        for (uint e = t; e < uint(XVECS); e += uint(THREADS))
            store_x(b4[X_AT(k0, e)], e);
        memoryBarrierShared();
        barrier();
#endif
        for (int kk = 0; kk < KT; ++kk) {
            vec4 wv[VM];
            float xv[RN];
            for (int c = 0; c < VM; ++c)
                wv[c] = wl[uint(kk * (TM / 4)) + tu + uint(c * TPU)];
            for (int j = 0; j < RN; ++j)
                xv[j] = xl[uint(kk * TN) + tb * uint(RN) + uint(j)];
            for (int j = 0; j < RN; ++j)
                for (int c = 0; c < VM; ++c)
                    acc[j][c] += xv[j] * wv[c];
        }
        memoryBarrierShared();
        barrier();
    }

#if SLICES > 1
    /* this slice's partial sums into the scratch buffer; the tile's last work-group adds them */
    uint g = tile_m * (w / uint(TN)) + gl_WorkGroupID.x;
    uint partial = (h / uint(TM)) * (w / uint(TN)) + g * uint(SLICES * TM * TN);
    /* where component i of vector c of sample j of this invocation lies in a slice's TN x TM sums */
#define PART_AT(j, c, i) ((tb * uint(RN) + uint(j)) * uint(TM) + 4u * (tu + uint(c * TPU)) + uint(i))
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
    vec4 sum[RN][VM];
    for (int j = 0; j < RN; ++j)
        for (int c = 0; c < VM; ++c)
            for (int i = 0; i < 4; ++i)
                sum[j][c][i] = uintBitsToFloat(atomicExchange(scratch[partial + PART_AT(j, c, i)], 0u));
    for (uint q = 1u; q < uint(SLICES); ++q)   /* in slice order: the same sums whoever is last */
        for (int j = 0; j < RN; ++j)
            for (int c = 0; c < VM; ++c)
                for (int i = 0; i < 4; ++i)
                    sum[j][c][i] += uintBitsToFloat(atomicExchange(scratch[partial + q * uint(TM * TN)
                                                                           + PART_AT(j, c, i)], 0u));
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
