/* 3-D transposed convolution (Keras Conv3DTranspose), direct: each output voxel sums the input
 * voxels and kernel taps that map onto it (as conv_transpose.cl does for images). Keras scatters
 * input voxel i through tap k to output voxel i*S + k*D - P along each axis; gathered per output
 * voxel o, tap k reads input voxel (o + P - k*D) / S where that is a whole number inside the volume:
 *   R[o, (img, oz, oy, ox)] = EPILOGUE(sum over (kz, ky, kx, ch) of A[o, ((kz*KH + ky)*KW + kx)*CIN + ch]
 *        * B[ch, (img, (oz + PF - kz*DD) / SD, (oy + PT - ky*DH) / SH, (ox + PL - kx*DW) / SW)]).
 *
 * Matrix views (volume.clh): B is CIN x (batch*ID*IH*IW), R is COUT x (batch*OD*OH*OW), A is
 * COUT x KD*KH*KW*CIN (Keras's kernel[kz, ky, kx, o, ch] at row o, column ((kz*KH + ky)*KW + kx)*CIN
 * + ch). B and R in any layout (the runtime prepends MALINN_INDEX_A/B/R); one work item per element
 * of R, its padding written as 0 by the epilogue.
 *
 * Compile-time parameters (-D defines, set per layer by the plan): KD, KH, KW, DD, DH, DW
 * (volume.clh), CIN the input channels (default 1); BIAS, ACTIVATION, AFFINE the epilogue;
 * WEIGHT_BITS the precision of A (weights.clh; the sums float in every precision). The sizes,
 * strides and PF, PT, PL (the voxels Keras removes from the front, top and left of the full
 * output) are the last arguments (VOLUME_PARAMS, volume.clh). Scalars: l, c padded rows and
 * columns of B; h, w of R; m, n logical rows and columns of R; H, W padded rows and columns of A;
 * p0..p3. OpenCL C 1.2.
 */

#ifndef CIN
#define CIN 1
#endif

__kernel void conv3d_transpose(uint l, uint c, uint h, uint w, uint m, uint n, uint H, uint W,
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
        for (int kz = 0; kz < KD; ++kz) {
            const int tz = (int)voxel.y + PF - kz * DD;
            if (tz < 0)
                break;   /* tz falls as kz grows */
            const int iz = tz / SD;
            if (iz * SD != tz || iz >= ID)
                continue;
            for (int ky = 0; ky < KH; ++ky) {
                const int ty = (int)voxel.z + PT - ky * DH;
                if (ty < 0)
                    break;
                const int iy = ty / SH;
                if (iy * SH != ty || iy >= IH)
                    continue;
                for (int kx = 0; kx < KW; ++kx) {
                    const int tx = (int)voxel.w + PL - kx * DW;
                    if (tx < 0)
                        break;
                    const int ix = tx / SW;
                    if (ix * SW != tx || ix >= IW)
                        continue;
                    const uint voxel_col = base + (uint)((iz * IH + iy) * IW + ix);
                    const uint tap = (uint)((kz * KH + ky) * KW + kx) * CIN;
                    for (uint ch = 0; ch < CIN; ++ch)
                        acc += LOAD_W(MALINN_INDEX_A(row, tap + ch, H, W), a) * b[MALINN_INDEX_B(ch, voxel_col, l, c)];
                }
            }
        }
    }
    r[MALINN_INDEX_R(row, col, h, w)] = EPILOGUE(acc, row, col);
}
