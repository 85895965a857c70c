/* Re-indexing of volumes without arithmetic (ZeroPadding3D, Cropping3D, UpSampling3D), any
 * layouts: the GLSL ES 3.10 twin of spatial3d.cl's spatial3d_copy (read it for the design).
 *   R[ch, (img, oz, oy, ox)] = A[ch, (img, (oz + OZ) / UZ, (oy + OY) / UY, (ox + OX) / UX)], 0 where
 *   the source voxel is outside the volume; R's padding is written as 0.
 * Defines: ID, IH, IW, OD, OH, OW of volume.glsl (its strides and padding unused; the OpenCL
 * source's arguments are defines here); OZ, OY, OX the offsets (default 0: ZeroPadding3D's are
 * negative, Cropping3D's positive); UZ, UY, UX the repeats (default 1). Arguments: m, n logical
 * rows and columns of R, H, W padded rows and columns of A, h, w of R.
 */

#ifndef OZ
#define OZ 0
#endif
#ifndef OY
#define OY 0
#endif
#ifndef OX
#define OX 0
#endif
#ifndef UZ
#define UZ 1
#endif
#ifndef UY
#define UY 1
#endif
#ifndef UX
#define UX 1
#endif

MALINN_ARGS(uint m; uint n; uint H; uint W; uint h; uint w;)
layout(std430, binding = 0) readonly buffer BufA { float a[]; };
layout(std430, binding = 1) writeonly buffer BufR { float r[]; };

void main() {
    MALINN_GUARD
    uint row = MALINN_GLOBAL_X;
    uint col = MALINN_GLOBAL_Y;
    float v = 0.0;
    if (row < m && col < n) {
        uvec4 voxel = volume_voxel(col);
        int sz = int(voxel.y) + (OZ), sy = int(voxel.z) + (OY), sx = int(voxel.w) + (OX);
        if (sz >= 0 && sz < (ID) * (UZ) && sy >= 0 && sy < (IH) * (UY) && sx >= 0 && sx < (IW) * (UX))
            v = a[MALINN_INDEX_A(row, voxel.x * uint(ID * IH * IW)
                                      + uint(((sz / (UZ)) * (IH) + sy / (UY)) * (IW) + sx / (UX)), H, W)];
    }
    r[MALINN_INDEX_R(row, col, h, w)] = v;
}
