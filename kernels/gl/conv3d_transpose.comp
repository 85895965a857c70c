/* 3-D transposed convolution (Conv3DTranspose), direct, with the fused epilogue (matmul.glsl): the
 * GLSL ES 3.10 twin of conv3d_transpose.cl (read it for the design). Keras scatters input voxel i
 * through tap k to output voxel i*S + k*D - P along each axis; gathered per output voxel o, tap k
 * reads input voxel (o + P - k*D) / S where that is a whole number inside the volume:
 *   R[o, (img, oz, oy, ox)] = EPILOGUE(sum over (kz, ky, kx, ch) of A[o, ((kz*KH + ky)*KW + kx)*CIN + ch]
 *        * B[ch, (img, (oz + PF - kz*DD) / SD, (oy + PT - ky*DH) / SH, (ox + PL - kx*DW) / SW)]).
 * Matrix views (volume.glsl): B is CIN x (batch*ID*IH*IW), R is COUT x (batch*OD*OH*OW), A is
 * COUT x KD*KH*KW*CIN. B and R in any layout (the runtime prepends MALINN_INDEX_A/B/R); R's padding
 * written as 0 by the epilogue.
 * Defines: the geometry ID .. PL of volume.glsl (PF, PT, PL the voxels Keras removes from the
 * front, top and left of the full output; the OpenCL source's arguments are defines here); CIN the
 * input channels (default 1); BIAS, ACTIVATION, AFFINE the epilogue (matmul.glsl). A is read as
 * fp32 (no gl/weights.glsl: the GL backend refuses WEIGHT_BITS 16 and 8). Arguments (conv.glsl): l, c padded
 * rows and columns of B; h, w of R; m, n logical rows and columns of R; H, W padded rows and
 * columns of A; p0..p3.
 * NVIDIA's GLSL compiler unrolls every constant-bound loop under the preamble's pragma: the
 * window x channel loops of a wide layer then exceed its instruction limit (as conv_gemm.comp's);
 * the pragma below keeps them loops there (other compilers ignore it).
 */

#pragma optionNV(unroll none)

#ifndef CIN
#define CIN 1
#endif

void main() {
    MALINN_GUARD
    uint row = MALINN_GLOBAL_X;
    uint col = MALINN_GLOBAL_Y;
    float acc = 0.0;
    if (row < m && col < n) {
        uvec4 voxel = volume_voxel(col);
        uint base = voxel.x * uint(ID * IH * IW);
        for (int kz = 0; kz < (KD); ++kz) {
            int tz = int(voxel.y) + (PF) - kz * (DD);
            if (tz < 0)
                break;   /* tz falls as kz grows */
            int iz = tz / (SD);
            if (iz * (SD) != tz || iz >= (ID))
                continue;
            for (int ky = 0; ky < (KH); ++ky) {
                int ty = int(voxel.z) + (PT) - ky * (DH);
                if (ty < 0)
                    break;
                int iy = ty / (SH);
                if (iy * (SH) != ty || iy >= (IH))
                    continue;
                for (int kx = 0; kx < (KW); ++kx) {
                    int tx = int(voxel.w) + (PL) - kx * (DW);
                    if (tx < 0)
                        break;
                    int ix = tx / (SW);
                    if (ix * (SW) != tx || ix >= (IW))
                        continue;
                    uint voxel_col = base + uint((iz * (IH) + iy) * (IW) + ix);
                    uint tap = uint((kz * (KH) + ky) * (KW) + kx) * uint(CIN);
                    for (uint ch = 0u; ch < uint(CIN); ++ch)
                        acc += a[MALINN_INDEX_A(row, tap + ch, H, W)] * b[MALINN_INDEX_B(ch, voxel_col, l, c)];
                }
            }
        }
    }
    r[MALINN_INDEX_R(row, col, h, w)] = EPILOGUE(acc, row, col);
}
