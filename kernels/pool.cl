/* Pooling (Keras MaxPooling1D/2D, AveragePooling1D/2D, GlobalMax/GlobalAveragePooling1D/2D): one
 * work item per element of R, R[ch, col] = max or mean of A[ch, window(col)].
 *
 * Matrix views: A is C x (batch*IH*IW), R is C x (batch*OH*OW), column =
 * (image*H + y)*W + x. The window of output (oy, ox) starts at (oy*SH - PT, ox*SW - PL) and is
 * KH x KW; taps outside the image are left out (TensorFlow's 'same' pooling: the maximum of the
 * taps inside, the mean over the taps inside). A global pooling is the window of the whole image.
 * A and R in any layout (the runtime prepends MALINN_INDEX_A and MALINN_INDEX_R); the padding of
 * R is written as 0.
 *
 * Compile-time parameters (-D defines, set per layer by the plan): IH, IW, OH, OW, KH, KW, SH, SW,
 * PT, PL (with WINDOW_ARGS 1, as the library entry has it, IH, IW, OH, OW, SH, SW, PT, PL are the
 * last arguments instead: window.clh); MAXPOOL 1 for the maximum, 0 for the mean; NAN_PROPAGATES (a maximum's NaN taps) 0 as
 * TensorFlow's max_pool (MaxPooling): NaN taps skipped, the maximum started from -FLT_MAX (a window
 * of only NaN and -inf gives -FLT_MAX), 1 as its reduce_max (GlobalMaxPooling): a NaN tap gives NaN,
 * the maximum started from -inf. Scalars: m, n logical rows and columns of R,
 * H, W padded rows and columns of A, h, w of R. OpenCL C 1.2.
 */

#ifndef MAXPOOL
#define MAXPOOL 1
#endif
#ifndef NAN_PROPAGATES
#define NAN_PROPAGATES 0
#endif
#if NAN_PROPAGATES
#define MAX_START (-INFINITY)
#define MAX_TAKE(acc, x) (isnan(acc) || isnan(x) ? (acc) + (x) : fmax((acc), (x)))
#else
#define MAX_START (-FLT_MAX)
#define MAX_TAKE(acc, x) fmax((acc), (x))
#endif

__kernel void pool(uint m, uint n, uint H, uint W, uint h, uint w,
                   __global const float *a,
                   __global float *r
                   WINDOW_PARAMS)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    float v = 0.0f;
    if (row < m && col < n) {
        const uint3 pixel = window_pixel(col);
        const uint image = pixel.x, oy = pixel.y, ox = pixel.z;
        const uint base = image * (IH * IW);
        const int y0 = (int)(oy * SH) - PT;
        const int x0 = (int)(ox * SW) - PL;
        const int y1 = min(y0 + KH, IH), x1 = min(x0 + KW, IW);
        float acc = MAXPOOL ? MAX_START : 0.0f;
        for (int iy = max(y0, 0); iy < y1; ++iy)
            for (int ix = max(x0, 0); ix < x1; ++ix) {
                const float x = a[MALINN_INDEX_A(row, base + (uint)(iy * IW + ix), H, W)];
                acc = MAXPOOL ? MAX_TAKE(acc, x) : acc + x;
            }
#if MAXPOOL
        v = acc;
#else
        v = acc / (float)((y1 - max(y0, 0)) * (x1 - max(x0, 0)));
#endif
    }
    r[MALINN_INDEX_R(row, col, h, w)] = v;
}
