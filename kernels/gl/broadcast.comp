/* Per-element parameters broadcast over each sample, in place, R in any layout: the GLSL ES 3.10
 * twin of broadcast.cl (read it for the design). Element (row, col) reads parameter
 * p = (col % PCOLS) * m + row; FORM 0: r * scale + shift, 1: (r + shift) * scale, 2: PReLU
 * (alpha in scale). Only logical elements are touched (the range is m x n, MALINN_GUARD drops the
 * rounded-up rest), so the padding stays zero. */

#ifndef PCOLS
#define PCOLS 1
#endif
#ifndef FORM
#define FORM 0
#endif

MALINN_ARGS(uint m; uint n; uint h; uint w;)
layout(std430, binding = 0) buffer BufR { float r[]; };
layout(std430, binding = 1) readonly buffer BufScale { float scale[]; };
layout(std430, binding = 2) readonly buffer BufShift { float shift[]; };

void main() {
    MALINN_GUARD
    uint row = MALINN_GLOBAL_X;
    uint col = MALINN_GLOBAL_Y;
    uint ix = MALINN_INDEX_R(row, col, h, w);
    uint p = (col % uint(PCOLS)) * m + row;
    float x = r[ix];
#if FORM == 0
    r[ix] = x * scale[p] + shift[p];
#elif FORM == 1
    r[ix] = (x + shift[p]) * scale[p];
#else
    r[ix] = x < 0.0 ? scale[p] * x : x;
#endif
}
