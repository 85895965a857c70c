/* Transposed convolution (Keras Conv1DTranspose, Conv2DTranspose), direct: each output pixel sums
 * the input pixels and kernel taps that map onto it. Keras scatters input pixel i through tap k to
 * output pixel i*S + k*D - P; gathered per output pixel o, tap k reads input pixel (o + P - k*D) / S
 * where that is a whole number inside the image:
 *   R[o, (img, oy, ox)] = EPILOGUE(sum over (ky, kx, ch) of A[o, (ky*KW + kx)*CIN + ch]
 *                                  * B[ch, (img, (oy + PT - ky*DH) / SH, (ox + PL - kx*DW) / SW)]).
 *
 * Matrix views: B is CIN x (batch*IH*IW), R is COUT x (batch*OH*OW), A is COUT x KH*KW*CIN (Keras's
 * kernel[ky, kx, o, ch] at row o, column (ky*KW + kx)*CIN + ch). B and R in any layout (the
 * runtime prepends MALINN_INDEX_A/B/R); one work item per element of R, its padding written as 0
 * by the epilogue.
 *
 * Compile-time parameters (-D defines, set per layer by the plan): KH, KW, DH, DW (window.clh), CIN
 * the input channels (default 1); with WINDOW_ARGS 1, as the library entry has it, IH, IW, OH, OW,
 * SH, SW, PT, PL are the last arguments (window.clh; PT and PL the padding Keras removes from the
 * top and left of the full output); BIAS, ACTIVATION, AFFINE the epilogue; WEIGHT_BITS the
 * precision of A (weights.clh; the sums float in every precision).
 * Scalars: l, c padded rows and columns of B; h, w of R; m, n logical rows and columns of R; H, W
 * padded rows and columns of A; p0..p3. OpenCL C 1.2.
 */

#ifndef CIN
#define CIN 1
#endif

__kernel void conv_transpose(uint l, uint c, uint h, uint w, uint m, uint n, uint H, uint W,
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
        for (int ky = 0; ky < KH; ++ky) {
            const int ty = (int)oy + PT - ky * DH;
            if (ty < 0)
                break;   /* ty falls as ky grows */
            const int iy = ty / SH;
            if (iy * SH != ty || iy >= IH)
                continue;
            for (int kx = 0; kx < KW; ++kx) {
                const int tx = (int)ox + PL - kx * DW;
                if (tx < 0)
                    break;
                const int ix = tx / SW;
                if (ix * SW != tx || ix >= IW)
                    continue;
                const uint pixel_col = base + (uint)(iy * IW + ix);
                const uint tap = (uint)(ky * KW + kx) * CIN;
                for (uint ch = 0; ch < CIN; ++ch)
                    acc += LOAD_W(MALINN_INDEX_A(row, tap + ch, H, W), a) * b[MALINN_INDEX_B(ch, pixel_col, l, c)];
            }
        }
    }
    r[MALINN_INDEX_R(row, col, h, w)] = EPILOGUE(acc, row, col);
}
