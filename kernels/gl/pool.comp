/* Pooling (Max/AveragePooling1D/2D, their Global forms), any layouts: the GLSL ES 3.10 twin of
 * pool.cl (read it for the design). R[ch, col] = max or mean of A[ch, window(col)]; taps outside
 * the image are left out (TensorFlow's 'same' pooling); MAXPOOL 1 for the maximum, 0 for the mean;
 * NAN_PROPAGATES as in pool.cl (0: NaN taps skipped, from -FLT_MAX; 1: a NaN tap gives NaN, from
 * -inf). R's padding is written as 0. */

#ifndef MAXPOOL
#define MAXPOOL 1
#endif
#ifndef NAN_PROPAGATES
#define NAN_PROPAGATES 0
#endif

MALINN_ARGS(uint m; uint n; uint H; uint W; uint h; uint w;)
layout(std430, binding = 0) readonly buffer BufA { float a[]; };
layout(std430, binding = 1) writeonly buffer BufR { float r[]; };

void main() {
    MALINN_GUARD
    uint row = MALINN_GLOBAL_X;
    uint col = MALINN_GLOBAL_Y;
    float v = 0.0;
    if (row < m && col < n) {
        uvec3 pixel = window_pixel(col);
        uint base = pixel.x * uint(IH * IW);
        int y0 = int(pixel.y) * (SH) - (PT);
        int x0 = int(pixel.z) * (SW) - (PL);
        int y1 = min(y0 + (KH), IH), x1 = min(x0 + (KW), IW);
#if MAXPOOL && NAN_PROPAGATES
        float acc = -MALINN_INFINITY;
#elif MAXPOOL
        float acc = -3.40282347e38;   /* -FLT_MAX */
#else
        float acc = 0.0;
#endif
        for (int iy = max(y0, 0); iy < y1; ++iy)
            for (int ix = max(x0, 0); ix < x1; ++ix) {
                float x = a[MALINN_INDEX_A(row, base + uint(iy * (IW) + ix), H, W)];
#if MAXPOOL && NAN_PROPAGATES
                acc = (isnan(acc) || isnan(x)) ? acc + x : max(acc, x);
#elif MAXPOOL
                acc = isnan(x) ? acc : max(acc, x);
#else
                acc += x;
#endif
            }
#if MAXPOOL
        v = acc;
#else
        v = acc / float((y1 - max(y0, 0)) * (x1 - max(x0, 0)));
#endif
    }
    r[MALINN_INDEX_R(row, col, h, w)] = v;
}
