/* Matrix multiplication as a vertex shader whose results transform feedback captures, for GPUs
 * without compute shaders (OpenGL ES 3.0), after Cronin's GEMM through OpenGL
 * (seeds/cronin-2018-opengl-gemm-embedded.txt): the weights in texture memory, the work as a
 * draw of points with rasterization off. The gles3 twin of gemm_image.cl (entry gemm_feedback).
 *
 * R = A x B, A (M x K) the weights as an RGBA32F texture: texel (x, k) = A[4x .. 4x+3, k] (the
 * library's image operand: A column-major, four rows per texel). B (K x N) and R (M x N) are
 * column-major (Keras's order): B is read through a flat texture copied from its buffer before the
 * draw (MALINN_TEXEL: texel q = floats 4q .. 4q+3), R is written by transform feedback.
 *
 * Vertex v computes rows 4t .. 4t+3 (t = v mod h/4) of the NC columns s, s + S, ..., s + (NC-1) S
 * (s = v / (h/4), S = w / NC): output j (malinn_out<j>) of vertex v lands at float 4 (j V + v) of R
 * (V = h/4 * S vertices, each output its own section), which is R[4t, s + j S] in column-major
 * order. The fused epilogue (BIAS, ACTIVATION, AFFINE) and R's padding written as 0 as
 * gl/matmul.glsl's. GLSL ES 3.00; activations.glsl is included before this file.
 */

#ifndef NC
#define NC 4
#endif
#ifndef BIAS
#define BIAS 0
#endif
#ifndef ACTIVATION
#define ACTIVATION act_linear
#endif
#ifndef AFFINE
#define AFFINE 0
#endif

#pragma malinn_feedback(2, (h / 4) * (w / NC), NC, 4)

MALINN_ARGS(uint l; uint h; uint w; uint m; uint n; uint H; uint W; float p0; float p1; float p2; float p3;)
uniform highp sampler2D malinn_tex0;   /* a: the weights' image */
uniform highp sampler2D malinn_tex1;   /* b */
#if BIAS
uniform highp sampler2D malinn_tex3;   /* bias */
#endif
#if AFFINE
uniform highp sampler2D malinn_tex4;   /* scale */
uniform highp sampler2D malinn_tex5;   /* shift */
#endif

out vec4 malinn_out0;
#if NC > 1
out vec4 malinn_out1;
#endif
#if NC > 2
out vec4 malinn_out2;
out vec4 malinn_out3;
#endif

float malinn_epilogue(float v, uint row, uint col, float bias, float scale, float shift) {
    if (row >= m || col >= n)
        return 0.0;
#if BIAS
    v += bias;
#endif
    v = isnan(v) ? v : ACTIVATION(v);   /* NaN stays NaN: GLSL may fold x < 0 ? 0 : x into max */
#if AFFINE
    v = v * scale + shift;
#endif
    return v;
}

vec4 malinn_finish(vec4 v, uint t, uint col) {
    vec4 bias = vec4(0.0), scale = vec4(1.0), shift = vec4(0.0);
#if BIAS
    bias = MALINN_TEXEL(malinn_tex3, t);
#endif
#if AFFINE
    scale = MALINN_TEXEL(malinn_tex4, t);
    shift = MALINN_TEXEL(malinn_tex5, t);
#endif
    uint row = 4u * t;
    return vec4(malinn_epilogue(v.x, row, col, bias.x, scale.x, shift.x),
                malinn_epilogue(v.y, row + 1u, col, bias.y, scale.y, shift.y),
                malinn_epilogue(v.z, row + 2u, col, bias.z, scale.z, shift.z),
                malinn_epilogue(v.w, row + 3u, col, bias.w, scale.w, shift.w));
}

void main() {
    uint tiles = h / 4u;
    uint stride = w / uint(NC);
    uint t = MALINN_VERTEX % tiles;
    uint s = MALINN_VERTEX / tiles;
    vec4 acc[NC];
    for (int j = 0; j < NC; ++j)
        acc[j] = vec4(0.0);
    for (uint k = 0u; k < l; k += 4u) {
        int x = int(t), y = int(k);
        vec4 a0 = texelFetch(malinn_tex0, ivec2(x, y), 0);
        vec4 a1 = texelFetch(malinn_tex0, ivec2(x, y + 1), 0);
        vec4 a2 = texelFetch(malinn_tex0, ivec2(x, y + 2), 0);
        vec4 a3 = texelFetch(malinn_tex0, ivec2(x, y + 3), 0);
        for (int j = 0; j < NC; ++j) {
            vec4 bv = MALINN_TEXEL(malinn_tex1, ((s + uint(j) * stride) * l + k) >> 2u);
            acc[j] += bv.x * a0 + bv.y * a1 + bv.z * a2 + bv.w * a3;
        }
    }
    malinn_out0 = malinn_finish(acc[0], t, s);
#if NC > 1
    malinn_out1 = malinn_finish(acc[1], t, s + stride);
#endif
#if NC > 2
    malinn_out2 = malinn_finish(acc[2], t, s + 2u * stride);
    malinn_out3 = malinn_finish(acc[3], t, s + 3u * stride);
#endif
}
