/* Tiled matrix multiplication R = A x B with the fused epilogue (matmul.glsl): the GLSL ES 3.10
 * twin of gemm_tiled.cl, from the same library entry and defines.
 *
 * A is M x K column-major (H x W padded), B is K x N row-major (l x w), R is M x N row-major
 * (h x w); the K loop runs over k < l. Each work-group of NDIMC x MDIMC invocations computes MWG x
 * NWG results of R, each invocation (MWG/MDIMC) x (NWG/NDIMC) in registers.
 *   MWG, NWG, KWG, MDIMC, NDIMC, LOCAL, STRIDED  as in gemm_tiled.cl (LOCAL 1: tiles of A and B
 *   staged in shared memory); VW is the OpenCL source's vector width: here the loads are scalar
 *   (a GLSL buffer of floats has no unaligned vector loads) and VW only sets the alignment.
 *   KERAS_ORDER  1 (gemm_tiled_c): B and R column-major (matmul.glsl), and the work-group is
 *   MDIMC x NDIMC, its x dimension running along M (consecutive invocations store consecutive
 *   rows of a column of R); the B tile is stored transposed in shared memory, rows NWG + 1 long.
 */

#ifndef STRIDED
#define STRIDED 1
#endif

#define MWI (MWG / MDIMC)
#define NWI (NWG / NDIMC)
#define THREADS (MDIMC * NDIMC)
#if STRIDED
#define ROW_OF(t, i) ((t) + uint(i) * uint(MDIMC))
#define COL_OF(t, j) ((t) + uint(j) * uint(NDIMC))
#else
#define ROW_OF(t, i) ((t) * uint(MWI) + uint(i))
#define COL_OF(t, j) ((t) * uint(NWI) + uint(j))
#endif

#if KERAS_ORDER
#define BLD (NWG + 1)             /* row length of the B tile in shared memory (fewer bank conflicts) */
#define TX gl_LocalInvocationID.y /* along N */
#define TY gl_LocalInvocationID.x /* along M */
#define GROUP_N MALINN_GROUP_Y
#define GROUP_M MALINN_GROUP_X
#define DIM0 MDIMC                /* the work-group's x extent */
#else
#define BLD NWG
#define TX gl_LocalInvocationID.x
#define TY gl_LocalInvocationID.y
#define GROUP_N MALINN_GROUP_X
#define GROUP_M MALINN_GROUP_Y
#define DIM0 NDIMC
#endif

#if LOCAL
shared float alm[KWG * MWG];
shared float blm[KWG * BLD];
#endif

void main() {
    MALINN_GROUP_GUARD   /* a folded dispatch's extra work-groups (GLDevice.bind) */
    uint tx = TX;
    uint ty = TY;
    uint n0 = GROUP_N * uint(NWG);
    uint m0 = GROUP_M * uint(MWG);

    float acc[MWI][NWI];
    for (int i = 0; i < MWI; ++i)
        for (int j = 0; j < NWI; ++j)
            acc[i][j] = 0.0;

#if LOCAL
    uint tid = gl_LocalInvocationID.y * uint(DIM0) + gl_LocalInvocationID.x;   /* consecutive in a warp */
    for (uint k0 = 0u; k0 < l; k0 += uint(KWG)) {
        for (uint e = tid; e < uint(KWG * MWG); e += uint(THREADS))
            alm[e] = a[(k0 + e / uint(MWG)) * H + m0 + e % uint(MWG)];
#if KERAS_ORDER
        for (uint e = tid; e < uint(KWG * NWG); e += uint(THREADS))   /* along a column of B: along k */
            blm[(e % uint(KWG)) * uint(BLD) + e / uint(KWG)] = B_AT(k0 + e % uint(KWG), n0 + e / uint(KWG));
#else
        for (uint e = tid; e < uint(KWG * NWG); e += uint(THREADS))
            blm[e] = B_AT(k0 + e / uint(NWG), n0 + e % uint(NWG));
#endif
        memoryBarrierShared();
        barrier();
        for (int kk = 0; kk < KWG; ++kk) {
            float av[MWI];
            float bv[NWI];
            for (int i = 0; i < MWI; ++i)
                av[i] = alm[uint(kk * MWG) + ROW_OF(ty, i)];
            for (int j = 0; j < NWI; ++j)
                bv[j] = blm[uint(kk * BLD) + COL_OF(tx, j)];
            for (int i = 0; i < MWI; ++i)
                for (int j = 0; j < NWI; ++j)
                    acc[i][j] += av[i] * bv[j];
        }
        memoryBarrierShared();
        barrier();
    }
#else
    for (uint k = 0u; k < l; ++k) {
        float av[MWI];
        float bv[NWI];
        for (int i = 0; i < MWI; ++i)
            av[i] = a[k * H + m0 + ROW_OF(ty, i)];
        for (int j = 0; j < NWI; ++j)
            bv[j] = B_AT(k, n0 + COL_OF(tx, j));
        for (int i = 0; i < MWI; ++i)
            for (int j = 0; j < NWI; ++j)
                acc[i][j] += av[i] * bv[j];
    }
#endif

    for (int i = 0; i < MWI; ++i) {
        uint row = m0 + ROW_OF(ty, i);
        for (int j = 0; j < NWI; ++j) {
            uint col = n0 + COL_OF(tx, j);
            R_AT(row, col) = EPILOGUE(acc[i][j], row, col);
        }
    }
}
