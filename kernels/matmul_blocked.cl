/* Blocked matrix multiplication R = A x B (Rovder 7.4, Appendix 12.2-12.3; ARM's sgemmNT).
 *
 * A is M x K, B is K x N, R is M x N, padded as kernels/library.json declares; l is the padded K,
 * h and w the padded rows and columns of R.
 *   blocked_rmrm  A, B, R row-major; a work item computes 1 x 4 results (float4 of a row of R).
 *                 l and w are multiples of 4.
 *   blocked_rmcm  A row-major, B and R column-major; a work item computes a 2 x 2 block.
 *                 l is a multiple of 4, h and w multiples of 2.
 * OpenCL C 1.2.
 */

__kernel void blocked_rmrm(uint l, uint w,
                           __global const float4 *a,
                           __global const float4 *b,
                           __global float4 *r)
{
    const uint i = get_global_id(0);      /* row of R */
    const uint j = get_global_id(1);      /* group of 4 columns of R */
    const uint l4 = l >> 2;
    const uint w4 = w >> 2;
    float4 acc = (float4)(0.0f);
    for (uint k = 0; k < l4; ++k) {
        const float4 av = a[i * l4 + k];
        const uint kb = (k << 2) * w4 + j;
        acc += av.s0 * b[kb] + av.s1 * b[kb + w4] + av.s2 * b[kb + 2 * w4] + av.s3 * b[kb + 3 * w4];
    }
    r[i * w4 + j] = acc;
}

__kernel void blocked_rmcm(uint l, uint h,
                           __global const float4 *a,
                           __global const float4 *b,
                           __global float2 *r)
{
    const uint i = get_global_id(0);      /* pair of rows of R */
    const uint j = get_global_id(1);      /* pair of columns of R */
    const uint l4 = l >> 2;
    float4 acc = (float4)(0.0f);
    for (uint k = 0; k < l4; ++k) {
        const float4 a0 = a[(2 * i) * l4 + k];
        const float4 a1 = a[(2 * i + 1) * l4 + k];
        const float4 b0 = b[(2 * j) * l4 + k];
        const float4 b1 = b[(2 * j + 1) * l4 + k];
        acc += (float4)(dot(a0, b0), dot(a1, b0), dot(a0, b1), dot(a1, b1));
    }
    const uint ix = j * h + i;            /* float2 index of (2i, 2j) in column-major R */
    r[ix] = acc.s01;
    r[ix + (h >> 1)] = acc.s23;
}
