/* Element-wise activations for R in any layout, in place: the GLSL ES 3.10 twin of activation.cl.
 * -DACTIVATION=act_<name> picks a macro of activations.glsl (prepended by the runtime); p0..p3 are
 * the activation's parameters. The runtime prepends MALINN_INDEX_R(row, col, prows, pcols) for R's
 * layout; m, n are R's logical rows and columns, h, w its padded ones. One invocation per logical
 * element (the range is m x n; MALINN_GUARD drops the rounded-up rest).
 */

MALINN_ARGS(uint m; uint n; uint h; uint w; float p0; float p1; float p2; float p3;)
layout(std430, binding = 0) buffer BufR { float r[]; };

void main() {
    MALINN_GUARD
    uint row = MALINN_GLOBAL_X;
    uint col = MALINN_GLOBAL_Y;
    uint ix = MALINN_INDEX_R(row, col, h, w);
    float x = r[ix];
    r[ix] = isnan(x) ? x : ACTIVATION(x);   /* NaN stays NaN, whatever the compiler folds */
}
