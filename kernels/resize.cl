/* Image resizing as TensorFlow's tf.image.resize computes it without antialiasing (Keras Resizing,
 * UpSampling2D with interpolation "bilinear"): half-pixel centres, scale = IH / OH and IW / OW in
 * float, as its ResizeBilinear and ResizeNearestNeighbor kernels with half_pixel_centers:
 *
 *   MODE 0 (nearest)   R[ch, (img, oy, ox)] = A[ch, (img, min(floor((oy + 0.5) * sy), IH - 1), ...)]
 *   MODE 1 (bilinear)  in = (oy + 0.5) * sy - 0.5; rows floor(in) and ceil(in) clamped to the image,
 *                      weight in - floor(in); top = tl + (tr - tl) * wx, bottom likewise,
 *                      R = top + (bottom - top) * wy
 *
 * Matrix views: column = (image*H + y)*W + x. A and R in any layout (the
 * runtime prepends MALINN_INDEX_A and MALINN_INDEX_R); R's padding written as 0.
 * Compile-time parameters (-D defines, set per layer by the plan): IH, IW, OH, OW (window.clh, with
 * WINDOW_ARGS 0), MODE (default 1). Scalars: m, n logical rows and columns of R, H, W padded rows
 * and columns of A, h, w of R. OpenCL C 1.2.
 */

#ifndef MODE
#define MODE 1
#endif

inline float resize_read(__global const float *a, uint row, uint base, int y, int x, uint H, uint W)
{
    return a[MALINN_INDEX_A(row, base + (uint)(y * IW + x), H, W)];
}

__kernel void resize_image(uint m, uint n, uint H, uint W, uint h, uint w,
                           __global const float *a,
                           __global float *r)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    float v = 0.0f;
    if (row < m && col < n) {
        const uint3 pixel = window_pixel(col);
        const uint base = pixel.x * (IH * IW);
        const float sy = (float)IH / (float)OH, sx = (float)IW / (float)OW;
#if MODE == 0
        const int y = clamp((int)floor(((float)pixel.y + 0.5f) * sy), 0, IH - 1);
        const int x = clamp((int)floor(((float)pixel.z + 0.5f) * sx), 0, IW - 1);
        v = resize_read(a, row, base, y, x, H, W);
#else
        const float iny = ((float)pixel.y + 0.5f) * sy - 0.5f, inx = ((float)pixel.z + 0.5f) * sx - 0.5f;
        const float fy = floor(iny), fx = floor(inx);
        const int y0 = max((int)fy, 0), y1 = min((int)ceil(iny), IH - 1);
        const int x0 = max((int)fx, 0), x1 = min((int)ceil(inx), IW - 1);
        const float wy = iny - fy, wx = inx - fx;
        const float tl = resize_read(a, row, base, y0, x0, H, W), tr = resize_read(a, row, base, y0, x1, H, W);
        const float bl = resize_read(a, row, base, y1, x0, H, W), br = resize_read(a, row, base, y1, x1, H, W);
        const float top = tl + (tr - tl) * wx, bottom = bl + (br - bl) * wx;
        v = top + (bottom - top) * wy;
#endif
    }
    r[MALINN_INDEX_R(row, col, h, w)] = v;
}
