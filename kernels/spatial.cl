/* Spatial re-indexing without arithmetic (Keras ZeroPadding1D/2D, Cropping1D/2D, UpSampling1D/2D
 * nearest):
 *
 *   spatial_copy  R[ch, (img, oy, ox)] = A[ch, (img, (oy + OY) / UY, (ox + OX) / UX)], 0 where the
 *                 source pixel is outside the image: ZeroPadding is OY = -top, OX = -left, U = 1;
 *                 Cropping is OY = top, OX = left; UpSampling (nearest) is O = 0, U = the size.
 *
 * Matrix views: column = (image*H + y)*W + x. A and R in any layout (the
 * runtime prepends MALINN_INDEX_A and MALINN_INDEX_R); R's padding written as 0.
 * Compile-time parameters (-D defines, set per layer by the plan): IH, IW, OH, OW, OY, OX, UY, UX.
 * With WINDOW_ARGS 1 (the library entry has it), IH, IW, OH, OW, SH, SW, PT, PL and the division
 * magic (window.clh), then OY, OX are the last arguments instead, in that order. Scalars: m, n
 * logical rows and columns of R, H, W padded rows and columns of A, h, w of R. The patch matrix of
 * im2col/im2row is kernels/im2col.cl: a program holds only the kernel its layers launch (PoCL
 * compiles every kernel of a program when its binary is read). OpenCL C 1.2.
 */

#if WINDOW_ARGS
#define SPATIAL_PARAMS WINDOW_PARAMS, const int OY, const int OX
#else
#define SPATIAL_PARAMS
#ifndef OY
#define OY 0
#endif
#ifndef OX
#define OX 0
#endif
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
