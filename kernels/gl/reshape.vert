/* Keras Reshape/Flatten between two matrix views of one tensor, any layouts (flat order kept): the
 * gles3 (vertex shader, transform feedback) twin of reshape.cl. One vertex per float of R's
 * buffer: element (row, col) of R (logical m x n) is flat index f = col * m + row, element
 * (f % M, f / M) of A (logical M rows), read from A's texture copy; R's padding written as 0.
 * GLSL ES 3.00. */

#pragma malinn_feedback(1, h * w, 1, 1)

MALINN_ARGS(uint m; uint n; uint M; uint H; uint W; uint h; uint w;)
uniform highp sampler2D malinn_tex0;   /* a */
out float malinn_out0;

void main() {
    uint i = MALINN_VERTEX;
    uint row = MALINN_ROW_R(i, h, w);
    uint col = MALINN_COL_R(i, h, w);
    float v = 0.0;
    if (row < m && col < n) {
        uint f = col * m + row;
        v = MALINN_LOAD(malinn_tex0, MALINN_INDEX_A(f % M, f / M, H, W));
    }
    malinn_out0 = v;
}
