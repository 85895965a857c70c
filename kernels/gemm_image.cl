/* Matrix multiplication with the left operand read through the texture path (image2d_t), after
 * Qualcomm's Adreno SGEMM (seeds/adreno-matrix-multiply-part2.txt): one operand through the
 * texture cache, the other through the ordinary global-memory path.
 *
 * R = A x B with A (M x K) a Dense layer's W, which never changes, held as an RGBA float image:
 * texel (x, y) = A[4x .. 4x+3, y], i.e. A column-major with four rows per texel (width M/4,
 * height K). B (K x N) and R (M x N) are column-major buffers, so each sample is contiguous and R
 * feeds the next layer as its B. B is l x w (l the padded K), R is h x w; the image is A's padded
 * shape (H/4 texels wide, W high, H >= h, W >= l: A may be padded more than R), and the K loop runs
 * over k < l only. A work item computes 4 rows by NC columns of R (NC, default 8: the entry's
 * define), finished by the fused epilogue of epilogue.clh (bias, activation, affine; R's padding
 * written as 0). OpenCL C 1.2 with image support.
 */

#ifndef NC
#define NC 8
#endif

__constant sampler_t malinn_texel = CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_NONE | CLK_FILTER_NEAREST;

__kernel void gemm_image(MATMUL_SCALARS,
                         __read_only image2d_t a,
                         __global const float *b,
                         __global float *r,
                         EPILOGUE_BUFFERS)
{
    const uint gx = get_global_id(0);          /* rows 4gx .. 4gx+3 of R */
    const uint gy = get_global_id(1);          /* columns NC gy .. NC gy + NC-1 of R */
    float4 acc[NC];
    #pragma unroll
    for (uint j = 0; j < NC; ++j)
        acc[j] = (float4)(0.0f);
    for (uint k = 0; k < l; k += 4) {
        const float4 a0 = read_imagef(a, malinn_texel, (int2)(gx, k));
        const float4 a1 = read_imagef(a, malinn_texel, (int2)(gx, k + 1));
        const float4 a2 = read_imagef(a, malinn_texel, (int2)(gx, k + 2));
        const float4 a3 = read_imagef(a, malinn_texel, (int2)(gx, k + 3));
        #pragma unroll
        for (uint j = 0; j < NC; ++j) {
            const float4 bv = vload4(0, b + (size_t)(NC * gy + j) * l + k);
            acc[j] += bv.x * a0 + bv.y * a1 + bv.z * a2 + bv.w * a3;
        }
    }
    const uint row = 4 * gx;
    #pragma unroll
    for (uint j = 0; j < NC; ++j) {
        const uint col = NC * gy + j;
        __global float *rs = r + (size_t)col * h + row;
        rs[0] = EPILOGUE(acc[j].x, row, col);
        rs[1] = EPILOGUE(acc[j].y, row + 1, col);
        rs[2] = EPILOGUE(acc[j].z, row + 2, col);
        rs[3] = EPILOGUE(acc[j].w, row + 3, col);
    }
}
