/* Depthwise convolution (Keras DepthwiseConv2D, and the first half of SeparableConv2D), direct:
 * each output channel o = c*DM + j (DM the depth multiplier) reads input channel c = o / DM only,
 * R[o, col] = EPILOGUE(sum over (ky, kx) of A[o, ky*KW + kx] * B[c, shifted(col)]).
 *
 * Matrix views as in conv_gemm.cl: B is CIN x (batch*IH*IW), R is CIN*DM x (batch*OH*OW), A is
 * CIN*DM x KH*KW (Keras's depthwise kernel[ky, kx, c, j] at row c*DM + j, column ky*KW + kx).
 * Taps outside the image read 0. B and R in any layout (the runtime prepends MALINN_INDEX_A/B/R);
 * one work item per element of R, its padding written as 0 by the epilogue.
 *
 * Compile-time parameters (-D defines, set per layer by the plan): IH, IW, OH, OW, KH, KW, SH, SW,
 * DH, DW, PT, PL as in conv_gemm.cl (with WINDOW_ARGS 1, as the library entry has it, IH, IW, OH,
 * OW, SH, SW, PT, PL are the last arguments instead: window.clh); DM the depth multiplier; BIAS, ACTIVATION, AFFINE the epilogue;
 * WEIGHT_BITS the precision of A (weights.clh; int8's per-row scales applied by the epilogue, the
 * sums float in every precision).
 * Scalars: l, c padded rows and columns of B; h, w of R; m, n logical rows and columns of R; H, W
 * padded rows and columns of A; p0..p3. OpenCL C 1.2.
 */

#ifndef DM
#define DM 1
#endif

__kernel void conv_depthwise(uint l, uint c, uint h, uint w, uint m, uint n, uint H, uint W,
                             float p0, float p1, float p2, float p3,
                             __global const WEIGHT *a,
                             __global const float *b,
                             __global float *r,
                             EPILOGUE_BUFFERS
                             WINDOW_PARAMS)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    float acc = 0.0f;
    if (row < m && col < n) {
        const uint3 pixel = window_pixel(col);
        const uint image = pixel.x, oy = pixel.y, ox = pixel.z;
        const uint base = image * (IH * IW);
        const uint channel = row / DM;
        for (uint ky = 0; ky < KH; ++ky) {
            const int iy = (int)(oy * SH + ky * DH) - PT;
            if (iy < 0 || iy >= IH)
                continue;
            for (uint kx = 0; kx < KW; ++kx) {
                const int ix = (int)(ox * SW + kx * DW) - PL;
                if (ix >= 0 && ix < IW)
                    acc += LOAD_W(MALINN_INDEX_A(row, ky * KW + kx, H, W), a)
                         * b[MALINN_INDEX_B(channel, base + (uint)(iy * IW + ix), l, c)];
            }
        }
    }
    r[MALINN_INDEX_R(row, col, h, w)] = EPILOGUE(acc, row, col);
}
