/* Tiled matrix multiplication R = A x B with the fused epilogue (matmul.glsl): the GLSL ES 3.10
 * twin of gemm_tiled.cl, from the same library entry and defines.
 *
 * A is M x K column-major (H x W padded), B is K x N row-major (l x w), R is M x N row-major
 * (h x w); the K loop runs over k < l. Each work-group of NDIMC x MDIMC invocations computes MWG x
 * NWG results of R, each invocation (MWG/MDIMC) x (NWG/NDIMC) in registers.
 *   MWG, NWG, KWG, MDIMC, NDIMC, LOCAL, STRIDED  as in gemm_tiled.cl (LOCAL 1: tiles of A and B
 *   staged in shared memory); VW is the OpenCL source's vector width: here the loads are scalar
 *   (a GLSL buffer of floats has no unaligned vector loads) and VW only sets the alignment.
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

#if LOCAL
shared float alm[KWG * MWG];
shared float blm[KWG * NWG];
#endif

void main() {
    uint tx = gl_LocalInvocationID.x;
    uint ty = gl_LocalInvocationID.y;
    uint n0 = gl_WorkGroupID.x * uint(NWG);
    uint m0 = gl_WorkGroupID.y * uint(MWG);

    float acc[MWI][NWI];
    for (int i = 0; i < MWI; ++i)
        for (int j = 0; j < NWI; ++j)
            acc[i][j] = 0.0;

#if LOCAL
    uint tid = ty * uint(NDIMC) + tx;
    for (uint k0 = 0u; k0 < l; k0 += uint(KWG)) {
        for (uint e = tid; e < uint(KWG * MWG); e += uint(THREADS))
            alm[e] = a[(k0 + e / uint(MWG)) * H + m0 + e % uint(MWG)];
        for (uint e = tid; e < uint(KWG * NWG); e += uint(THREADS))
            blm[e] = b[(k0 + e / uint(NWG)) * w + n0 + e % uint(NWG)];
        memoryBarrierShared();
        barrier();
        for (int kk = 0; kk < KWG; ++kk) {
            float av[MWI];
            float bv[NWI];
            for (int i = 0; i < MWI; ++i)
                av[i] = alm[uint(kk * MWG) + ROW_OF(ty, i)];
            for (int j = 0; j < NWI; ++j)
                bv[j] = blm[uint(kk * NWG) + COL_OF(tx, j)];
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
            bv[j] = b[k * w + n0 + COL_OF(tx, j)];
        for (int i = 0; i < MWI; ++i)
            for (int j = 0; j < NWI; ++j)
                acc[i][j] += av[i] * bv[j];
    }
#endif

    for (int i = 0; i < MWI; ++i) {
        uint row = m0 + ROW_OF(ty, i);
        for (int j = 0; j < NWI; ++j) {
            uint col = n0 + COL_OF(tx, j);
            r[row * w + col] = EPILOGUE(acc[i][j], row, col);
        }
    }
}
