/* Unblocked matrix multiplication R = A x B (Rovder 6.1, 7.1, 7.3) with the fused epilogue of
 * epilogue.clh (bias, activation, affine; R's padding written as 0).
 *
 * A is M x K, B is K x N, R is M x N, each indexed with its own padded shape (kernels/library.json
 * declares the layouts and alignments): A is H x W, B is l x w, R is h x w, with H >= h and
 * W >= l (A may be padded more than R: one weight buffer serves several kernels). The K loop runs
 * over k < l only. One work item computes one element of R.
 *   cross1  A row-major, B row-major    -> R row-major     (baseline, Source 6.1)
 *   rmcm    A row-major, B column-major -> R column-major  (Source 7.1)
 *   crossv  as rmcm, float4 dot products; l and W are multiples of 4 (Source 7.2)
 * OpenCL C 1.2.
 */

__kernel void cross1(MATMUL_SCALARS,
                     __global const float *a,
                     __global const float *b,
                     __global float *r,
                     EPILOGUE_BUFFERS)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    float acc = 0.0f;
    for (uint k = 0; k < l; ++k)
        acc += a[(size_t)row * W + k] * b[(size_t)k * w + col];
    r[(size_t)row * w + col] = EPILOGUE(acc, row, col);
}

__kernel void rmcm(MATMUL_SCALARS,
                   __global const float *a,
                   __global const float *b,
                   __global float *r,
                   EPILOGUE_BUFFERS)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    float acc = 0.0f;
    for (uint k = 0; k < l; ++k)
        acc += a[(size_t)row * W + k] * b[(size_t)col * l + k];
    r[(size_t)col * h + row] = EPILOGUE(acc, row, col);
}

__kernel void crossv(MATMUL_SCALARS,
                     __global const float4 *a,
                     __global const float4 *b,
                     __global float *r,
                     EPILOGUE_BUFFERS)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    const uint l4 = l >> 2;
    float acc = 0.0f;
    for (uint k = 0; k < l4; ++k)
        acc += dot(a[(size_t)row * (W >> 2) + k], b[(size_t)col * l4 + k]);
    r[(size_t)col * h + row] = EPILOGUE(acc, row, col);
}
