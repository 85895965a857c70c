/* The patch matrix of im2col/im2row, any layouts: the GLSL ES 3.10 twin of spatial.cl's im2col
 * (read it for the design).
 *   R[(ky*KW + kx)*CIN + ch, (img, oy, ox)] = A[ch, (img, oy*SH + ky*DH - PT, ox*SW + kx*DW - PL)],
 *   0 outside the image; R's padding is written as 0. */

#ifndef CIN
#define CIN 1
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
        uint tap = row / uint(CIN);
        uint ch = row % uint(CIN);
        uint ky = tap / uint(KW);
        int iy = int(pixel.y) * (SH) + int(ky) * (DH) - (PT);
        int ix = int(pixel.z) * (SW) + int(tap % uint(KW)) * (DW) - (PL);
        if (iy >= 0 && iy < (IH) && ix >= 0 && ix < (IW))
            v = a[MALINN_INDEX_A(ch, pixel.x * uint(IH * IW) + uint(iy * (IW) + ix), H, W)];
    }
    r[MALINN_INDEX_R(row, col, h, w)] = v;
}
