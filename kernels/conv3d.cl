/* 3-D convolution (Keras Conv3D), direct: each work item computes one output element, summing its
 * window of the input voxels and channels of its group:
 *   R[o, (img, oz, oy, ox)] = EPILOGUE(sum over (kz, ky, kx, ch) of A[o, ((kz*KH + ky)*KW + kx)*CG + ch]
 *        * B[(o / MG)*CG + ch, (img, oz*SD + kz*DD - PF, oy*SH + ky*DH - PT, ox*SW + kx*DW - PL)]),
 * a voxel outside the input counting as 0 (TensorFlow's padding: PF, PT, PL zeros before, the rest
 * after).
 *
 * Matrix views (volume.clh): B is CIN x (batch*ID*IH*IW), R is COUT x (batch*OD*OH*OW), A is
 * COUT x KD*KH*KW*CG (Keras's kernel[kz, ky, kx, ch, o] at row o, column ((kz*KH + ky)*KW + kx)*CG
 * + ch). B and R in any layout (the runtime prepends MALINN_INDEX_A/B/R); one work item per element
 * of R, its padding written as 0 by the epilogue.
 *
 * Compile-time parameters (-D defines, set per layer by the plan): KD, KH, KW, DD, DH, DW
 * (volume.clh); CG input channels per group (default 1), MG output channels per group (default
 * 1: the groups are COUT / MG); BIAS, ACTIVATION, AFFINE the epilogue; WEIGHT_BITS the precision of
 * A (weights.clh; the sums float in every precision). The sizes, strides and padding are the last
 * arguments (VOLUME_PARAMS, volume.clh). Scalars: l, c padded rows and columns of B; h, w of R; m,
 * n logical rows and columns of R; H, W padded rows and columns of A; p0..p3. OpenCL C 1.2.
 */

#ifndef CG
#define CG 1
#endif
#ifndef MG
#define MG 1
#endif

__kernel void conv3d(uint l, uint c, uint h, uint w, uint m, uint n, uint H, uint W,
                     float p0, float p1, float p2, float p3,
                     __global const WEIGHT *a,
                     __global const float *b,
                     __global float *r,
                     EPILOGUE_BUFFERS
                     VOLUME_PARAMS)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    float acc = 0.0f;
    if (row < m && col < n) {
        const uint4 voxel = volume_voxel(col);
        const uint base = voxel.x * (uint)(ID * IH * IW);
        const uint first = (row / MG) * CG;   /* the group's first input channel */
        const int z0 = (int)voxel.y * SD - PF, y0 = (int)voxel.z * SH - PT, x0 = (int)voxel.w * SW - PL;
        for (int kz = 0; kz < KD; ++kz) {
            const int iz = z0 + kz * DD;
            if (iz < 0 || iz >= ID)
                continue;
            for (int ky = 0; ky < KH; ++ky) {
                const int iy = y0 + ky * DH;
                if (iy < 0 || iy >= IH)
                    continue;
                for (int kx = 0; kx < KW; ++kx) {
                    const int ix = x0 + kx * DW;
                    if (ix < 0 || ix >= IW)
                        continue;
                    const uint voxel_col = base + (uint)((iz * IH + iy) * IW + ix);
                    const uint tap = (uint)((kz * KH + ky) * KW + kx) * CG;
                    for (uint ch = 0; ch < CG; ++ch)
                        acc += LOAD_W(MALINN_INDEX_A(row, tap + ch, H, W), a)
                               * b[MALINN_INDEX_B(first + ch, voxel_col, l, c)];
                }
            }
        }
    }
    r[MALINN_INDEX_R(row, col, h, w)] = EPILOGUE(acc, row, col);
}
