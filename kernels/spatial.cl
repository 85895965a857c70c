/* Spatial re-indexing without arithmetic (Keras ZeroPadding1D/2D, Cropping1D/2D, UpSampling1D/2D
 * nearest), and the patch matrix of im2col/im2row:
 *
 *   spatial_copy  R[ch, (img, oy, ox)] = A[ch, (img, (oy + OY) / UY, (ox + OX) / UX)], 0 where the
 *                 source pixel is outside the image: ZeroPadding is OY = -top, OX = -left, U = 1;
 *                 Cropping is OY = top, OX = left; UpSampling (nearest) is O = 0, U = the size.
 *   im2col        R[(ky*KW + kx)*CIN + ch, (img, oy, ox)] = A[ch, (img, oy*SH + ky*DH - PT,
 *                 ox*SW + kx*DW - PL)], 0 outside the image: the k^2-times patch matrix a GEMM with
 *                 the COUT x KH*KW*CIN weights turns into a convolution. Its library entries fix
 *                 R's layout: "R" (im2col, one patch element per row) or "C" (im2row, a pixel's
 *                 patch contiguous).
 *
 * Matrix views: column = (image*H + y)*W + x. A and R in any layout (the
 * runtime prepends MALINN_INDEX_A and MALINN_INDEX_R); R's padding written as 0.
 * Compile-time parameters (-D defines, set per layer by the plan): IH, IW, OH, OW; OY, OX, UY, UX
 * (spatial_copy); KH, KW, SH, SW, DH, DW, PT, PL, CIN (im2col). With WINDOW_ARGS 1 (the library
 * entry of spatial_copy has it; im2col's stay defines: as arguments it ran 1.3x slower on PoCL),
 * IH, IW, OH, OW, SH, SW, PT, PL and the division magic (window.clh), then OY, OX (spatial_copy)
 * or CIN and its division magic CIN_M, CIN_L (im2col) are the last arguments instead, in that
 * order. Scalars: m, n logical rows and
 * columns of R, H, W padded rows and columns of A, h, w of R. OpenCL C 1.2.
 */

#if WINDOW_ARGS
#define SPATIAL_PARAMS WINDOW_PARAMS, const int OY, const int OX
#define IM2COL_PARAMS WINDOW_PARAMS, const int CIN, const uint CIN_M, const uint CIN_L
#define CIN_DIVIDE(n) window_divide((n), CIN_M, CIN_L)
#else
#define SPATIAL_PARAMS
#define IM2COL_PARAMS
#ifndef OY
#define OY 0
#endif
#ifndef OX
#define OX 0
#endif
#ifndef CIN
#define CIN 1
#endif
#define CIN_DIVIDE(n) ((n) / CIN)
#endif
#ifndef UY
#define UY 1
#endif
#ifndef UX
#define UX 1
#endif

__kernel void spatial_copy(uint m, uint n, uint H, uint W, uint h, uint w,
                           __global const float *a,
                           __global float *r
                           SPATIAL_PARAMS)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    float v = 0.0f;
    if (row < m && col < n) {
        const uint3 pixel = window_pixel(col);
        const uint image = pixel.x, oy = pixel.y, ox = pixel.z;
        const int sy = (int)oy + OY, sx = (int)ox + OX;
        if (sy >= 0 && sy < IH * UY && sx >= 0 && sx < IW * UX)
            v = a[MALINN_INDEX_A(row, image * (IH * IW) + (uint)(sy / UY) * IW + (uint)(sx / UX), H, W)];
    }
    r[MALINN_INDEX_R(row, col, h, w)] = v;
}

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
