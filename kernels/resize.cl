/* Image resizing as TensorFlow's tf.image.resize computes it without antialiasing (Keras Resizing,
 * UpSampling2D with an interpolation other than "nearest"): scale = IH / OH and IW / OW in float,
 * as its ResizeNearestNeighbor, ResizeBilinear and ResizeBicubic kernels with half_pixel_centers
 * and its ResizeArea kernel:
 *
 *   MODE 0 (nearest)   R[ch, (img, oy, ox)] = A[ch, (img, min(floor((oy + 0.5) * sy), IH - 1), ...)]
 *   MODE 1 (bilinear)  in = (oy + 0.5) * sy - 0.5; rows floor(in) and ceil(in) clamped to the image,
 *                      weight in - floor(in); top = tl + (tr - tl) * wx, bottom likewise,
 *                      R = top + (bottom - top) * wy
 *   MODE 2 (bicubic)   in as bilinear; the four taps floor(in) - 1 .. floor(in) + 2 weighted by
 *                      Keys' cubic convolution with a = -0.5 at the distance in - floor(in)
 *                      rounded to a multiple of 1/1024 (TensorFlow's coefficient table); a tap
 *                      outside the image weighs 0 and the four weights are divided by their sum
 *                      (where it is not tiny); each of the four columns summed over the rows, then
 *                      the columns
 *   MODE 3 (area)      the input pixels the output pixel's cell [oy * sy, (oy + 1) * sy) x
 *                      [ox * sx, (ox + 1) * sx) covers, each weighted by the part of it covered,
 *                      the sum times 1 / (sy * sx) (no half-pixel offset, as ResizeArea)
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

/* Keys' cubic convolution kernel (a = -0.5) at a distance d in [0, 1] and at d in [1, 2] */
inline float cubic_near(const float d) { return (1.5f * d - 2.5f) * d * d + 1.0f; }
inline float cubic_far(const float d) { return ((-0.5f * d + 2.5f) * d - 4.0f) * d + 2.0f; }

/* The weights of the taps first .. first + 3 (first = floor(in) - 1) at the source position `in`
 * along an axis of `size` pixels, as TensorFlow's GetWeightsAndIndices with Keys' cubic */
inline float4 cubic_weights(const float in, const int first, const int size)
{
    const int offset = (int)rint((in - floor(in)) * 1024.0f);
    const float d = (float)offset / 1024.0f, e = (float)(1024 - offset) / 1024.0f;
    const float w0 = first >= 0 && first < size ? cubic_far(d + 1.0f) : 0.0f;
    const float w1 = first + 1 >= 0 && first + 1 < size ? cubic_near(d) : 0.0f;
    const float w2 = first + 2 >= 0 && first + 2 < size ? cubic_near(e) : 0.0f;
    const float w3 = first + 3 >= 0 && first + 3 < size ? cubic_far(e + 1.0f) : 0.0f;
    const float sum = w0 + w1 + w2 + w3;
    const float scale = fabs(sum) >= 1000.0f * FLT_MIN ? 1.0f / sum : 1.0f;
    return (float4)(w0 * scale, w1 * scale, w2 * scale, w3 * scale);
}

/* Column x of the rows y0 .. y0 + 3 (each clamped to the image) summed with the weights wy */
inline float cubic_column(__global const float *a, uint row, uint base, const int y0, const int x, const float4 wy,
                          uint H, uint W)
{
    return resize_read(a, row, base, clamp(y0, 0, IH - 1), x, H, W) * wy.x
           + resize_read(a, row, base, clamp(y0 + 1, 0, IH - 1), x, H, W) * wy.y
           + resize_read(a, row, base, clamp(y0 + 2, 0, IH - 1), x, H, W) * wy.z
           + resize_read(a, row, base, clamp(y0 + 3, 0, IH - 1), x, H, W) * wy.w;
}

/* The part of input cell i inside [lo, hi), as TensorFlow's ResizeArea computes it */
inline float area_part(const int i, const float lo, const float hi, const float full)
{
    const float f = (float)i;
    return f < lo ? (f + 1.0f > hi ? full : f + 1.0f - lo) : (f + 1.0f > hi ? hi - f : 1.0f);
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
#elif MODE == 1
        const float iny = ((float)pixel.y + 0.5f) * sy - 0.5f, inx = ((float)pixel.z + 0.5f) * sx - 0.5f;
        const float fy = floor(iny), fx = floor(inx);
        const int y0 = max((int)fy, 0), y1 = min((int)ceil(iny), IH - 1);
        const int x0 = max((int)fx, 0), x1 = min((int)ceil(inx), IW - 1);
        const float wy = iny - fy, wx = inx - fx;
        const float tl = resize_read(a, row, base, y0, x0, H, W), tr = resize_read(a, row, base, y0, x1, H, W);
        const float bl = resize_read(a, row, base, y1, x0, H, W), br = resize_read(a, row, base, y1, x1, H, W);
        const float top = tl + (tr - tl) * wx, bottom = bl + (br - bl) * wx;
        v = top + (bottom - top) * wy;
#elif MODE == 2
        const float iny = ((float)pixel.y + 0.5f) * sy - 0.5f, inx = ((float)pixel.z + 0.5f) * sx - 0.5f;
        const int y0 = (int)floor(iny) - 1, x0 = (int)floor(inx) - 1;
        const float4 wy = cubic_weights(iny, y0, IH), wx = cubic_weights(inx, x0, IW);
        v = cubic_column(a, row, base, y0, clamp(x0, 0, IW - 1), wy, H, W) * wx.x
            + cubic_column(a, row, base, y0, clamp(x0 + 1, 0, IW - 1), wy, H, W) * wx.y
            + cubic_column(a, row, base, y0, clamp(x0 + 2, 0, IW - 1), wy, H, W) * wx.z
            + cubic_column(a, row, base, y0, clamp(x0 + 3, 0, IW - 1), wy, H, W) * wx.w;
#else
        const float ylo = (float)pixel.y * sy, yhi = (float)(pixel.y + 1u) * sy;
        const float xlo = (float)pixel.z * sx, xhi = (float)(pixel.z + 1u) * sx;
        const int y_start = (int)floor(ylo), y_end = (int)ceil(yhi);
        const int x_start = (int)floor(xlo), x_end = (int)ceil(xhi);
        const float first_x = area_part(x_start, xlo, xhi, sx), last_x = area_part(x_end - 1, xlo, xhi, sx);
        float sum = 0.0f;
        for (int i = y_start; i < y_end; ++i) {
            const int y = clamp(i, 0, IH - 1);
            float along = resize_read(a, row, base, y, clamp(x_start, 0, IW - 1), H, W) * first_x;
            if (x_start + 1 != x_end) {
                for (int j = x_start + 1; j < x_end - 1; ++j)
                    along += resize_read(a, row, base, y, clamp(j, 0, IW - 1), H, W);
                along += resize_read(a, row, base, y, clamp(x_end - 1, 0, IW - 1), H, W) * last_x;
            }
            sum += along * area_part(i, ylo, yhi, sy);
        }
        v = sum * (1.0f / (sy * sx));
#endif
    }
    r[MALINN_INDEX_R(row, col, h, w)] = v;
}
