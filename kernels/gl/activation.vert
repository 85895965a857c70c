/* Element-wise activations for R in any layout, in place: the gles3 (vertex shader, transform
 * feedback) twin of activation.cl. -DACTIVATION=act_<name> picks a macro of activations.glsl
 * (included before this file); p0..p3 are the activation's parameters. One vertex per float of
 * R's buffer: a logical element (MALINN_ROW_R / MALINN_COL_R below m x n) is activated, the
 * padding written back as it was. GLSL ES 3.00. */

#pragma malinn_feedback(0, h * w, 1, 1)

MALINN_ARGS(uint m; uint n; uint h; uint w; float p0; float p1; float p2; float p3;)
uniform highp sampler2D malinn_tex0;   /* r, as it was before the draw */
out float malinn_out0;

void main() {
    uint i = MALINN_VERTEX;
    float x = MALINN_LOAD(malinn_tex0, i);
    bool logical = MALINN_ROW_R(i, h, w) < m && MALINN_COL_R(i, h, w) < n;
    malinn_out0 = (!logical || isnan(x)) ? x : ACTIVATION(x);   /* NaN stays NaN */
}
