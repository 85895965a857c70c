/* Matrix times a few vectors, R = A x B, with A row-major: each weight row is read along K by a
 * whole work-group, for a batch-1 Dense layer at memory bandwidth, with the fused epilogue of
 * epilogue.clh.
 *
 * gemv.cl reads a column-major A along M, so a warp's loads are short runs of a few columns; here
 * A is M x K row-major (H x W, read in columns < l and rows < m only), and the THREADS items of a
 * work-group read ROWS rows of it in one sweep along K, VW floats per load: consecutive items read
 * consecutive vectors (every load of a warp is one contiguous run), and every one of the h / ROWS
 * work-groups has all its items streaming. B (l x w) and R (h x w) are column-major, Keras's memory
 * order (KERAS_ORDER=1, epilogue.clh). Each item adds up its own share of K for the ROWS x NB
 * results; the THREADS partial sums of each are then added in local memory in a fixed tree (no
 * atomics: the same inputs give bit-identical results on every run), and the epilogue writes R,
 * its padding as 0.
 *
 * Compile-time parameters (-D defines; candidates in kernels/library.json):
 *   VW       floats per load along K (1, 2 or 4; l and W are multiples of it)
 *   ROWS     rows of R per work-group (h is a multiple of it)
 *   THREADS  items per work-group, a power of 2
 *   NB       columns of B (samples) per work-group (w is a multiple of it)
 *   BIAS, ACTIVATION, AFFINE  the fused epilogue (epilogue.clh)
 * The global range is (h / ROWS * THREADS) x (w / NB). OpenCL C 1.2.
 */

#ifndef VW
#define VW 4
#endif
#ifndef ROWS
#define ROWS 4
#endif
#ifndef THREADS
#define THREADS 256
#endif
#ifndef NB
#define NB 1
#endif

#if VW == 4
typedef float4 floatv;
#define VLOAD vload4
#elif VW == 2
typedef float2 floatv;
#define VLOAD vload2
#else
typedef float floatv;
#define VLOAD(o, p) ((p)[o])
#endif

#define OUTS (ROWS * NB)          /* results per work-group */

__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void gemv_rows(MATMUL_SCALARS,
               __global const float *a,
               __global const float *b,
               __global float *r,
               EPILOGUE_BUFFERS
               R_VIEW_ARGS)
{
    __local float part[OUTS * THREADS];      /* [result][item] */
    const uint t = get_local_id(0);
    const uint row0 = get_group_id(0) * ROWS;
    const uint col0 = get_group_id(1) * NB;
    const uint rows = row0 < m ? min(m - row0, (uint)ROWS) : 0;   /* logical rows of this group */

    float acc[ROWS][NB];
    #pragma unroll
    for (uint i = 0; i < ROWS; ++i)
        #pragma unroll
        for (uint j = 0; j < NB; ++j)
            acc[i][j] = 0.0f;

    for (uint k = t * VW; k < l; k += THREADS * VW) {
        floatv bv[NB];
        #pragma unroll
        for (uint j = 0; j < NB; ++j)
            bv[j] = VLOAD(0, b + (size_t)(col0 + j) * l + k);
        #pragma unroll
        for (uint i = 0; i < ROWS; ++i) {
            if (i < rows) {
                const floatv av = VLOAD(0, a + (size_t)(row0 + i) * W + k);
                #pragma unroll
                for (uint j = 0; j < NB; ++j)
                    acc[i][j] += dot(av, bv[j]);
            }
        }
    }

    #pragma unroll
    for (uint i = 0; i < ROWS; ++i)
        #pragma unroll
        for (uint j = 0; j < NB; ++j)
            part[(i * NB + j) * THREADS + t] = acc[i][j];
    /* the THREADS partial sums of each result, added pairwise in a fixed tree */
    for (uint s = THREADS / 2; s > 0; s >>= 1) {
        barrier(CLK_LOCAL_MEM_FENCE);
        if (t < s)
            for (uint e = 0; e < OUTS; ++e)
                part[e * THREADS + t] += part[e * THREADS + t + s];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint e = t; e < OUTS; e += THREADS) {
        const uint row = row0 + e / NB, col = col0 + e % NB;
        R_AT(row, col) = EPILOGUE(part[e * THREADS], row, col);
    }
}
