/* Unblocked matrix multiplication R = A x B (Rovder 6.1, 7.1, 7.3).
 *
 * A is M x K, B is K x N, R is M x N, all padded as kernels/library.json declares; l is the padded
 * K, h and w the padded rows and columns of R. One work item computes one element of R.
 *   cross1  A row-major, B row-major    -> R row-major     (baseline, Source 6.1)
 *   rmcm    A row-major, B column-major -> R column-major  (Source 7.1)
 *   crossv  as rmcm, float4 dot products; l is a multiple of 4 (Source 7.2)
 * OpenCL C 1.2.
 */

__kernel void cross1(uint l, uint w,
                     __global const float *a,
                     __global const float *b,
                     __global float *r)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    float acc = 0.0f;
    for (uint k = 0; k < l; ++k)
        acc += a[row * l + k] * b[k * w + col];
    r[row * w + col] = acc;
}

__kernel void rmcm(uint l, uint h,
                   __global const float *a,
                   __global const float *b,
                   __global float *r)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    float acc = 0.0f;
    for (uint k = 0; k < l; ++k)
        acc += a[row * l + k] * b[col * l + k];
    r[col * h + row] = acc;
}

__kernel void crossv(uint l, uint h,
                     __global const float4 *a,
                     __global const float4 *b,
                     __global float *r)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    const uint l4 = l >> 2;
    float acc = 0.0f;
    for (uint k = 0; k < l4; ++k)
        acc += dot(a[row * l4 + k], b[col * l4 + k]);
    r[col * h + row] = acc;
}
