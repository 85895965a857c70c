/* Keras Reshape/Flatten between two matrix views of one tensor, any layouts (flat order kept): the
 * GLSL ES 3.10 twin of reshape.cl. Element (row, col) of R (logical m x n) is flat index
 * f = col * m + row, element (f % M, f / M) of A (logical M rows); R's padding is written as 0.
 * The flat index is a 32-bit uint: a shader storage buffer holds fewer than 2^32 floats. */

MALINN_ARGS(uint m; uint n; uint M; uint H; uint W; uint h; uint w;)
layout(std430, binding = 0) readonly buffer BufA { float a[]; };
layout(std430, binding = 1) writeonly buffer BufR { float r[]; };

void main() {
    MALINN_GUARD
    uint row = MALINN_GLOBAL_X;
    uint col = MALINN_GLOBAL_Y;
    float v = 0.0;
    if (row < m && col < n) {
        uint f = col * m + row;
        v = a[MALINN_INDEX_A(f % M, f / M, H, W)];
    }
    r[MALINN_INDEX_R(row, col, h, w)] = v;
}
