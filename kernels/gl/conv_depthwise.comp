/* Depthwise convolution (DepthwiseConv2D, the first half of SeparableConv2D), direct, with the
 * fused epilogue (matmul.glsl): the GLSL ES 3.10 twin of conv_depthwise.cl (read it for the
 * design). Output channel o = c*DM + j reads input channel c = o / DM only:
 * R[o, col] = EPILOGUE(sum over (ky, kx) of A[o, ky*KW + kx] * B[c, shifted(col)]); taps outside
 * the image read 0; R's padding is written as 0 by the epilogue. */

#ifndef DM
#define DM 1
#endif

void main() {
    MALINN_GUARD
    uint row = MALINN_GLOBAL_X;
    uint col = MALINN_GLOBAL_Y;
    float acc = 0.0;
    if (row < m && col < n) {
        uvec3 pixel = window_pixel(col);
        uint base = pixel.x * uint(IH * IW);
        uint channel = row / uint(DM);
        for (int ky = 0; ky < (KH); ++ky) {
            int iy = int(pixel.y) * (SH) + ky * (DH) - (PT);
            if (iy < 0 || iy >= (IH))
                continue;
            for (int kx = 0; kx < (KW); ++kx) {
                int ix = int(pixel.z) * (SW) + kx * (DW) - (PL);
                if (ix >= 0 && ix < (IW))
                    acc += a[MALINN_INDEX_A(row, uint(ky * (KW) + kx), H, W)]
                         * b[MALINN_INDEX_B(channel, base + uint(iy * (IW) + ix), l, c)];
            }
        }
    }
    r[MALINN_INDEX_R(row, col, h, w)] = EPILOGUE(acc, row, col);
}
