/* The arguments of the convolution shaders (conv_gemm.comp, conv_depthwise.comp) in the library's
 * order (arglist "lchwmnHWpppp": B is l x c padded, R h x w, m x n logical, A H x W; buffers a, b,
 * r, bias, scale, shift at bindings 0..5). Listed before matmul.glsl, whose fused epilogue they
 * share (it then declares no arguments of its own). GLSL ES 3.10. */

#define MALINN_ARGS_DECLARED 1
MALINN_ARGS(uint l; uint c; uint h; uint w; uint m; uint n; uint H; uint W; float p0; float p1; float p2; float p3;)
layout(std430, binding = 0) readonly buffer BufA { float a[]; };
layout(std430, binding = 1) readonly buffer BufB { float b[]; };
layout(std430, binding = 2) writeonly buffer BufR { float r[]; };
layout(std430, binding = 3) readonly buffer BufBias { float bias[]; };
layout(std430, binding = 4) readonly buffer BufScale { float scale[]; };
layout(std430, binding = 5) readonly buffer BufShift { float shift[]; };
