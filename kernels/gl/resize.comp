/* Image resizing as TensorFlow's tf.image.resize computes it without antialiasing (Resizing,
 * UpSampling2D with an interpolation other than "nearest"), any layouts: the GLSL ES 3.10 twin of
 * resize.cl (read it for the formulas). scale = IH / OH and IW / OW in float;
 *   MODE 0 nearest, 1 bilinear, 2 bicubic (Keys' a = -0.5, distances rounded to 1/1024 as
 *   TensorFlow's coefficient table; these three with half-pixel centres), 3 area (each input
 *   pixel weighted by the part of the output pixel's cell it covers).
 * Matrix views (window.glsl): column = (image*H + y)*W + x; A is C x (batch*IH*IW), R is
 * C x (batch*OH*OW); R's padding is written as 0.
 * Defines: IH, IW, OH, OW (window.glsl), MODE (default 1). Arguments: m, n logical rows and columns
 * of R, H, W padded rows and columns of A, h, w of R.
 */

#ifndef MODE
#define MODE 1
#endif

MALINN_ARGS(uint m; uint n; uint H; uint W; uint h; uint w;)
layout(std430, binding = 0) readonly buffer BufA { float a[]; };
layout(std430, binding = 1) writeonly buffer BufR { float r[]; };

float resize_read(uint row, uint base, int y, int x) {
    return a[MALINN_INDEX_A(row, base + uint(y * (IW) + x), H, W)];
}

/* Keys' cubic convolution kernel (a = -0.5) at a distance d in [0, 1] and at d in [1, 2] */
float cubic_near(float d) { return (1.5 * d - 2.5) * d * d + 1.0; }
float cubic_far(float d) { return ((-0.5 * d + 2.5) * d - 4.0) * d + 2.0; }

/* The weights of the taps first .. first + 3 (first = floor(in) - 1) at the source position `in`
 * along an axis of `size` pixels, as TensorFlow's GetWeightsAndIndices with Keys' cubic */
vec4 cubic_weights(float in_, int first, int size) {
    int offset = int(roundEven((in_ - floor(in_)) * 1024.0));
    float d = float(offset) / 1024.0, e = float(1024 - offset) / 1024.0;
    float w0 = first >= 0 && first < size ? cubic_far(d + 1.0) : 0.0;
    float w1 = first + 1 >= 0 && first + 1 < size ? cubic_near(d) : 0.0;
    float w2 = first + 2 >= 0 && first + 2 < size ? cubic_near(e) : 0.0;
    float w3 = first + 3 >= 0 && first + 3 < size ? cubic_far(e + 1.0) : 0.0;
    float sum = w0 + w1 + w2 + w3;
    float s = abs(sum) >= 1000.0 * 1.17549435e-38 ? 1.0 / sum : 1.0;   /* 1000 FLT_MIN */
    return vec4(w0 * s, w1 * s, w2 * s, w3 * s);
}

/* Column x of the rows y0 .. y0 + 3 (each clamped to the image) summed with the weights wy */
float cubic_column(uint row, uint base, int y0, int x, vec4 wy) {
    return resize_read(row, base, clamp(y0, 0, IH - 1), x) * wy.x
         + resize_read(row, base, clamp(y0 + 1, 0, IH - 1), x) * wy.y
         + resize_read(row, base, clamp(y0 + 2, 0, IH - 1), x) * wy.z
         + resize_read(row, base, clamp(y0 + 3, 0, IH - 1), x) * wy.w;
}

/* The part of input cell i inside [lo, hi), as TensorFlow's ResizeArea computes it */
float area_part(int i, float lo, float hi, float full) {
    float f = float(i);
    return f < lo ? (f + 1.0 > hi ? full : f + 1.0 - lo) : (f + 1.0 > hi ? hi - f : 1.0);
}

void main() {
    MALINN_GUARD
    uint row = MALINN_GLOBAL_X;
    uint col = MALINN_GLOBAL_Y;
    float v = 0.0;
    if (row < m && col < n) {
        uvec3 pixel = window_pixel(col);
        uint base = pixel.x * uint(IH * IW);
        float sy = float(IH) / float(OH), sx = float(IW) / float(OW);
#if MODE == 0
        int y = clamp(int(floor((float(pixel.y) + 0.5) * sy)), 0, IH - 1);
        int x = clamp(int(floor((float(pixel.z) + 0.5) * sx)), 0, IW - 1);
        v = resize_read(row, base, y, x);
#elif MODE == 1
        float iny = (float(pixel.y) + 0.5) * sy - 0.5, inx = (float(pixel.z) + 0.5) * sx - 0.5;
        float fy = floor(iny), fx = floor(inx);
        int y0 = max(int(fy), 0), y1 = min(int(ceil(iny)), IH - 1);
        int x0 = max(int(fx), 0), x1 = min(int(ceil(inx)), IW - 1);
        float wy = iny - fy, wx = inx - fx;
        float tl = resize_read(row, base, y0, x0), tr = resize_read(row, base, y0, x1);
        float bl = resize_read(row, base, y1, x0), br = resize_read(row, base, y1, x1);
        float top = tl + (tr - tl) * wx, bottom = bl + (br - bl) * wx;
        v = top + (bottom - top) * wy;
#elif MODE == 2
        float iny = (float(pixel.y) + 0.5) * sy - 0.5, inx = (float(pixel.z) + 0.5) * sx - 0.5;
        int y0 = int(floor(iny)) - 1, x0 = int(floor(inx)) - 1;
        vec4 wy = cubic_weights(iny, y0, IH), wx = cubic_weights(inx, x0, IW);
        v = cubic_column(row, base, y0, clamp(x0, 0, IW - 1), wy) * wx.x
          + cubic_column(row, base, y0, clamp(x0 + 1, 0, IW - 1), wy) * wx.y
          + cubic_column(row, base, y0, clamp(x0 + 2, 0, IW - 1), wy) * wx.z
          + cubic_column(row, base, y0, clamp(x0 + 3, 0, IW - 1), wy) * wx.w;
#else
        float ylo = float(pixel.y) * sy, yhi = float(pixel.y + 1u) * sy;
        float xlo = float(pixel.z) * sx, xhi = float(pixel.z + 1u) * sx;
        int y_start = int(floor(ylo)), y_end = int(ceil(yhi));
        int x_start = int(floor(xlo)), x_end = int(ceil(xhi));
        float first_x = area_part(x_start, xlo, xhi, sx), last_x = area_part(x_end - 1, xlo, xhi, sx);
        float sum = 0.0;
        for (int i = y_start; i < y_end; ++i) {
            int y = clamp(i, 0, IH - 1);
            float along = resize_read(row, base, y, clamp(x_start, 0, IW - 1)) * first_x;
            if (x_start + 1 != x_end) {
                for (int j = x_start + 1; j < x_end - 1; ++j)
                    along += resize_read(row, base, y, clamp(j, 0, IW - 1));
                along += resize_read(row, base, y, clamp(x_end - 1, 0, IW - 1)) * last_x;
            }
            sum += along * area_part(i, ylo, yhi, sy);
        }
        v = sum * (1.0 / (sy * sx));
#endif
    }
    r[MALINN_INDEX_R(row, col, h, w)] = v;
}
