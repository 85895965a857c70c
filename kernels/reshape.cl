/* Reshape: one Keras tensor from one matrix view to another, for R and A in any layout.
 *
 * malinn holds a tensor of Keras shape (batch, d1, ..., dk) as the matrix view dk x (batch * d1
 * * ... * d(k-1)): column c, row r is the element at flat (row-major, batch first) index c * dk + r.
 * A Keras Reshape or Flatten keeps the flat order and changes the view: element (row, col) of R
 * (logical m x n) is flat index f = col * m + row, which is element (f % M, f / M) of A (logical
 * M rows). Padded elements of R (row >= m or col >= n) are written as zero. The runtime prepends
 * MALINN_INDEX_A and MALINN_INDEX_R for the two layouts; H, W and h, w are the padded shapes.
 * OpenCL C 1.2.
 */

__kernel void reshape(uint m, uint n, uint M, uint H, uint W, uint h, uint w,
                      __global const float *a,
                      __global float *r)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    float v = 0.0f;
    if (row < m && col < n) {
        const ulong f = (ulong)col * m + row;
        const ulong src_col = f / M;
        const uint src_row = (uint)(f - src_col * M);   /* f % M, spelt out (no LLVM freeze: Oclgrind) */
        v = a[MALINN_INDEX_A(src_row, (uint)src_col, H, W)];
    }
    r[MALINN_INDEX_R(row, col, h, w)] = v;
}
