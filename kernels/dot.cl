/* Keras's Dot layer (batch_dot over one axis of each input) on tensors held as matrix views
 *, in any layouts.
 *
 * R[s, p, q] = sum_k A[s*AB + p*AP + k*AK] * B[s*BB + q*BQ + k*BK] over k < DK (flat row-major
 * indices of A and B, sample s), for R of shape (batch, DP, DQ) (axes of 1 dropped as Keras does).
 * NORMALIZE=1 divides by both operands' L2 norms along k, each sum of squares at least
 * NORM_FLOOR (tf_keras's l2_normalize: 1e-12; Keras 3's normalize: 1e-14). The padding of R is
 * written as 0. The runtime prepends MALINN_INDEX_A / _B / _R. OpenCL C 1.2.
 */

#ifndef DP
#define DP 1
#endif
#ifndef DQ
#define DQ 1
#endif
#ifndef DK
#define DK 1
#endif
#ifndef AB
#define AB 1
#endif
#ifndef AP
#define AP 0
#endif
#ifndef AK
#define AK 1
#endif
#ifndef BB
#define BB 1
#endif
#ifndef BQ
#define BQ 0
#endif
#ifndef BK
#define BK 1
#endif
#ifndef NORMALIZE
#define NORMALIZE 0
#endif
#ifndef NORM_FLOOR
#define NORM_FLOOR 1e-12f
#endif

__kernel void batch_dot(uint m, uint n, uint h, uint w, uint M, uint H, uint W, uint K, uint l, uint c,
                  __global const float *a,
                  __global const float *b,
                  __global float *r)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    float v = 0.0f;
    if (row < m && col < n) {
        const ulong f = (ulong)col * m + row;
        const ulong t = f / DQ;                   /* remainders spelt out: no LLVM freeze (Oclgrind) */
        const ulong q = f - t * DQ;
        const ulong s = t / DP;
        const ulong p = t - s * DP;
        const ulong a0 = s * AB + p * AP, b0 = s * BB + q * BQ;
        float sa = 0.0f, sb = 0.0f;
        for (uint k = 0; k < DK; ++k) {
            const ulong ga = a0 + (ulong)k * AK, gb = b0 + (ulong)k * BK;
            const ulong ca = ga / M, cb = gb / K;
            const float x = a[MALINN_INDEX_A((uint)(ga - ca * M), (uint)ca, H, W)];
            const float y = b[MALINN_INDEX_B((uint)(gb - cb * K), (uint)cb, l, c)];
            v += x * y;
#if NORMALIZE
            sa += x * x;
            sb += y * y;
#endif
        }
#if NORMALIZE
        v = v / (sqrt(fmax(sa, NORM_FLOOR)) * sqrt(fmax(sb, NORM_FLOOR)));
#endif
    }
    r[MALINN_INDEX_R(row, col, h, w)] = v;
}
