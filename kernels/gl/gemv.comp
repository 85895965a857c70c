/* Matrix times a few vectors, R = A x B for small batches, with the fused epilogue (matmul.glsl)
 * and, with SOFTMAX=1 (the gemv_softmax entry), a softmax over each column: the GLSL ES 3.10 twin
 * of gemv.cl, from the same library entries and defines (read gemv.cl for the design).
 *
 *   work-group  MDIM x KSPLIT invocations; it computes MDIM * VW * WPT rows by NB columns of R
 *   invocation (tm, tk)  VW * WPT contiguous rows from row0, columns col0 .. col0 + NB - 1, over
 *                  k = tk, tk + KSPLIT, ... < l; the KSPLIT partial sums are added in shared
 *                  memory in a fixed tree (bit-identical from run to run)
 * A (column-major, stride H) is read only in the runs of VW rows that hold a logical row: as vec4
 * loads where VW is a multiple of 4, vec2 where it is 2, else scalar; VW and WPT set how many contiguous rows an
 * invocation reads. KERAS_ORDER=1 (the
 * gemv_c family) reads B and writes R column-major (matmul.glsl).
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

#if VW * WPT * NB > 256
/* An invocation's tile of more than 256 sums (the CPU shapes: 16 x 8-16 rows by 2 or more columns)
 * does not fit in registers however it is compiled; unrolled as the preamble asks
 * (optionNV(unroll all)), NVIDIA's GL compiler spent 44-52 s and more on each (0.1 s without; benchmarks/results/gl_unroll_before_nvidia_h200.json) */
#pragma optionNV(unroll none)
#endif

#if VW % 4 == 0
/* A again, as vec4 (vec2 where VW is 2): H and every run's first row are multiples of VW (the
 * entry's rowAlign), so a run of VW rows is VW / 4 aligned vec4 loads (one vec2) */
layout(std430, binding = 0) readonly buffer BufA4 { vec4 a4[]; };
#elif VW == 2
layout(std430, binding = 0) readonly buffer BufA2 { vec2 a2[]; };
#endif

#define RPI (VW * WPT)            /* rows of R per invocation, contiguous */
#define ROWS (MDIM * RPI)         /* rows of R per work-group */
#define OUTS (ROWS * NB)          /* results per work-group */
#define THREADS (MDIM * KSPLIT)

#if KSPLIT > 1 || SOFTMAX
shared float part[KSPLIT * OUTS];      /* [tk][column in group][row in group] */
#endif
#if SOFTMAX
shared float stat[THREADS];
shared float top[NB];
shared float total[NB];
#endif

void main() {
    MALINN_GROUP_GUARD   /* a folded dispatch's extra work-groups (GLDevice.bind) */
    uint tm = gl_LocalInvocationID.x;
    uint tk = gl_LocalInvocationID.y;
    uint rowg = MALINN_GROUP_X * uint(ROWS);
    uint row0 = rowg + tm * uint(RPI);
    uint col0 = MALINN_GROUP_Y * uint(NB);

    float acc[RPI][NB];
    for (int q = 0; q < RPI; ++q)
        for (int j = 0; j < NB; ++j)
            acc[q][j] = 0.0;

    uint vectors = row0 < m ? min(uint(WPT), (m - row0 + uint(VW) - 1u) / uint(VW)) : 0u;
#if KSPLIT == 1
    uint first = 0u;
#else
    uint first = tk;
#endif
    for (uint k = vectors > 0u ? first : l; k < l; k += uint(KSPLIT)) {
        uint ak = k * H + row0;
        float bv[NB];
        for (int j = 0; j < NB; ++j)
            bv[j] = B_AT(k, col0 + uint(j));
        for (int p = 0; p < WPT; ++p) {
            if (uint(p) < vectors) {
#if VW % 4 == 0
                for (int q = 0; q < VW / 4; ++q) {
                    vec4 av = a4[(ak + uint(p * VW)) / 4u + uint(q)];
                    for (int i = 0; i < 4; ++i)
                        for (int j = 0; j < NB; ++j)
                            acc[p * VW + q * 4 + i][j] += av[i] * bv[j];
                }
#elif VW == 2
                vec2 av = a2[(ak + uint(p * VW)) / 2u];
                for (int j = 0; j < NB; ++j) {
                    acc[p * VW][j] += av.x * bv[j];
                    acc[p * VW + 1][j] += av.y * bv[j];
                }
#else
                for (int i = 0; i < VW; ++i) {
                    float av = a[ak + uint(p * VW + i)];
                    for (int j = 0; j < NB; ++j)
                        acc[p * VW + i][j] += av * bv[j];
                }
#endif
            }
        }
    }

#if KSPLIT > 1 || SOFTMAX
    for (int q = 0; q < RPI; ++q)
        for (int j = 0; j < NB; ++j)
            part[tk * uint(OUTS) + uint(j * ROWS) + tm * uint(RPI) + uint(q)] = acc[q][j];
    for (uint s = uint(KSPLIT) / 2u; s > 0u; s >>= 1) {
        memoryBarrierShared();
        barrier();
        if (tk < s) {
            uint mine = tk * uint(OUTS) + tm * uint(RPI);
            for (uint j = 0u; j < uint(NB); ++j)
                for (uint i = 0u; i < uint(RPI); ++i)
                    part[mine + j * uint(ROWS) + i] += part[mine + s * uint(OUTS) + j * uint(ROWS) + i];
        }
    }
    memoryBarrierShared();
    barrier();
    uint t = tk * uint(MDIM) + tm;
    for (uint e = t; e < uint(OUTS); e += uint(THREADS)) {
        float s = part[e];
        uint row = rowg + e % uint(ROWS);
        uint col = col0 + e / uint(ROWS);
#if SOFTMAX
#if BIAS
        if (row < m)
            s += bias[row];
#endif
        part[e] = s;
#else
        R_AT(row, col) = EPILOGUE(s, row, col);
#endif
    }
#else
    for (int p = 0; p < WPT; ++p)
        for (int j = 0; j < NB; ++j)
            for (int i = 0; i < VW; ++i) {
                uint row = row0 + uint(p * VW + i);
                uint col = col0 + uint(j);
                R_AT(row, col) = EPILOGUE(acc[p * VW + i][j], row, col);
            }
#endif

#if SOFTMAX
    /* softmax over the rows < m of each of the NB columns: max, then sum of exp(x - max), each
     * first per invocation over a strided set of rows, then over the invocations in order; a NaN
     * in a column makes the column's maximum NaN, so the whole column is NaN */
    memoryBarrierShared();
    barrier();
    uint rows = rowg < m ? min(m - rowg, uint(ROWS)) : 0u;
    uint jc = t % uint(NB);
    uint slot = t / uint(NB);
    float x = -MALINN_INFINITY;
    for (uint i = slot; i < rows; i += uint(THREADS / NB)) {
        float v = part[jc * uint(ROWS) + i];
        x = (isnan(v) || isnan(x)) ? v + x : max(x, v);
    }
    stat[t] = x;
    memoryBarrierShared();
    barrier();
    if (t < uint(NB)) {
        float v = -MALINN_INFINITY;
        for (uint q = 0u; q < uint(THREADS / NB); ++q) {
            float u = stat[q * uint(NB) + t];
            v = (isnan(u) || isnan(v)) ? u + v : max(v, u);
        }
        top[t] = v;
    }
    memoryBarrierShared();
    barrier();
    x = 0.0;
    for (uint i = slot; i < rows; i += uint(THREADS / NB))
        x += exp(part[jc * uint(ROWS) + i] - top[jc]);
    stat[t] = x;
    memoryBarrierShared();
    barrier();
    if (t < uint(NB)) {
        float v = 0.0;
        for (uint q = 0u; q < uint(THREADS / NB); ++q)
            v += stat[q * uint(NB) + t];
        total[t] = v;
    }
    memoryBarrierShared();
    barrier();
    for (uint e = t; e < uint(OUTS); e += uint(THREADS)) {
        uint j = e / uint(ROWS);
        uint row = rowg + e % uint(ROWS);
        uint col = col0 + j;
        float v = 0.0;
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
