/* Pooling over volumes (Keras MaxPooling3D, AveragePooling3D): one work item per element of R,
 * R[ch, col] = max or mean of A[ch, window(col)].
 *
 * Matrix views (volume.clh): A is C x (batch*ID*IH*IW), R is C x (batch*OD*OH*OW). The window of
 * output voxel (oz, oy, ox) starts at (oz*SD - PF, oy*SH - PT, ox*SW - PL) and is KD x KH x KW;
 * taps outside the volume are left out (TensorFlow's 'same' pooling: the maximum of the taps
 * inside, the mean over the taps inside). A and R in any layout (the runtime prepends
 * MALINN_INDEX_A and MALINN_INDEX_R); the padding of R is written as 0.
 *
 * Compile-time parameters (-D defines, set per layer by the plan): KD, KH, KW (volume.clh); MAXPOOL
 * 1 for the maximum (started from -FLT_MAX, NaN taps skipped, as TensorFlow's max_pool3d), 0 for
 * the mean. The sizes, strides and padding are the last arguments (VOLUME_PARAMS, volume.clh).
 * Scalars: m, n logical rows and columns of R, H, W padded rows and columns of A, h, w of R.
 * OpenCL C 1.2.
 */

#ifndef MAXPOOL
#define MAXPOOL 1
#endif

__kernel void pool3d(uint m, uint n, uint H, uint W, uint h, uint w,
                     __global const float *a,
                     __global float *r
                     VOLUME_PARAMS)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    float v = 0.0f;
    if (row < m && col < n) {
        const uint4 voxel = volume_voxel(col);
        const uint base = voxel.x * (uint)(ID * IH * IW);
        const int z0 = (int)voxel.y * SD - PF, y0 = (int)voxel.z * SH - PT, x0 = (int)voxel.w * SW - PL;
        const int z1 = min(z0 + KD, ID), y1 = min(y0 + KH, IH), x1 = min(x0 + KW, IW);
        float acc = MAXPOOL ? -FLT_MAX : 0.0f;
        for (int iz = max(z0, 0); iz < z1; ++iz)
            for (int iy = max(y0, 0); iy < y1; ++iy)
                for (int ix = max(x0, 0); ix < x1; ++ix) {
                    const float x = a[MALINN_INDEX_A(row, base + (uint)((iz * IH + iy) * IW + ix), H, W)];
                    acc = MAXPOOL ? fmax(acc, x) : acc + x;
                }
#if MAXPOOL
        v = acc;
#else
        v = acc / (float)((z1 - max(z0, 0)) * (y1 - max(y0, 0)) * (x1 - max(x0, 0)));
#endif
    }
    r[MALINN_INDEX_R(row, col, h, w)] = v;
}
