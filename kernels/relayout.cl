/* Re-layout on the device: R = A in another layout and padding, with R's padding zero-filled.
 *
 * The runtime prepends MALINN_INDEX_A and MALINN_INDEX_R for the two layouts (the kernel library's layout grammar).
 * m, n are the logical rows and columns, H, W A's padded shape, h, w R's padded shape. One work
 * item per element of the padded R. OpenCL C 1.2.
 */

__kernel void relayout(uint m, uint n, uint H, uint W, uint h, uint w,
                       __global const float *a,
                       __global float *r)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    r[MALINN_INDEX_R(row, col, h, w)] =
        (row < m && col < n) ? a[MALINN_INDEX_A(row, col, H, W)] : 0.0f;
}
