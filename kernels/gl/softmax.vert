/* Softmax over the feature axis (each column of R), in place, for R in any layout: the gles3
 * (vertex shader, transform feedback) twin of softmax.cl. One vertex per float of R's buffer: it
 * finds the element it holds (MALINN_ROW_R / MALINN_COL_R, the index macro's inverse), and a
 * logical element takes the column's max and sum of exp(x - max) from the texture copy of R made
 * before the draw; the padding is written back as it was. A NaN in a column makes that column NaN.
 * The sum runs in blocks of 64 terms, as softmax.cl's. GLSL ES 3.00. */

#pragma malinn_feedback(0, h * w, 1, 1)

MALINN_ARGS(uint m; uint n; uint h; uint w;)
uniform highp sampler2D malinn_tex0;   /* r, as it was before the draw */
out float malinn_out0;

void main() {
    uint i = MALINN_VERTEX;
    uint row = MALINN_ROW_R(i, h, w);
    uint col = MALINN_COL_R(i, h, w);
    float x = MALINN_LOAD(malinn_tex0, i);
    if (row >= m || col >= n) {
        malinn_out0 = x;
        return;
    }
    float top = -MALINN_INFINITY;
    bool nan = false;
    for (uint k = 0u; k < m; ++k) {
        float y = MALINN_LOAD(malinn_tex0, MALINN_INDEX_R(k, col, h, w));
        nan = nan || isnan(y);
        top = max(top, y);
    }
    if (nan)
        top = uintBitsToFloat(0x7FC00000u);
    float total = 0.0, part = 0.0;
    for (uint k = 0u; k < m; ++k) {
        part += exp(MALINN_LOAD(malinn_tex0, MALINN_INDEX_R(k, col, h, w)) - top);
        if ((k & 63u) == 63u) {
            total += part;
            part = 0.0;
        }
    }
    total += part;
    malinn_out0 = exp(x - top) / total;
}
