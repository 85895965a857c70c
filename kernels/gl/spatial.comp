/* Spatial re-indexing without arithmetic (ZeroPadding, Cropping, UpSampling nearest), any
 * layouts: the GLSL ES 3.10 twin of spatial.cl's spatial_copy (read it for the design).
 *   R[ch, (img, oy, ox)] = A[ch, (img, (oy + OY) / UY, (ox + OX) / UX)], 0 where the source pixel is
 *   outside the image; R's padding is written as 0. */

#ifndef OY
#define OY 0
#endif
#ifndef OX
#define OX 0
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
        uvec3 pixel = window_pixel(col);
        int sy = int(pixel.y) + (OY), sx = int(pixel.z) + (OX);
        if (sy >= 0 && sy < (IH) * (UY) && sx >= 0 && sx < (IW) * (UX))
            v = a[MALINN_INDEX_A(row, pixel.x * uint(IH * IW) + uint(sy / (UY)) * uint(IW) + uint(sx / (UX)), H, W)];
    }
    r[MALINN_INDEX_R(row, col, h, w)] = v;
}
