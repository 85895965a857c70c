/* Keras's Masking: any(A != mask_value) along A's last axis, as 1.0 (kept) or 0.0 (masked), R in
 * any layouts: the GLSL ES 3.10 twin of masking.cl (read it for the design).
 *   A: the matrix view of (batch, d1, ..., dk), M = dk rows, one column per position of the other
 *   axes. R: as many elements as A has columns; its element at flat index f = col * m + row is the
 *   result for A's column f. The comparison is IEEE's: a NaN differs from every mask value (a NaN
 *   mask value masks nothing), -0.0 equals 0.0 (the NaN cases are tested explicitly: a compiler
 *   may fold a != into a negated ==). mask_value is the float parameter p.
 * No defines: the mask value is an argument. The range is R's padded h x w: the padding is
 * written as 0. */

MALINN_ARGS(uint m; uint n; uint h; uint w; uint M; uint H; uint W; float mask_value;)
layout(std430, binding = 0) writeonly buffer BufR { float r[]; };
layout(std430, binding = 1) readonly buffer BufA { float a[]; };

void main() {
    MALINN_GUARD
    uint row = MALINN_GLOBAL_X;
    uint col = MALINN_GLOBAL_Y;
    float kept = 0.0;
    if (row < m && col < n) {
        uint f = col * m + row;   /* A's column */
        bool nan_mask = isnan(mask_value);
        for (uint k = 0u; k < M; ++k) {
            float x = a[MALINN_INDEX_A(k, f, H, W)];
            if (nan_mask || isnan(x) || x != mask_value) {
                kept = 1.0;
                break;
            }
        }
    }
    r[MALINN_INDEX_R(row, col, h, w)] = kept;
}
