/* R[row, col] = R[row, col] * scale[row] + shift[row] for R in any layout (the GLSL ES 3.10 twin
 * of bias.cl's scale_shift: a BatchNormalization that follows no linear Dense layer). */

MALINN_ARGS(uint m; uint n; uint h; uint w;)
layout(std430, binding = 0) buffer BufR { float r[]; };
layout(std430, binding = 1) readonly buffer BufScale { float scale[]; };
layout(std430, binding = 2) readonly buffer BufShift { float shift[]; };

void main() {
    MALINN_GUARD
    uint row = MALINN_GLOBAL_X;
    uint col = MALINN_GLOBAL_Y;
    uint ix = MALINN_INDEX_R(row, col, h, w);
    r[ix] = r[ix] * scale[row] + shift[row];
}
