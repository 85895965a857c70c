/* Keras RepeatVector, from A into R in any layouts: the GLSL ES 3.10 twin of repeat.cl. A is
 * M x N (features x batch), R is m = M rows by n = batch * times columns, column col holding
 * sample col / (n / N); R's padding is written as zero. */

MALINN_ARGS(uint m; uint n; uint N; uint H; uint W; uint h; uint w;)
layout(std430, binding = 0) readonly buffer BufA { float a[]; };
layout(std430, binding = 1) writeonly buffer BufR { float r[]; };

void main() {
    MALINN_GUARD
    uint row = MALINN_GLOBAL_X;
    uint col = MALINN_GLOBAL_Y;
    float v = 0.0;
    if (row < m && col < n)
        v = a[MALINN_INDEX_A(row, col / (n / N), H, W)];
    r[MALINN_INDEX_R(row, col, h, w)] = v;
}
