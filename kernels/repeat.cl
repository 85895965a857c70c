/* RepeatVector: each sample of A (a vector of M features) repeated n / N times, into R.
 *
 * A is the matrix view of (batch, features): M rows, N = batch columns. R is (batch, times,
 * features): m = M rows, n = batch * times columns, column col holding sample col / (n / N). The
 * padding of R is written as zero. The runtime prepends MALINN_INDEX_A and MALINN_INDEX_R; H, W
 * and h, w are A's and R's padded shapes. OpenCL C 1.2.
 */

__kernel void repeat_vector(uint m, uint n, uint N, uint H, uint W, uint h, uint w,
                            __global const float *a,
                            __global float *r)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    float v = 0.0f;
    if (row < m && col < n)
        v = a[MALINN_INDEX_A(row, col / (n / N), H, W)];
    r[MALINN_INDEX_R(row, col, h, w)] = v;
}
