/* Matrix times a few vectors, R = A x B for small batches (a Dense layer at batch 1..8), built to
 * read the weights A once at memory bandwidth, with the fused epilogue of epilogue.clh; with
 * SOFTMAX=1 (the gemv_softmax entry) a work-group holds whole columns of R and finishes them with a
 * softmax, so a classifier head Dense(units, activation="softmax") is one launch.
 *
 * A is M x K column-major (the layout gemm_tiled reads, so one weight buffer serves both), read
 * with stride H, in columns < l and in the vectors of VW rows that hold a logical row only: any
 * padding of A with H >= m rounded up to VW and W >= l serves ("logicalRows" in
 * kernels/library.json), however far R is padded. B is K x N row-major (l x w), R is
 * M x N row-major (h x w): the layouts gemm_tiled
 * reads and writes, so a network mixing the two chains without re-layout. The K loop runs over
 * k < l only. After the CLBlast XgemvFast idea (vector loads along M, several rows per item), with
 * K split inside the work-group so that even a layer with few rows has many work items in flight:
 *
 *   work-group  MDIM x KSPLIT items; it computes MDIM * VW * WPT rows by NB columns of R
 *   item (tm, tk)  VW * WPT contiguous rows from row0 (WPT vector loads of A per k, a vector
 *                  accumulator per vector and column), columns col0 .. col0 + NB - 1, over
 *                  k = tk, tk + KSPLIT, ... < l
 *   then the KSPLIT partial sums of each result are added in local memory in a fixed tree
 *   (no atomics: the same inputs give bit-identical results on every run), and the epilogue
 *   writes R, its padding as 0.
 *
 * The global range is (h / (VW * WPT)) x (w / NB * KSPLIT) (kernels/library.json: "ndrange",
 * "scale" and "split"); h is a multiple of MDIM * VW * WPT and w of NB.
 *
 * Compile-time parameters (-D defines; candidates in kernels/library.json):
 *   VW      rows per vector load of A (1, 2, 4, 8 or 16)
 *   WPT     vector loads per item and k (GPUs: 1; CPUs: more, so that an item reads a long
 *           contiguous run of each column of A, which the prefetchers follow)
 *   MDIM    items along M per work-group
 *   KSPLIT  items along K per work-group, a power of 2 (their partial sums are reduced in local
 *           memory)
 *   NB      columns of B (samples) per work-group
 *   BIAS, ACTIVATION, AFFINE  the fused epilogue (epilogue.clh)
 *   WEIGHT_BITS, HALF_ARITHMETIC  the precision of A and of the sums (weights.clh)
 *   SOFTMAX 1: softmax over each column after the bias (ACTIVATION is then unused), AFFINE after
 *           it; needs m <= MDIM * VW * WPT, so that one work-group holds whole columns (the entry's
 *           preconditions say so). NaN and Inf propagate as in softmax.cl: a NaN in a column makes
 *           that column NaN, and no other.
 * OpenCL C 1.2.
 */

#ifndef VW
#define VW 4
#endif
#ifndef MDIM
#define MDIM 32
#endif
#ifndef KSPLIT
#define KSPLIT 8
#endif
#ifndef WPT
#define WPT 1
#endif
#ifndef NB
#define NB 1
#endif
#ifndef SOFTMAX
#define SOFTMAX 0
#endif

#define RPI (VW * WPT)            /* rows of R per item, contiguous */
#define ROWS (MDIM * RPI)         /* rows of R per work-group */
#define OUTS (ROWS * NB)          /* results per work-group */
#define THREADS (MDIM * KSPLIT)

/* accv: VW sums in the precision of weights.clh; LOAD_A reads VW weights of a column; VSTORE
 * writes VW floats (partial sums are exchanged and finished in float) */
#if VW == 16
typedef acc16_t accv;
#define LOAD_A LOAD_W16
#define TO_FLOATV convert_float16
#define VSTORE vstore16
#elif VW == 8
typedef acc8_t accv;
#define LOAD_A LOAD_W8
#define TO_FLOATV convert_float8
#define VSTORE vstore8
#elif VW == 4
typedef acc4_t accv;
#define LOAD_A LOAD_W4
#define TO_FLOATV convert_float4
#define VSTORE vstore4
#elif VW == 2
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

#if KSPLIT == 1
#define FIRST_K 0        /* the same K loop in every item */
#else
#define FIRST_K tk
#endif

__kernel __attribute__((reqd_work_group_size(MDIM, KSPLIT, 1)))
void gemv(MATMUL_SCALARS,
          __global const WEIGHT *a,
          __global const float *b,
          __global float *r,
          EPILOGUE_BUFFERS
          R_VIEW_ARGS)
{
#if KSPLIT > 1 || SOFTMAX
    __local float part[KSPLIT * OUTS];      /* [tk][column in group][row in group] */
#endif
#if SOFTMAX
    __local float stat[THREADS];
    __local float top[NB], total[NB];
#endif
    const uint tm = get_local_id(0);
    const uint tk = get_local_id(1);
    const uint rowg = get_group_id(0) * ROWS;   /* first row of the work-group */
    const uint row0 = rowg + tm * RPI;          /* first row of this item */
    const uint col0 = get_group_id(1) * NB;     /* first column of the work-group */

    accv acc[WPT][NB];
    #pragma unroll
    for (uint p = 0; p < WPT; ++p)
        #pragma unroll
        for (uint j = 0; j < NB; ++j)
            acc[p][j] = (accv)(ACC_ZERO);

    /* per k: WPT vectors of A (RPI contiguous rows of column k) times NB values of B. A is read
     * only in the vectors that hold a logical row: its rows are padded to a multiple of VW, so
     * these lie inside it, and the rest count as 0 (their results are R's padding) */
    const uint vectors = row0 < m ? min((uint)WPT, (m - row0 + VW - 1) / VW) : 0;
    for (uint k = vectors ? FIRST_K : l; k < l; k += KSPLIT) {
        const __global WEIGHT *ak = a + (size_t)k * H + row0;
        acc_t bv[NB];
        #pragma unroll
        for (uint j = 0; j < NB; ++j)
            bv[j] = TO_ACC(B_AT(k, col0 + j));
        #pragma unroll
        for (uint p = 0; p < WPT; ++p) {
            const accv av = p < vectors ? LOAD_A(p, ak) : (accv)(ACC_ZERO);
            #pragma unroll
            for (uint j = 0; j < NB; ++j)
                acc[p][j] += av * bv[j];
        }
    }

#if KSPLIT > 1 || SOFTMAX
    #pragma unroll
    for (uint p = 0; p < WPT; ++p)
        #pragma unroll
        for (uint j = 0; j < NB; ++j)
            VSTORE(TO_FLOATV(acc[p][j]), p, part + tk * OUTS + j * ROWS + tm * RPI);
    /* the KSPLIT partial sums of each result, added pairwise in a fixed tree (KSPLIT is a power
     * of 2): slice tk += slice tk + s, for s = KSPLIT / 2, ..., 1; the sums end in slice 0 */
    for (uint s = KSPLIT / 2; s > 0; s >>= 1) {
        barrier(CLK_LOCAL_MEM_FENCE);
        if (tk < s) {
            __local float *mine = part + tk * OUTS + tm * RPI;
            for (uint j = 0; j < NB; ++j)
                for (uint i = 0; i < RPI; ++i)
                    mine[j * ROWS + i] += mine[s * OUTS + j * ROWS + i];
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    const uint t = tk * MDIM + tm;
    for (uint e = t; e < OUTS; e += THREADS) {
        float s = part[e];
        const uint row = rowg + e % ROWS, col = col0 + e / ROWS;
#if SOFTMAX
        if (row < m)
            s *= WEIGHT_SCALE(row);
#if BIAS
        if (row < m)
            s += bias[row];
#endif
        part[e] = s;                            /* only this item reads or writes part[e] */
#else
        R_AT(row, col) = EPILOGUE(s, row, col);
#endif
    }
#else
    #pragma unroll
    for (uint p = 0; p < WPT; ++p)
        #pragma unroll
        for (uint j = 0; j < NB; ++j) {
            float t[VW];
            VSTORE(TO_FLOATV(acc[p][j]), 0, t);
            for (uint i = 0; i < VW; ++i) {
                const uint row = row0 + p * VW + i;
                R_AT(row, col0 + j) = EPILOGUE(t[i], row, col0 + j);
            }
        }
#endif

#if SOFTMAX
    /* softmax over the rows < m of each of the NB columns (MDIM * KSPLIT is a multiple of NB): max, then sum of exp(x - max), each
     * first per item over a strided set of rows, then over the items in order */
    barrier(CLK_LOCAL_MEM_FENCE);
    const uint rows = rowg < m ? min(m - rowg, (uint)ROWS) : 0;   /* all of m when m <= ROWS */
    const uint jc = t % NB, slot = t / NB;
    float x = -INFINITY;
    for (uint i = slot; i < rows; i += THREADS / NB)
        x = fmax(x, part[jc * ROWS + i]);
    stat[t] = x;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (t < NB) {
        float v = -INFINITY;
        for (uint q = 0; q < THREADS / NB; ++q)
            v = fmax(v, stat[q * NB + t]);
        top[t] = v;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    x = 0.0f;
    for (uint i = slot; i < rows; i += THREADS / NB)
        x += exp(part[jc * ROWS + i] - top[jc]);
    stat[t] = x;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (t < NB) {
        float v = 0.0f;
        for (uint q = 0; q < THREADS / NB; ++q)
            v += stat[q * NB + t];
        total[t] = v;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint e = t; e < OUTS; e += THREADS) {
        const uint j = e / ROWS, row = rowg + e % ROWS, col = col0 + j;
        float v = 0.0f;
        if (row < m && col < n) {
            v = exp(part[e] - top[j]) / total[j];
#if AFFINE
            v = v * scale[row] + shift[row];
#endif
        }
        R_AT(row, col) = v;
    }
#endif
}
