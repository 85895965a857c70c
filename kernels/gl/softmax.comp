/* Softmax over the feature axis (each column of R), in place, for R in any layout: the GLSL ES
 * 3.10 twin of softmax.cl. One invocation per column: max, sum of exp(x - max), then the
 * quotients. A NaN in a column makes that column NaN. The sum runs in blocks of 64 terms, as
 * softmax.cl's. */

MALINN_ARGS(uint m; uint n; uint h; uint w;)
layout(std430, binding = 0) buffer BufR { float r[]; };

void main() {
    MALINN_GUARD
    uint col = MALINN_GLOBAL_X;
    float top = -MALINN_INFINITY;
    bool nan = false;
    for (uint row = 0u; row < m; ++row) {
        float x = r[MALINN_INDEX_R(row, col, h, w)];
        nan = nan || isnan(x);
        top = max(top, x);
    }
    if (nan)
        top = uintBitsToFloat(0x7FC00000u);
    float total = 0.0, part = 0.0;
    for (uint row = 0u; row < m; ++row) {
        part += exp(r[MALINN_INDEX_R(row, col, h, w)] - top);
        if ((row & 63u) == 63u) {
            total += part;
            part = 0.0;
        }
    }
    total += part;
    for (uint row = 0u; row < m; ++row) {
        uint ix = MALINN_INDEX_R(row, col, h, w);
        r[ix] = exp(r[ix] - top) / total;
    }
}
