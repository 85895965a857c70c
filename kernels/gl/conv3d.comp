/* 3-D convolution (Conv3D), direct, with the fused epilogue (matmul.glsl): the GLSL ES 3.10 twin
 * of conv3d.cl (read it for the design). One invocation per output element sums its window of the
 * input voxels and the channels of its group:
 *   R[o, (img, oz, oy, ox)] = EPILOGUE(sum over (kz, ky, kx, ch) of A[o, ((kz*KH + ky)*KW + kx)*CG + ch]
 *        * B[(o / MG)*CG + ch, (img, oz*SD + kz*DD - PF, oy*SH + ky*DH - PT, ox*SW + kx*DW - PL)]),
 * a voxel outside the input counting as 0 (TensorFlow's padding).
 * Matrix views (volume.glsl): B is CIN x (batch*ID*IH*IW), R is COUT x (batch*OD*OH*OW), A is
 * COUT x KD*KH*KW*CG. B and R in any layout (the runtime prepends MALINN_INDEX_A/B/R); R's padding
 * written as 0 by the epilogue.
 * Defines: the geometry ID .. PL of volume.glsl (the OpenCL source's arguments are defines here);
 * CG input channels per group (default 1), MG output channels per group (default 1); BIAS,
 * ACTIVATION, AFFINE the epilogue (matmul.glsl). A is read as fp32 (no gl/weights.glsl: the GL
 * backend refuses WEIGHT_BITS 16 and 8). Arguments (conv.glsl): l, c padded rows and columns of B; h, w of R;
 * m, n logical rows and columns of R; H, W padded rows and columns of A; p0..p3.
 * NVIDIA's GLSL compiler unrolls every constant-bound loop under the preamble's pragma: the
 * window x channel loops of a wide layer then exceed its instruction limit (as conv_gemm.comp's);
 * the pragma below keeps them loops there (other compilers ignore it).
 */

#pragma optionNV(unroll none)

#ifndef CG
#define CG 1
#endif
#ifndef MG
#define MG 1
#endif

void main() {
    MALINN_GUARD
    uint row = MALINN_GLOBAL_X;
    uint col = MALINN_GLOBAL_Y;
    float acc = 0.0;
    if (row < m && col < n) {
        uvec4 voxel = volume_voxel(col);
        uint base = voxel.x * uint(ID * IH * IW);
        uint first = (row / uint(MG)) * uint(CG);   /* the group's first input channel */
        int z0 = int(voxel.y) * (SD) - (PF), y0 = int(voxel.z) * (SH) - (PT), x0 = int(voxel.w) * (SW) - (PL);
        for (int kz = 0; kz < (KD); ++kz) {
            int iz = z0 + kz * (DD);
            if (iz < 0 || iz >= (ID))
                continue;
            for (int ky = 0; ky < (KH); ++ky) {
                int iy = y0 + ky * (DH);
                if (iy < 0 || iy >= (IH))
                    continue;
                for (int kx = 0; kx < (KW); ++kx) {
                    int ix = x0 + kx * (DW);
                    if (ix < 0 || ix >= (IW))
                        continue;
                    uint voxel_col = base + uint((iz * (IH) + iy) * (IW) + ix);
                    uint tap = uint((kz * (KH) + ky) * (KW) + kx) * uint(CG);
                    for (uint ch = 0u; ch < uint(CG); ++ch)
                        acc += a[MALINN_INDEX_A(row, tap + ch, H, W)]
                             * b[MALINN_INDEX_B(first + ch, voxel_col, l, c)];
                }
            }
        }
    }
    r[MALINN_INDEX_R(row, col, h, w)] = EPILOGUE(acc, row, col);
}
