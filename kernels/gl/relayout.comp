/* R = A in another layout and padding, R's padding zero-filled: the GLSL ES 3.10 twin of
 * relayout.cl. One invocation per element of the padded R. */

MALINN_ARGS(uint m; uint n; uint H; uint W; uint h; uint w;)
layout(std430, binding = 0) readonly buffer BufA { float a[]; };
layout(std430, binding = 1) writeonly buffer BufR { float r[]; };

void main() {
    MALINN_GUARD
    uint row = MALINN_GLOBAL_X;
    uint col = MALINN_GLOBAL_Y;
    r[MALINN_INDEX_R(row, col, h, w)] = (row < m && col < n) ? a[MALINN_INDEX_A(row, col, H, W)] : 0.0;
}
