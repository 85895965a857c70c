/* Per-element parameters broadcast over each sample, in place, R in any layout: the gles3 (vertex
 * shader, transform feedback) twin of broadcast.cl (read it for the design). Element (row, col)
 * reads parameter p = (col % PCOLS) * m + row; FORM 0: r * scale + shift, 1: (r + shift) * scale,
 * 2: PReLU (alpha in scale). One vertex per float of R's buffer; the padding written back as it
 * was. GLSL ES 3.00. */

#ifndef PCOLS
#define PCOLS 1
#endif
#ifndef FORM
#define FORM 0
#endif

#pragma malinn_feedback(0, h * w, 1, 1)

MALINN_ARGS(uint m; uint n; uint h; uint w;)
uniform highp sampler2D malinn_tex0;   /* r, as it was before the draw */
uniform highp sampler2D malinn_tex1;   /* scale */
#if FORM != 2
uniform highp sampler2D malinn_tex2;   /* shift */
#endif
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
    uint p = (col % uint(PCOLS)) * m + row;
#if FORM == 0
    malinn_out0 = x * MALINN_LOAD(malinn_tex1, p) + MALINN_LOAD(malinn_tex2, p);
#elif FORM == 1
    malinn_out0 = (x + MALINN_LOAD(malinn_tex2, p)) * MALINN_LOAD(malinn_tex1, p);
#else
    malinn_out0 = x < 0.0 ? MALINN_LOAD(malinn_tex1, p) * x : x;
#endif
}
