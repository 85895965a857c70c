/* Keras's Masking: whether a position of a tensor holds anything but the mask value along its
 * last axis, any(A != mask_value, axis=-1), as 1.0f (kept) or 0.0f (masked).
 *
 * A is the matrix view of a tensor (batch, d1, ..., dk): M = dk rows, one column per position of
 * the other axes, in any layout (MALINN_INDEX_A). R is the result (batch, d1, ..., dk-1, ...) of
 * as many elements as A has columns, in any layout: its element at flat index f (Keras's order,
 * col * m + row) is the result for A's column f. The comparison is IEEE's: a NaN differs from
 * every mask value (a NaN mask value masks nothing), -0.0 equals 0.0. mask_value is the float
 * parameter p. R's padding (h x w beyond m x n) is written as zero. H, W and h, w are A's and R's
 * padded shapes. OpenCL C 1.2.
 *
 * No defines: the mask value is an argument, so one program serves every layer.
 */

__kernel void masking_any(uint m, uint n, uint h, uint w, uint M, uint H, uint W, float mask_value,
                          __global float *r,
                          __global const float *a)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    float kept = 0.0f;
    if (row < m && col < n) {
        const uint f = col * m + row;   /* A's column */
        for (uint k = 0; k < M; ++k) {
            if (a[MALINN_INDEX_A(k, f, H, W)] != mask_value) {
                kept = 1.0f;
                break;
            }
        }
    }
    r[MALINN_INDEX_R(row, col, h, w)] = kept;
}
