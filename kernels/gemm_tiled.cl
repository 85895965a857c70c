/* Tiled matrix multiplication R = A x B for devices with fast local memory (desktop GPUs), with
 * the fused epilogue of epilogue.clh: R = AFFINE(ACTIVATION(A x B + bias)), R's padding written as 0.
 *
 * A is M x K column-major (a Dense layer's kernel as Keras stores it: W = kernel^T read
 * column-major), B is K x N row-major and R is M x N row-major (so R feeds the next layer as its
 * B with no re-layout); with KERAS_ORDER=1 (the gemm_tiled_c entry) B and R are column-major
 * instead, Keras's own memory order (epilogue.clh), so a network's input and output are read and
 * written in place, and the work-group's dimension 0 runs along M (coalesced stores of R). Each is indexed with its own padded shape: A is H x W (H >= h, W >= l: A
 * may be padded more than R, so one weight buffer serves several kernels), B is l x w, R is h x w;
 * m and n are R's logical rows and columns. The K loop runs over k < l only. l, h and w are
 * multiples of the tiles (kernels/library.json says so).
 *
 * Compile-time parameters (-D defines; a tuner picks them per device, see `malinn tune`):
 *   MWG, NWG   rows and columns of R computed by one work-group
 *   KWG        K step staged per iteration
 *   MDIMC, NDIMC  work-group shape (dimension 0 runs along N, so loads and stores coalesce)
 *   VW         vector width of global loads (1, 2 or 4)
 *   LOCAL      1: stage A and B tiles in local memory; 0: read global memory directly
 *   STRIDED    1: a work item's rows/columns are MDIMC/NDIMC apart (coalesced stores);
 *              0: they are adjacent (vector-friendly local-memory reads)
 *   KERAS_ORDER  1: B and R column-major (default 0: row-major)
 *   BIAS, ACTIVATION, AFFINE  the fused epilogue (epilogue.clh)
 *   WEIGHT_BITS, HALF_ARITHMETIC  the precision of A and of the sums (weights.clh)
 * Each work item computes (MWG/MDIMC) x (NWG/NDIMC) results, kept in registers (loops unrolled).
 * OpenCL C 1.2.
 */

#ifndef STRIDED
#define STRIDED 1
#endif

#define MWI (MWG / MDIMC)
#define NWI (NWG / NDIMC)
#define THREADS (MDIMC * NDIMC)
#if STRIDED
#define ROW_OF(t, i) ((t) + (i) * MDIMC)
#define COL_OF(t, j) ((t) + (j) * NDIMC)
#else
#define ROW_OF(t, i) ((t) * MWI + (i))
#define COL_OF(t, j) ((t) * NWI + (j))
#endif

/* VW values of A (weights, in their precision) or of B (floats) into a local tile of acc_t */
#if VW == 4
#define COPY_A(src, dst) vstore4(LOAD_W4(0, (src)), 0, (dst))
#define COPY_B(src, dst) vstore4(TO_ACC4(vload4(0, (src))), 0, (dst))
#elif VW == 2
#define COPY_A(src, dst) vstore2(LOAD_W2(0, (src)), 0, (dst))
#define COPY_B(src, dst) vstore2(TO_ACC2(vload2(0, (src))), 0, (dst))
#else
#define COPY_A(src, dst) (*(dst) = LOAD_W(0, (src)))
#define COPY_B(src, dst) (*(dst) = TO_ACC(*(src)))
#endif

#if KERAS_ORDER
#define M_DIM 0                   /* the ndrange dimension that runs along M */
#define BLD (NWG + 1)             /* row length of the B tile in local memory (fewer bank conflicts) */
#define WORK_GROUP reqd_work_group_size(MDIMC, NDIMC, 1)
#else
#define M_DIM 1
#define BLD NWG
#define WORK_GROUP reqd_work_group_size(NDIMC, MDIMC, 1)
#endif

__kernel __attribute__((WORK_GROUP))
void gemm_tiled(MATMUL_SCALARS,
                __global const WEIGHT *a,
                __global const float *b,
                __global float *r,
                EPILOGUE_BUFFERS
                R_VIEW_ARGS)
{
    const uint tx = get_local_id(1 - M_DIM);
    const uint ty = get_local_id(M_DIM);
    const uint n0 = get_group_id(1 - M_DIM) * NWG;
    const uint m0 = get_group_id(M_DIM) * MWG;

    acc_t acc[MWI][NWI];
    #pragma unroll
    for (uint i = 0; i < MWI; ++i)
        #pragma unroll
        for (uint j = 0; j < NWI; ++j)
            acc[i][j] = ACC_ZERO;

#if LOCAL
    __local acc_t alm[KWG * MWG];
    __local acc_t blm[KWG * BLD];
    const uint tid = get_local_id(0) + get_local_id(1) * get_local_size(0);   /* consecutive in a warp */
    for (uint k0 = 0; k0 < l; k0 += KWG) {
        for (uint e = tid * VW; e < KWG * MWG; e += THREADS * VW)
            COPY_A(a + (size_t)(k0 + e / MWG) * H + m0 + e % MWG, alm + e);
#if KERAS_ORDER
        for (uint e = tid * VW; e < KWG * NWG; e += THREADS * VW) {
            acc_t t[VW];                              /* VW consecutive k of one column of B */
            COPY_B(b + (size_t)(n0 + e / KWG) * l + k0 + e % KWG, t);
            #pragma unroll
            for (uint v = 0; v < VW; ++v)
                blm[(e % KWG + v) * BLD + e / KWG] = t[v];
        }
#else
        for (uint e = tid * VW; e < KWG * NWG; e += THREADS * VW)
            COPY_B(b + (size_t)(k0 + e / NWG) * w + n0 + e % NWG, blm + e);
#endif
        barrier(CLK_LOCAL_MEM_FENCE);
        #pragma unroll
        for (uint kk = 0; kk < KWG; ++kk) {
            acc_t av[MWI], bv[NWI];
            #pragma unroll
            for (uint i = 0; i < MWI; ++i)
                av[i] = alm[kk * MWG + ROW_OF(ty, i)];
            #pragma unroll
            for (uint j = 0; j < NWI; ++j)
                bv[j] = blm[kk * BLD + COL_OF(tx, j)];
            #pragma unroll
            for (uint i = 0; i < MWI; ++i)
                #pragma unroll
                for (uint j = 0; j < NWI; ++j)
                    acc[i][j] += av[i] * bv[j];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
#else
    for (uint k = 0; k < l; ++k) {
        acc_t av[MWI], bv[NWI];
        #pragma unroll
        for (uint i = 0; i < MWI; ++i)
            av[i] = LOAD_W((size_t)k * H + m0 + ROW_OF(ty, i), a);
        #pragma unroll
        for (uint j = 0; j < NWI; ++j)
            bv[j] = TO_ACC(B_AT(k, n0 + COL_OF(tx, j)));
        #pragma unroll
        for (uint i = 0; i < MWI; ++i)
            #pragma unroll
            for (uint j = 0; j < NWI; ++j)
                acc[i][j] += av[i] * bv[j];
    }
#endif

    #pragma unroll
    for (uint i = 0; i < MWI; ++i) {
        const uint row = m0 + ROW_OF(ty, i);
        #pragma unroll
        for (uint j = 0; j < NWI; ++j) {
            const uint col = n0 + COL_OF(tx, j);
            R_AT(row, col) = EPILOGUE(acc[i][j], row, col);
        }
    }
}
