/* Re-indexing of volumes without arithmetic (Keras ZeroPadding3D, Cropping3D, UpSampling3D):
 *   R[ch, (img, oz, oy, ox)] = A[ch, (img, (oz + OZ) / UZ, (oy + OY) / UY, (ox + OX) / UX)], 0 where
 *   the source voxel is outside the volume: ZeroPadding3D is OZ, OY, OX = -(front, top, left) and U
 *   = 1; Cropping3D is O = (front, top, left); UpSampling3D is O = 0, U = the size.
 *
 * Matrix views (volume.clh): A is C x (batch*ID*IH*IW), R is C x (batch*OD*OH*OW). A and R in any
 * layout (the runtime prepends MALINN_INDEX_A and MALINN_INDEX_R); R's padding written as 0.
 * Compile-time parameters (-D defines, set per layer by the plan): UZ, UY, UX (default 1). The
 * sizes (VOLUME_PARAMS, volume.clh: the strides and padding there unused), then OZ, OY, OX are the
 * last arguments. Scalars: m, n logical rows and columns of R, H, W padded rows and columns of A,
 * h, w of R. OpenCL C 1.2.
 */

#ifndef UZ
#define UZ 1
#endif
#ifndef UY
#define UY 1
#endif
#ifndef UX
#define UX 1
#endif

__kernel void spatial3d_copy(uint m, uint n, uint H, uint W, uint h, uint w,
                             __global const float *a,
                             __global float *r
                             VOLUME_PARAMS, const int OZ, const int OY, const int OX)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    float v = 0.0f;
    if (row < m && col < n) {
        const uint4 voxel = volume_voxel(col);
        const int sz = (int)voxel.y + OZ, sy = (int)voxel.z + OY, sx = (int)voxel.w + OX;
        if (sz >= 0 && sz < ID * UZ && sy >= 0 && sy < IH * UY && sx >= 0 && sx < IW * UX)
            v = a[MALINN_INDEX_A(row, voxel.x * (uint)(ID * IH * IW) + (uint)(((sz / UZ) * IH + sy / UY) * IW + sx / UX), H, W)];
    }
    r[MALINN_INDEX_R(row, col, h, w)] = v;
}
