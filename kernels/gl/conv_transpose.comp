/* Transposed convolution (Conv1DTranspose, Conv2DTranspose), direct, with the fused epilogue
 * (matmul.glsl): the GLSL ES 3.10 twin of conv_transpose.cl (read it for the design). Keras
 * scatters input pixel i through tap k to output pixel i*S + k*D - P; gathered per output pixel o,
 * tap k reads input pixel (o + P - k*D) / S where that is a whole number inside the image:
 *   R[o, (img, oy, ox)] = EPILOGUE(sum over (ky, kx, ch) of A[o, (ky*KW + kx)*CIN + ch]
 *                                  * B[ch, (img, (oy + PT - ky*DH) / SH, (ox + PL - kx*DW) / SW)]).
 * Matrix views: B is CIN x (batch*IH*IW), R is COUT x (batch*OH*OW), A is COUT x KH*KW*CIN (row o,
 * column (ky*KW + kx)*CIN + ch: Keras's kernel[ky, kx, o, ch]). B and R in any layout (the runtime
 * prepends MALINN_INDEX_A/B/R); one invocation per element of R, its padding written as 0.
 * Defines: IH, IW, OH, OW, KH, KW, SH, SW, DH, DW, PT, PL (window.glsl: PT and PL the padding Keras
 * removes from the top and left of the full output; the OpenCL source's WINDOW_ARGS arguments are
 * defines here), CIN the input channels (default 1); BIAS, ACTIVATION, AFFINE the epilogue
 * (matmul.glsl). A is read as fp32 (no gl/weights.glsl: the GL backend refuses WEIGHT_BITS 16 and 8).
 * Arguments (conv.glsl): l, c padded rows and columns of B; h, w of R; m, n logical rows and columns
 * of R; H, W padded rows and columns of A; p0..p3.
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
        uvec3 pixel = window_pixel(col);
        uint base = pixel.x * uint(IH * IW);
        for (int ky = 0; ky < (KH); ++ky) {
            int ty = int(pixel.y) + (PT) - ky * (DH);
            if (ty < 0)
                break;   /* ty falls as ky grows */
            int iy = ty / (SH);
            if (iy * (SH) != ty || iy >= (IH))
                continue;
            for (int kx = 0; kx < (KW); ++kx) {
                int tx = int(pixel.z) + (PL) - kx * (DW);
                if (tx < 0)
                    break;
                int ix = tx / (SW);
                if (ix * (SW) != tx || ix >= (IW))
                    continue;
                uint pixel_col = base + uint(iy * (IW) + ix);
                uint tap = uint(ky * (KW) + kx) * uint(CIN);
                for (uint ch = 0u; ch < uint(CIN); ++ch)
                    acc += a[MALINN_INDEX_A(row, tap + ch, H, W)] * b[MALINN_INDEX_B(ch, pixel_col, l, c)];
            }
        }
    }
    r[MALINN_INDEX_R(row, col, h, w)] = EPILOGUE(acc, row, col);
}
