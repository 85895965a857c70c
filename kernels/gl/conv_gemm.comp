/* Convolution as KH*KW accumulating GEMMs on the unreplicated input (kn2row / kn2col) with the
 * fused epilogue (matmul.glsl): the GLSL ES 3.10 twin of conv_gemm.cl (read it for the design).
 * R = EPILOGUE(sum over the kernel offsets (ky, kx) of W_k x shift_k(B)); columns whose shifted
 * pixel falls outside the image read 0. The layouts come from the entry (kn2row: B and R
 * row-major, A column-major; kn2col: the reverse) through the index macros.
 *   MWI, NWI  rows and columns of R per invocation; MDIM, NDIM invocations per tile (the
 *             work-group is NDIM x MDIM; R is padded to whole tiles, so the range divides)
 *   LOCAL 1   stage KC channels of the weight rows and shifted input columns in shared memory
 *             per step (one group only; GROUPS > 1 runs the direct loop)
 *   CG, MG, GROUPS  input channels per group, output channels per group, groups
 * NVIDIA's GLSL compiler unrolls every loop with constant bounds under the preamble's pragma: the KH*KW x channel
 * loops of a 7x7 or a 64-channel layer then exceed its instruction limit ("too many
 * instructions"); the pragma below keeps them loops there (other compilers ignore it).
 */

#pragma optionNV(unroll none)

#ifndef CG
#define CG 1
#endif
#ifndef MG
#define MG 1
#endif
#ifndef GROUPS
#define GROUPS 1
#endif
#ifndef MWI
#define MWI 4
#endif
#ifndef NWI
#define NWI 4
#endif
#ifndef MDIM
#define MDIM 8
#endif
#ifndef NDIM
#define NDIM 8
#endif
#ifndef LOCAL
#define LOCAL 0
#endif
#ifndef KC
#define KC 16
#endif
#define MWG (MDIM * MWI)
#define NWG (NDIM * NWI)
#if LOCAL && GROUPS == 1
#define STAGED 1
#else
#define STAGED 0
#endif

#if STAGED
shared float alm[KC * MWG];
shared float blm[KC * NWG];
#endif

void main() {
    MALINN_GROUP_GUARD   /* a folded dispatch's extra work-groups (GLDevice.bind) */
    uint gx = MALINN_GLOBAL_X;
    uint gy = MALINN_GLOBAL_Y;
    uint col0 = (gx / uint(NDIM)) * uint(NDIM * NWI - NDIM) + gx;   /* columns col0 + j*NDIM */
    uint row0 = (gy / uint(MDIM)) * uint(MDIM * MWI - MDIM) + gy;   /* rows row0 + i*MDIM */

    int base[NWI];
    int y0[NWI];
    int x0[NWI];   /* per column: first pixel of its image, top-left tap */
    for (int j = 0; j < NWI; ++j) {
        uint col = col0 + uint(j * NDIM);
        uvec3 pixel = window_pixel(col);
        base[j] = int(pixel.x * uint(IH * IW));
        y0[j] = col < n ? int(pixel.y) * (SH) - (PT) : -(1 << 28);   /* a padding column reads nothing */
        x0[j] = int(pixel.z) * (SW) - (PL);
    }
#if GROUPS > 1
    uint first[MWI];   /* each row's first input channel */
    for (int i = 0; i < MWI; ++i)
        first[i] = min((row0 + uint(i * MDIM)) / uint(MG), uint(GROUPS - 1)) * uint(CG);
#endif
#if STAGED
    uint tx = gl_LocalInvocationID.x;
    uint ty = gl_LocalInvocationID.y;
    uint tid = ty * uint(NDIM) + tx;
    uint m0 = row0 - ty;   /* the work-group's first row */
#endif

    float acc[MWI][NWI];
    for (int i = 0; i < MWI; ++i)
        for (int j = 0; j < NWI; ++j)
            acc[i][j] = 0.0;

    for (int ky = 0; ky < (KH); ++ky) {
        for (int kx = 0; kx < (KW); ++kx) {
            int src[NWI];   /* the shifted input column of each result column, or -1 (masked) */
            for (int j = 0; j < NWI; ++j) {
                int iy = y0[j] + ky * (DH);
                int ix = x0[j] + kx * (DW);
                src[j] = (iy >= 0 && iy < (IH) && ix >= 0 && ix < (IW)) ? base[j] + iy * (IW) + ix : -1;
            }
            uint k0 = uint(ky * (KW) + kx) * uint(CG);
#if STAGED
            for (uint c0 = 0u; c0 < uint(CG); c0 += uint(KC)) {
                /* the weights' KC x MWG block and the shifted input's KC x NWG block, zero past CG */
                for (uint e = tid; e < uint(KC * MWG); e += uint(MDIM * NDIM)) {
                    uint kk = e / uint(MWG);
                    uint rr = e % uint(MWG);
                    alm[kk * uint(MWG) + rr] = c0 + kk < uint(CG) ? a[MALINN_INDEX_A(m0 + rr, k0 + c0 + kk, H, W)] : 0.0;
                }
                for (uint kk = ty; kk < uint(KC); kk += uint(MDIM))
                    for (int j = 0; j < NWI; ++j)
                        blm[kk * uint(NWG) + tx + uint(j * NDIM)] = c0 + kk < uint(CG) && src[j] >= 0
                            ? b[MALINN_INDEX_B(c0 + kk, uint(src[j]), l, c)] : 0.0;
                memoryBarrierShared();
                barrier();
                for (uint kk = 0u; kk < uint(KC); ++kk) {
                    float av[MWI];
                    float bv[NWI];
                    for (int i = 0; i < MWI; ++i)
                        av[i] = alm[kk * uint(MWG) + ty + uint(i * MDIM)];
                    for (int j = 0; j < NWI; ++j)
                        bv[j] = blm[kk * uint(NWG) + tx + uint(j * NDIM)];
                    for (int i = 0; i < MWI; ++i)
                        for (int j = 0; j < NWI; ++j)
                            acc[i][j] += av[i] * bv[j];
                }
                memoryBarrierShared();
                barrier();
            }
#else
            for (uint cc = 0u; cc < uint(CG); ++cc) {
                float av[MWI];
                for (int i = 0; i < MWI; ++i)
                    av[i] = a[MALINN_INDEX_A(row0 + uint(i * MDIM), k0 + cc, H, W)];
#if GROUPS == 1
                float bv[NWI];
                for (int j = 0; j < NWI; ++j)
                    bv[j] = src[j] >= 0 ? b[MALINN_INDEX_B(cc, uint(src[j]), l, c)] : 0.0;
                for (int i = 0; i < MWI; ++i)
                    for (int j = 0; j < NWI; ++j)
                        acc[i][j] += av[i] * bv[j];
#else
                for (int i = 0; i < MWI; ++i)
                    for (int j = 0; j < NWI; ++j)
                        acc[i][j] += src[j] >= 0 ? av[i] * b[MALINN_INDEX_B(first[i] + cc, uint(src[j]), l, c)] : 0.0;
#endif
            }
#endif
        }
    }

    for (int i = 0; i < MWI; ++i) {
        uint row = row0 + uint(i * MDIM);
        for (int j = 0; j < NWI; ++j) {
            uint col = col0 + uint(j * NDIM);
            r[MALINN_INDEX_R(row, col, h, w)] = EPILOGUE(acc[i][j], row, col);
        }
    }
}
