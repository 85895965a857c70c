/* R = A in another layout and padding, R's padding zero-filled: the gles3 (vertex shader,
 * transform feedback) twin of relayout.cl. One vertex per float of R's buffer: it finds the
 * element it holds (MALINN_ROW_R / MALINN_COL_R) and reads it from A's texture copy.
 * GLSL ES 3.00. */

#pragma malinn_feedback(1, h * w, 1, 1)

MALINN_ARGS(uint m; uint n; uint H; uint W; uint h; uint w;)
uniform highp sampler2D malinn_tex0;   /* a */
out float malinn_out0;

void main() {
    uint i = MALINN_VERTEX;
    uint row = MALINN_ROW_R(i, h, w);
    uint col = MALINN_COL_R(i, h, w);
    malinn_out0 = (row < m && col < n) ? MALINN_LOAD(malinn_tex0, MALINN_INDEX_A(row, col, H, W)) : 0.0;
}
