/* R[row, col] = R[row, col] * scale[row] + shift[row] for R in any layout, in place: the gles3
 * (vertex shader, transform feedback) twin of bias.cl's scale_shift. One vertex per float of R's
 * buffer; padding kept. GLSL ES 3.00. */

#pragma malinn_feedback(0, h * w, 1, 1)

MALINN_ARGS(uint m; uint n; uint h; uint w;)
uniform highp sampler2D malinn_tex0;   /* r, as it was before the draw */
uniform highp sampler2D malinn_tex1;   /* scale */
uniform highp sampler2D malinn_tex2;   /* shift */
out float malinn_out0;

void main() {
    uint i = MALINN_VERTEX;
    uint row = MALINN_ROW_R(i, h, w);
    float x = MALINN_LOAD(malinn_tex0, i);
    malinn_out0 = (row < m && MALINN_COL_R(i, h, w) < n)
        ? x * MALINN_LOAD(malinn_tex1, row) + MALINN_LOAD(malinn_tex2, row) : x;
}
