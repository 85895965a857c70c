/* R[row, col] += bias[row] for R in any layout (the GLSL ES 3.10 twin of bias.cl's bias_add).
 * The runtime prepends MALINN_INDEX_R for R's layout; m, n logical, h, w padded shape. */

MALINN_ARGS(uint m; uint n; uint h; uint w;)
layout(std430, binding = 0) buffer BufR { float r[]; };
layout(std430, binding = 1) readonly buffer BufBias { float bias[]; };

void main() {
    MALINN_GUARD
    uint row = MALINN_GLOBAL_X;
    uint col = MALINN_GLOBAL_Y;
    r[MALINN_INDEX_R(row, col, h, w)] += bias[row];
}
