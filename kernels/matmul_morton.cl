/* Hybrid Morton matrix multiplication R = A x B (Rovder 8.4, Appendix 12.6-12.7).
 *
 * A is M x K, B is K x N, R is M x N, padded as kernels/library.json declares; l is the padded K
 * and h the padded rows of R. A work item computes a 2 x 2 block of R: rows 2i, 2i+1 and
 * columns 2j, 2j+1.
 *   morton_4_2  A in R_2_4_R, B in C_4_2_C -> R in C_4_2_C (the thesis's best on Mali)
 *   morton_4_4  A in R_4_4_R, B in C_4_4_C -> R in C_4_4_C
 * In R_2_4_R a 2 x 4 chunk is two float4 rows; in C_4_2_C a 4 x 2 chunk is two float4 columns,
 * so both operands stream as consecutive float4 pairs along K.
 * OpenCL C 1.2.
 */

__kernel void morton_4_2(uint l, uint h,
                         __global const float4 *a,
                         __global const float4 *b,
                         __global float2 *r)
{
    const uint i = get_global_id(0);
    const uint j = get_global_id(1);
    const uint base_a = i * (l >> 1);     /* chunk-row i of A: l/4 chunks of 2 float4 */
    const uint base_b = j * (l >> 1);     /* chunk-column j of B */
    float4 acc = (float4)(0.0f);
    for (uint k = 0; k < (l >> 2); ++k) {
        const float4 a0 = a[base_a + 2 * k];
        const float4 a1 = a[base_a + 2 * k + 1];
        const float4 b0 = b[base_b + 2 * k];
        const float4 b1 = b[base_b + 2 * k + 1];
        acc += (float4)(dot(a0, b0), dot(a1, b0), dot(a0, b1), dot(a1, b1));
    }
    /* (2i, 2j) in C_4_2_C: chunk (i/2, j) of 8 floats, column 0, row 2(i&1) inside it. */
    const uint ix = (h >> 2) * j * 4 + (i >> 1) * 4 + (i & 1);
    r[ix] = acc.s01;
    r[ix + 2] = acc.s23;
}

__kernel void morton_4_4(uint l, uint h,
                         __global const float4 *a,
                         __global const float4 *b,
                         __global float2 *r)
{
    const uint i = get_global_id(0);
    const uint j = get_global_id(1);
    const uint base_a = (i >> 1) * l + ((2 * i) & 3);   /* 4-row chunk of A, row inside it */
    const uint base_b = (j >> 1) * l + ((2 * j) & 3);   /* 4-column chunk of B, column inside it */
    float4 acc = (float4)(0.0f);
    for (uint k = 0; k < l; k += 4) {
        const float4 a0 = a[base_a + k];
        const float4 a1 = a[base_a + k + 1];
        const float4 b0 = b[base_b + k];
        const float4 b1 = b[base_b + k + 1];
        acc += (float4)(dot(a0, b0), dot(a1, b0), dot(a0, b1), dot(a1, b1));
    }
    /* (2i, 2j) in C_4_4_C: chunk (i/2, j/2) of 16 floats, column (2j)&3, row (2i)&3 inside it. */
    const uint ix = (h * 2) * (j >> 1) + (i >> 1) * 8 + ((2 * j) & 3) * 2 + (i & 1);
    r[ix] = acc.s01;
    r[ix + 2] = acc.s23;
}
