/* The precision of a matmul shader's left operand A (a Dense layer's weights): the GLSL ES 3.10
 * twin of weights.clh, for the shaders that list it in "sources.gl.includes" after matmul.glsl
 * (it reads the MALINN_ARGS members H, W and m). Such a shader reads A only through the macros
 * below, and writes R through EPILOGUE_W, which applies WEIGHT_SCALE before matmul.glsl's epilogue.
 *
 *   WEIGHT_BITS  32: float (default, "fp32")
 *                16: half ("fp16-storage"): the buffer read as uint words, two halves each
 *                    (element 2i in the low 16 bits: little-endian), unpackHalf2x16; float sums
 *                 8: signed char ("int8-weights"): four per uint word, sign-extended with
 *                    bitfieldExtract; then, at the next multiple of 4 bytes, one float scale per
 *                    logical row (A[row][k] = value * scale[row]); float sums
 *   HALF_ARITHMETIC ("fp16") has no twin: GLSL ES guarantees no half arithmetic; the runtime
 *                refuses it on GL (the OpenGL backend).
 *
 *   LOAD_A4(v)   elements 4v .. 4v + 3 of A's buffer, as a vec4 (4v: a multiple of 4)
 *   LOAD_A2(v)   elements 2v, 2v + 1, as a vec2
 *   LOAD_A1(i)   element i, as a float
 *   WEIGHT_SCALE(row)  1.0, or row's int8 scale (row < m)
 *   EPILOGUE_W(v, row, col)  EPILOGUE of v * WEIGHT_SCALE(row) (0 for R's padding rows)
 * The runtime rounds a GL buffer up to whole words, so the last word of an odd count of halves or
 * bytes is inside it. MALINN_WEIGHT_BITS_READ marks a shader that reads reduced precisions (the GL
 * backend refuses WEIGHT_BITS 16 and 8 for any other).
 */

#define MALINN_WEIGHT_BITS_READ 1
#ifndef WEIGHT_BITS
#define WEIGHT_BITS 32
#endif

#if WEIGHT_BITS == 32
layout(std430, binding = 0) readonly buffer BufWA4 { vec4 wa4[]; };
layout(std430, binding = 0) readonly buffer BufWA2 { vec2 wa2[]; };
#define LOAD_A4(v) wa4[v]
#define LOAD_A2(v) wa2[v]
#define LOAD_A1(i) a[i]
#define WEIGHT_SCALE(row) 1.0
#else
layout(std430, binding = 0) readonly buffer BufAW { uint aw[]; };
#if WEIGHT_BITS == 16
vec4 malinn_load_a4(uint v) { return vec4(unpackHalf2x16(aw[2u * v]), unpackHalf2x16(aw[2u * v + 1u])); }
vec2 malinn_load_a2(uint v) { return unpackHalf2x16(aw[v]); }
float malinn_load_a1(uint i) {
    vec2 pair = unpackHalf2x16(aw[i >> 1]);
    return (i & 1u) == 0u ? pair.x : pair.y;
}
#define WEIGHT_SCALE(row) 1.0
#elif WEIGHT_BITS == 8
vec4 malinn_load_a4(uint v) {
    int q = int(aw[v]);
    return vec4(float(bitfieldExtract(q, 0, 8)), float(bitfieldExtract(q, 8, 8)),
                float(bitfieldExtract(q, 16, 8)), float(bitfieldExtract(q, 24, 8)));
}
vec2 malinn_load_a2(uint v) {
    int q = int(aw[v >> 1]);
    int o = int(v & 1u) * 16;
    return vec2(float(bitfieldExtract(q, o, 8)), float(bitfieldExtract(q, o + 8, 8)));
}
float malinn_load_a1(uint i) { return float(bitfieldExtract(int(aw[i >> 2]), int(i & 3u) * 8, 8)); }
/* the scales start at the first multiple of 4 bytes after the H x W values */
#define WEIGHT_SCALE(row) uintBitsToFloat(aw[(H * W + 3u) / 4u + (row)])
#else
#error "WEIGHT_BITS must be 32, 16 or 8"
#endif
#define LOAD_A4(v) malinn_load_a4(v)
#define LOAD_A2(v) malinn_load_a2(v)
#define LOAD_A1(i) malinn_load_a1(i)
#endif

#define EPILOGUE_W(v, row, col) EPILOGUE((row) < m ? (v) * WEIGHT_SCALE(row) : 0.0, (row), (col))
