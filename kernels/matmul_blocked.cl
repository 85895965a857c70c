/* Blocked matrix multiplication R = A x B (Rovder 7.4, Appendix 12.2-12.3; ARM's sgemmNT) with the
 * fused epilogue of epilogue.clh (bias, activation, affine; R's padding written as 0).
 *
 * A is M x K, B is K x N, R is M x N, each indexed with its own padded shape (kernels/library.json
 * declares the layouts and alignments): A is H x W, B is l x w, R is h x w, with H >= h and W >= l;
 * the K loop runs over k < l only.
 *   blocked_rmrm  A, B, R row-major; a work item computes 1 x 4 results (float4 of a row of R).
 *                 l, w and W are multiples of 4.
 *   blocked_rmcm  A row-major, B and R column-major; a work item computes a 2 x 2 block.
 *                 l and W are multiples of 4, h and w multiples of 2.
 * OpenCL C 1.2.
 */

__kernel void blocked_rmrm(MATMUL_SCALARS,
                           __global const float4 *a,
                           __global const float4 *b,
                           __global float4 *r,
                           EPILOGUE_BUFFERS)
{
    const uint i = get_global_id(0);      /* row of R */
    const uint j = get_global_id(1);      /* group of 4 columns of R */
    const uint l4 = l >> 2;
    const uint w4 = w >> 2;
    const size_t row_a = (size_t)i * (W >> 2);
    float4 acc = (float4)(0.0f);
    for (uint k = 0; k < l4; ++k) {
        const float4 av = a[row_a + k];
        const size_t kb = (size_t)(k << 2) * w4 + j;
        acc += av.s0 * b[kb] + av.s1 * b[kb + w4] + av.s2 * b[kb + 2 * w4] + av.s3 * b[kb + 3 * w4];
    }
    const uint col = 4 * j;
    __global float *rs = (__global float *)r + (size_t)i * w + col;   /* one by one, by the epilogue */
    rs[0] = EPILOGUE(acc.s0, i, col);
    rs[1] = EPILOGUE(acc.s1, i, col + 1);
    rs[2] = EPILOGUE(acc.s2, i, col + 2);
    rs[3] = EPILOGUE(acc.s3, i, col + 3);
}

__kernel void blocked_rmcm(MATMUL_SCALARS,
                           __global const float4 *a,
                           __global const float4 *b,
                           __global float2 *r,
                           EPILOGUE_BUFFERS)
{
    const uint i = get_global_id(0);      /* pair of rows of R */
    const uint j = get_global_id(1);      /* pair of columns of R */
    const uint l4 = l >> 2;
    const uint W4 = W >> 2;
    float4 acc = (float4)(0.0f);
    for (uint k = 0; k < l4; ++k) {
        const float4 a0 = a[(size_t)(2 * i) * W4 + k];
        const float4 a1 = a[(size_t)(2 * i + 1) * W4 + k];
        const float4 b0 = b[(size_t)(2 * j) * l4 + k];
        const float4 b1 = b[(size_t)(2 * j + 1) * l4 + k];
        acc += (float4)(dot(a0, b0), dot(a1, b0), dot(a0, b1), dot(a1, b1));
    }
    const uint row = 2 * i, col = 2 * j;
    const size_t ix = (size_t)j * h + i;  /* float2 index of (2i, 2j) in column-major R */
    __global float *rs = (__global float *)r;     /* the epilogue writes results one by one */
    rs[2 * ix] = EPILOGUE(acc.s0, row, col);
    rs[2 * ix + 1] = EPILOGUE(acc.s1, row + 1, col);
    rs[2 * ix + h] = EPILOGUE(acc.s2, row, col + 1);
    rs[2 * ix + h + 1] = EPILOGUE(acc.s3, row + 1, col + 1);
}
