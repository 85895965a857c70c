/* Pooling over volumes (MaxPooling3D, AveragePooling3D), any layouts: the GLSL ES 3.10 twin of
 * pool3d.cl (read it for the design). R[ch, col] = max or mean of A[ch, window(col)], the window
 * of output voxel (oz, oy, ox) starting at (oz*SD - PF, oy*SH - PT, ox*SW - PL), KD x KH x KW;
 * taps outside the volume are left out (TensorFlow's 'same' pooling). Matrix views (volume.glsl):
 * A is C x (batch*ID*IH*IW), R is C x (batch*OD*OH*OW); R's padding is written as 0.
 * Defines: the geometry ID .. PL, KD, KH, KW of volume.glsl (the OpenCL source's arguments are
 * defines here); MAXPOOL 1 (default) for the maximum (started from -FLT_MAX, NaN taps skipped, as
 * TensorFlow's max_pool3d and OpenCL's fmax), 0 for the mean. Arguments: m, n logical rows and
 * columns of R, H, W padded rows and columns of A, h, w of R.
 */

#ifndef MAXPOOL
#define MAXPOOL 1
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
        uint base = voxel.x * uint(ID * IH * IW);
        int z0 = int(voxel.y) * (SD) - (PF), y0 = int(voxel.z) * (SH) - (PT), x0 = int(voxel.w) * (SW) - (PL);
        int z1 = min(z0 + (KD), ID), y1 = min(y0 + (KH), IH), x1 = min(x0 + (KW), IW);
#if MAXPOOL
        float acc = -3.40282347e38;   /* -FLT_MAX */
#else
        float acc = 0.0;
#endif
        for (int iz = max(z0, 0); iz < z1; ++iz)
            for (int iy = max(y0, 0); iy < y1; ++iy)
                for (int ix = max(x0, 0); ix < x1; ++ix) {
                    float x = a[MALINN_INDEX_A(row, base + uint((iz * (IH) + iy) * (IW) + ix), H, W)];
#if MAXPOOL
                    acc = isnan(x) ? acc : max(acc, x);
#else
                    acc += x;
#endif
                }
#if MAXPOOL
        v = acc;
#else
        v = acc / float((z1 - max(z0, 0)) * (y1 - max(y0, 0)) * (x1 - max(x0, 0)));
#endif
    }
    r[MALINN_INDEX_R(row, col, h, w)] = v;
}
