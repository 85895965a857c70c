/* Hybrid Morton matrix multiplication R = A x B (Rovder 8.4, Appendix 12.6-12.7) with the fused
 * epilogue of epilogue.clh (bias, activation, affine; R's padding written as 0).
 *
 * A is M x K, B is K x N, R is M x N, each indexed with its own padded shape (kernels/library.json
 * declares the layouts and alignments): A is H x W, B is l x w, R is h x w, with H >= h and W >= l;
 * the K loop runs over k < l only. A work item computes a 2 x 2 block of R: rows 2i, 2i+1 and
 * columns 2j, 2j+1.
 *   morton_4_2  A in R_2_4_R, B in C_4_2_C -> R in C_4_2_C (the thesis's best on Mali)
 *   morton_4_4  A in R_4_4_R, B in C_4_4_C -> R in C_4_4_C
 * In R_2_4_R a 2 x 4 chunk is two float4 rows; in C_4_2_C a 4 x 2 chunk is two float4 columns,
 * so both operands stream as consecutive float4 pairs along K.
 * OpenCL C 1.2.
 */

__kernel void morton_4_2(MATMUL_SCALARS,
                         __global const float4 *a,
                         __global const float4 *b,
                         __global float2 *r,
                         EPILOGUE_BUFFERS)
{
    const uint i = get_global_id(0);
    const uint j = get_global_id(1);
    const size_t base_a = (size_t)i * (W >> 1);   /* chunk-row i of A: W/4 chunks of 2 float4 */
    const size_t base_b = (size_t)j * (l >> 1);   /* chunk-column j of B: l/4 chunks of 2 float4 */
    float4 acc = (float4)(0.0f);
    for (uint k = 0; k < (l >> 2); ++k) {
        const float4 a0 = a[base_a + 2 * k];
        const float4 a1 = a[base_a + 2 * k + 1];
        const float4 b0 = b[base_b + 2 * k];
        const float4 b1 = b[base_b + 2 * k + 1];
        acc += (float4)(dot(a0, b0), dot(a1, b0), dot(a0, b1), dot(a1, b1));
    }
    /* (2i, 2j) in C_4_2_C: chunk (i/2, j) of 8 floats, column 0, row 2(i&1) inside it. */
    const size_t ix = (size_t)(h >> 2) * j * 4 + (i >> 1) * 4 + (i & 1);
    const uint row = 2 * i, col = 2 * j;
    __global float *rs = (__global float *)r;     /* the epilogue writes results one by one */
    rs[2 * ix] = EPILOGUE(acc.s0, row, col);
    rs[2 * ix + 1] = EPILOGUE(acc.s1, row + 1, col);
    rs[2 * ix + 4] = EPILOGUE(acc.s2, row, col + 1);
    rs[2 * ix + 5] = EPILOGUE(acc.s3, row + 1, col + 1);
}

__kernel void morton_4_4(MATMUL_SCALARS,
                         __global const float4 *a,
                         __global const float4 *b,
                         __global float2 *r,
                         EPILOGUE_BUFFERS)
{
    const uint i = get_global_id(0);
    const uint j = get_global_id(1);
    const size_t base_a = (size_t)(i >> 1) * W + ((2 * i) & 3);   /* 4-row chunk of A, row inside it */
    const size_t base_b = (size_t)(j >> 1) * l + ((2 * j) & 3);   /* 4-column chunk of B, column inside it */
    float4 acc = (float4)(0.0f);
    for (uint k = 0; k < l; k += 4) {
        const float4 a0 = a[base_a + k];
        const float4 a1 = a[base_a + k + 1];
        const float4 b0 = b[base_b + k];
        const float4 b1 = b[base_b + k + 1];
        acc += (float4)(dot(a0, b0), dot(a1, b0), dot(a0, b1), dot(a1, b1));
    }
    /* (2i, 2j) in C_4_4_C: chunk (i/2, j/2) of 16 floats, column (2j)&3, row (2i)&3 inside it. */
    const size_t ix = (size_t)(h * 2) * (j >> 1) + (i >> 1) * 8 + ((2 * j) & 3) * 2 + (i & 1);
    const uint row = 2 * i, col = 2 * j;
    __global float *rs = (__global float *)r;     /* the epilogue writes results one by one */
    rs[2 * ix] = EPILOGUE(acc.s0, row, col);
    rs[2 * ix + 1] = EPILOGUE(acc.s1, row + 1, col);
    rs[2 * ix + 4] = EPILOGUE(acc.s2, row, col + 1);
    rs[2 * ix + 5] = EPILOGUE(acc.s3, row + 1, col + 1);
}
