/* What every matrix-multiply compute shader shares (the GLSL twin of epilogue.clh): the arguments
 * in the library's order (arglist "lhwmnHWpppp", buffers a, b, r, bias, scale, shift at bindings
 * 0..5) and the fused epilogue of R's final write:
 *
 *   v = (A x B)[row, col]
 *   BIAS       1: v += bias[row]                                   (default 0)
 *   ACTIVATION act_<name> from activations.glsl, reading p0..p3    (default act_linear); a NaN
 *              stays NaN, as in TensorFlow (a GLSL compiler may turn x < 0 ? 0 : x into max(x, 0))
 *   AFFINE     1: v = v * scale[row] + shift[row], after the activation (default 0)
 *   the padding of R (row >= m or col >= n) is written as exactly 0.
 *
 * KERAS_ORDER 0 (default): B is l x w and R is h x w, row-major; 1 (the *_c entries): both are
 * column-major (a column of B is one sample's l features, a column of R one sample's h units),
 * Keras's own memory order. B_AT(k, col) and R_AT(row, col) index them either way.
 *
 * activations.glsl must come first ("sources.gl.includes" lists both); a convolution lists
 * conv.glsl (its own arguments, "lchwmnHWpppp") before this file. GLSL ES 3.10.
 */

#ifndef BIAS
#define BIAS 0
#endif
#ifndef ACTIVATION
#define ACTIVATION act_linear
#endif
#ifndef AFFINE
#define AFFINE 0
#endif
#ifndef KERAS_ORDER
#define KERAS_ORDER 0
#endif

#ifndef MALINN_ARGS_DECLARED   /* conv.glsl, listed before this file, declares the convolutions' own */
MALINN_ARGS(uint l; uint h; uint w; uint m; uint n; uint H; uint W; float p0; float p1; float p2; float p3;)
layout(std430, binding = 0) readonly buffer BufA { float a[]; };
layout(std430, binding = 1) readonly buffer BufB { float b[]; };
layout(std430, binding = 2) writeonly buffer BufR { float r[]; };
layout(std430, binding = 3) readonly buffer BufBias { float bias[]; };
layout(std430, binding = 4) readonly buffer BufScale { float scale[]; };
layout(std430, binding = 5) readonly buffer BufShift { float shift[]; };
#endif

float malinn_epilogue(float v, uint row, uint col) {
    if (row >= m || col >= n)
        return 0.0;
#if BIAS
    v += bias[row];
#endif
    v = isnan(v) ? v : ACTIVATION(v);   /* NaN stays NaN: GLSL may fold x < 0 ? 0 : x into max */
#if AFFINE
    v = v * scale[row] + shift[row];
#endif
    return v;
}

#define EPILOGUE(v, row, col) malinn_epilogue((v), (row), (col))

#if KERAS_ORDER
#define B_AT(k, col) b[(col) * l + (k)]
#define R_AT(row, col) r[(col) * h + (row)]
#else
#define B_AT(k, col) b[(k) * w + (col)]
#define R_AT(row, col) r[(row) * w + (col)]
#endif
