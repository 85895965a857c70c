/* Keras's CategoryEncoding, and IntegerLookup's one-hot, multi-hot and count outputs, R in any
 * layouts: the GLSL ES 3.10 twin of category_encoding.cl (read it for the design).
 *   A: the matrix view of the index tensor (batch, ..., k), M = k rows; its element at flat index
 *   f is (f % M, f / M). R: m rows, one per token.
 *   MODE 0 (one_hot, default 1)  one column per element of A: R[t, f] = 1 where the index is t
 *   MODE 1 (multi_hot)           one column per column of A: R[t, c] = 1 where t is among its M
 *   MODE 2 (count)               likewise, R[t, c] = how many of its M indices are t
 *   An index is the float32 value truncated toward zero. Outside [0, m) as Keras 3: a one-hot of
 *   such an index is zeros, multi-hot and count leave out an index >= m; a negative index there
 *   and a NaN anywhere give NaN in every row of the column.
 * The range is R's padded h x w: the padding is written as 0. */

#ifndef MODE
#define MODE 1
#endif

MALINN_ARGS(uint m; uint n; uint M; uint H; uint W; uint h; uint w;)
layout(std430, binding = 0) readonly buffer BufA { float a[]; };
layout(std430, binding = 1) writeonly buffer BufR { float r[]; };

void main() {
    MALINN_GUARD
    uint row = MALINN_GLOBAL_X;
    uint col = MALINN_GLOBAL_Y;
    float v = 0.0;
    if (row < m && col < n) {
#if MODE == 0
        uint per = 1u;
        float lowest = -MALINN_INFINITY;   /* a one-hot of a negative index is zeros */
#else
        uint per = M;
        float lowest = 0.0;                /* a negative index to multi-hot or count: NaN */
#endif
        float token = float(row);
        for (uint j = 0u; j < per; ++j) {
            uint f = col * per + j;
            uint src_col = f / M;
            float x = a[MALINN_INDEX_A(f - src_col * M, src_col, H, W)];
            float t = trunc(x);
            if (isnan(x) || t < lowest) {
                v = uintBitsToFloat(0x7FC00000u);   /* NaN */
                break;
            }
#if MODE == 2
            if (t == token)
                v += 1.0;
#else
            if (t == token)
                v = 1.0;
#endif
        }
    }
    r[MALINN_INDEX_R(row, col, h, w)] = v;
}
