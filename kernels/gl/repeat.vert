/* Keras RepeatVector, from A into R in any layouts: the gles3 (vertex shader, transform
 * feedback) twin of repeat.cl. A is M x N (features x batch), R is m = M rows by n = batch * times
 * columns, column col holding sample col / (n / N); one vertex per float of R's buffer; R's padding
 * is written as zero. GLSL ES 3.00. */

#pragma malinn_feedback(1, h * w, 1, 1)

MALINN_ARGS(uint m; uint n; uint N; uint H; uint W; uint h; uint w;)
uniform highp sampler2D malinn_tex0;   /* a */
out float malinn_out0;

void main() {
    uint row = MALINN_ROW_R(MALINN_VERTEX, h, w);
    uint col = MALINN_COL_R(MALINN_VERTEX, h, w);
    malinn_out0 = (row < m && col < n) ? MALINN_LOAD(malinn_tex0, MALINN_INDEX_A(row, col / (n / N), H, W)) : 0.0;
}
