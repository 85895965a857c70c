/* The patch matrix of im2col/im2row:
 *
 *   im2col        R[(ky*KW + kx)*CIN + ch, (img, oy, ox)] = A[ch, (img, oy*SH + ky*DH - PT,
 *                 ox*SW + kx*DW - PL)], 0 outside the image: the k^2-times patch matrix a GEMM with
 *                 the COUT x KH*KW*CIN weights turns into a convolution. Its library entries fix
 *                 R's layout: "R" (im2col, one patch element per row) or "C" (im2row, a pixel's
 *                 patch contiguous).
 *
 * Matrix views: column = (image*H + y)*W + x. A and R in any layout (the
 * runtime prepends MALINN_INDEX_A and MALINN_INDEX_R); R's padding written as 0.
 * Compile-time parameters (-D defines, set per layer by the plan): IH, IW, OH, OW, KH, KW, SH, SW,
 * DH, DW, PT, PL, CIN (as arguments they ran 1.3x slower on PoCL). With WINDOW_ARGS 1, IH, IW, OH,
 * OW, SH, SW, PT, PL and the division magic (window.clh), then CIN and its division magic CIN_M,
 * CIN_L are the last arguments instead, in that order. Scalars: m, n logical rows and columns of
 * R, H, W padded rows and columns of A, h, w of R. Apart from kernels/spatial.cl's spatial_copy:
 * a program holds only the kernel its layers launch. OpenCL C 1.2.
 */

#if WINDOW_ARGS
#define IM2COL_PARAMS WINDOW_PARAMS, const int CIN, const uint CIN_M, const uint CIN_L
#define CIN_DIVIDE(n) window_divide((n), CIN_M, CIN_L)
#else
#define IM2COL_PARAMS
#ifndef CIN
#define CIN 1
#endif
#define CIN_DIVIDE(n) ((n) / CIN)
#endif

__kernel void im2col(uint m, uint n, uint H, uint W, uint h, uint w,
                     __global const float *a,
                     __global float *r
                     IM2COL_PARAMS)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    float v = 0.0f;
    if (row < m && col < n) {
        const uint tap = CIN_DIVIDE(row);
        const uint ch = row - tap * CIN;
        const uint3 pixel = window_pixel(col);
        const uint image = pixel.x, oy = pixel.y, ox = pixel.z;
        const uint ky = tap / KW;
        const int iy = (int)(oy * SH + ky * DH) - PT;
        const int ix = (int)(ox * SW + (tap - ky * KW) * DW) - PL;
        if (iy >= 0 && iy < IH && ix >= 0 && ix < IW)
            v = a[MALINN_INDEX_A(ch, image * (IH * IW) + (uint)(iy * IW + ix), H, W)];
    }
    r[MALINN_INDEX_R(row, col, h, w)] = v;
}
