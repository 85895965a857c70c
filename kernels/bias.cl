/* Bias addition (Rovder 6.3, 9.1) and per-feature affine steps for R in any layout.
 *   bias_add     R[row, col] += bias[row]
 *   scale_shift  R[row, col] = R[row, col] * scale[row] + shift[row]
 *
 * R is units x batch, so bias[row] is the bias of one unit, added to every sample (column). The
 * runtime prepends MALINN_INDEX_R(row, col, prows, pcols) for R's layout (the kernel library's layout grammar), so
 * this one source serves R, C, C_4_2_C, C_4_4_C and any other layout. m, n are R's logical rows
 * and columns, h, w its padded ones. Only logical elements are touched, so the padding stays zero.
 * OpenCL C 1.2.
 */

__kernel void bias_add(uint m, uint n, uint h, uint w,
                       __global float *r,
                       __global const float *bias)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    r[MALINN_INDEX_R(row, col, h, w)] += bias[row];
}

/* Per-feature affine step R[row, col] = R[row, col] * scale[row] + shift[row]: a BatchNormalization
 * that follows no linear Dense layer (after one, the converter folds it into the Dense weights). */
__kernel void scale_shift(uint m, uint n, uint h, uint w,
                          __global float *r,
                          __global const float *scale,
                          __global const float *shift)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    const size_t ix = MALINN_INDEX_R(row, col, h, w);
    r[ix] = r[ix] * scale[row] + shift[row];
}
