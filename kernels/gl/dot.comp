/* Keras's Dot layer (batch_dot over one axis of each input, optionally L2-normalized), any
 * layouts: the GLSL ES 3.10 twin of dot.cl (read it for the design).
 *   R[s, p, q] = sum_k A[s*AB + p*AP + k*AK] * B[s*BB + q*BQ + k*BK], k < DK (flat indices),
 *   NORMALIZE=1 divides by both operands' L2 norms along k (each sum of squares at least
 *   NORM_FLOOR). R's padding is written as 0. */

/* NVIDIA's GLSL compiler unrolls every constant-bound loop under the preamble's #pragma
 * optionNV(unroll all): the loops over DK (the summed axis, up to thousands) unrolled with a layout's
 * index arithmetic did not finish building in 50 s on an H200 (driver 580), so they stay loops
 * (other compilers ignore the pragma). */
#pragma optionNV(unroll none)

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
#define NORM_FLOOR 1e-12
#endif

MALINN_ARGS(uint m; uint n; uint h; uint w; uint M; uint H; uint W; uint K; uint l; uint c;)
layout(std430, binding = 0) readonly buffer BufA { float a[]; };
layout(std430, binding = 1) readonly buffer BufB { float b[]; };
layout(std430, binding = 2) writeonly buffer BufR { float r[]; };

void main() {
    MALINN_GUARD
    uint row = MALINN_GLOBAL_X;
    uint col = MALINN_GLOBAL_Y;
    float v = 0.0;
    if (row < m && col < n) {
        uint f = col * m + row;
        uint t = f / uint(DQ);
        uint q = f % uint(DQ);
        uint s = t / uint(DP);
        uint p = t % uint(DP);
        uint a0 = s * uint(AB) + p * uint(AP);
        uint b0 = s * uint(BB) + q * uint(BQ);
        float sa = 0.0, sb = 0.0;
        for (uint k = 0u; k < uint(DK); ++k) {
            uint ga = a0 + k * uint(AK), gb = b0 + k * uint(BK);
            float x = a[MALINN_INDEX_A(ga % M, ga / M, H, W)];
            float y = b[MALINN_INDEX_B(gb % K, gb / K, l, c)];
            v += x * y;
#if NORMALIZE
            sa += x * x;
            sb += y * y;
#endif
        }
#if NORMALIZE
        v = v / (sqrt(max(sa, NORM_FLOOR)) * sqrt(max(sb, NORM_FLOOR)));
#endif
    }
    r[MALINN_INDEX_R(row, col, h, w)] = v;
}
