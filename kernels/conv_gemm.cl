/* Convolution as k^2 accumulating GEMMs on the unreplicated input (kn2row / kn2col, after
 * "kn2row-convolution-via-gemm"), with the shift-and-add done on the device and the fused epilogue
 * of epilogue.clh: R = AFFINE(ACTIVATION(sum over the KH*KW kernel offsets of W_k x shift_k(B) + bias)).
 *
 * Matrix views: the input B is CIN x (batch*IH*IW), the result R is
 * COUT x (batch*OH*OW), column = (image*H + y)*W + x. The weights A are COUT x (KH*KW*CG): column
 * (ky*KW + kx)*CG + c holds Keras's kernel[ky, kx, c, m] (CG = CIN / GROUPS input channels per
 * group; output row m belongs to group m / MG). For each kernel offset (ky, kx) the sub-matrix
 * W_k (COUT x CG) multiplies the input shifted by (ky*DH - PT, kx*DW - PL) and strided by (SH, SW);
 * columns whose shifted pixel falls outside the image read 0 (boundary masking), so no k^2-times
 * buffer (im2col) and no [k^2 COUT] x [H W] buffer (kn2row's original form) ever exists: the k^2
 * products accumulate in each work item's registers.
 *
 * One source, two library entries: kn2row reads B and writes R row-major ("R": one channel plane
 * per row; a work-group's neighbouring columns read neighbouring pixels) and A column-major;
 * kn2col reads B and writes R column-major ("C": Keras's NHWC order, the channels of a pixel
 * contiguous) and A row-major. The runtime prepends MALINN_INDEX_A/B/R for the entry's layouts.
 *
 * Compile-time parameters (-D defines; the plan sets the geometry per layer):
 *   IH, IW, OH, OW   input and output spatial sizes     KH, KW  kernel size
 *   SH, SW strides   DH, DW dilations                    PT, PL  padding above and left
 *   CG input channels per group, MG output channels per group, GROUPS
 *   MWI, NWI rows and columns of R per work item; MDIM, NDIM items per tile along rows and columns
 *   (a tile of MDIM*MWI rows x NDIM*NWI columns; R is padded to whole tiles)
 *   LOCAL    1: a work-group (NDIM x MDIM items, required) stages KC channels of its weight rows and
 *            of its shifted input columns in local memory per step (one group only; GROUPS > 1
 *            runs the direct loop); 0: every item reads global memory (through the caches);
 *            2 (kn2col's layouts only: A row-major, B column-major, a tap's channels contiguous in
 *            both): the staging of 1 with each load running along the channels, VW floats at a
 *            time (vload), consecutive items reading consecutive vectors (coalesced), the source
 *            pixel of each of the work-group's columns computed once into local memory, and the
 *            local tiles padded by one column against bank conflicts. An implicit GEMM: the
 *            im2row GEMM's tiles, gathered from the unreplicated input per kernel tap
 *   KC       channels staged per step with LOCAL
 *   VW       floats per load with LOCAL 2 (1, 2 or 4; 1 where CG or KC is not a multiple of it)
 *   BIAS, ACTIVATION, AFFINE  the fused epilogue
 *   WEIGHT_BITS  the precision of A (weights.clh: 32 float, 16 half, 8 int8 with a scale per row,
 *            which the epilogue applies); the sums are float in every precision
 * Scalars: l, c padded rows and columns of B; h, w of R; m, n logical rows and columns of R;
 * H, W padded rows and columns of A; p0..p3 the activation's parameters. OpenCL C 1.2.
 */

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
#ifndef VW
#define VW 4
#endif
#define MWG (MDIM * MWI)
#define NWG (NDIM * NWI)
#if LOCAL == 2 && GROUPS == 1
#define STAGED 2
#elif LOCAL && GROUPS == 1
#define STAGED 1
#else
#define STAGED 0
#endif
#if STAGED == 2
#if VW == 4 && CG % 4 == 0 && KC % 4 == 0
#define CVW 4
#define CVLOAD(p) vload4(0, (p))
#define CVLOAD_A(p) LOAD_W4(0, (p))
typedef float4 cvec;
#elif VW >= 2 && CG % 2 == 0 && KC % 2 == 0
#define CVW 2
#define CVLOAD(p) vload2(0, (p))
#define CVLOAD_A(p) LOAD_W2(0, (p))
typedef float2 cvec;
#else
#define CVW 1
#define CVLOAD(p) (*(p))
#define CVLOAD_A(p) LOAD_W(0, (p))
typedef float cvec;
#endif
#if CVW == 4
#define vstore_cvec(v, p) vstore4((v), 0, (p))
#elif CVW == 2
#define vstore_cvec(v, p) vstore2((v), 0, (p))
#endif
#define KV (KC / CVW)            /* vectors per staged row of KC channels */
#define ALD (MWG + 1)            /* local row lengths, padded against bank conflicts */
#define BLD (NWG + 1)
#endif

#if STAGED
__kernel __attribute__((reqd_work_group_size(NDIM, MDIM, 1))) void conv_gemm(
#else
__kernel void conv_gemm(
#endif
                        uint l, uint c, uint h, uint w, uint m, uint n, uint H, uint W,
                        float p0, float p1, float p2, float p3,
                        __global const WEIGHT *a,
                        __global const float *b,
                        __global float *r,
                        EPILOGUE_BUFFERS)
{
    const uint gx = get_global_id(0);
    const uint gy = get_global_id(1);
    /* a remainder is spelt x - (x / d) * d throughout: LLVM turns a '%' beside a '/' of the same
     * operands into a 'freeze' instruction that Oclgrind's uninitialized-value check cannot run */
    const uint col0 = (gx / NDIM) * (NDIM * NWI - NDIM) + gx;   /* columns col0 + j*NDIM */
    const uint row0 = (gy / MDIM) * (MDIM * MWI - MDIM) + gy;   /* rows row0 + i*MDIM */

    int base[NWI], y0[NWI], x0[NWI];   /* per column: first pixel of its image, top-left tap */
    #pragma unroll
    for (uint j = 0; j < NWI; ++j) {
        const uint col = col0 + j * NDIM;
        const uint3 pixel = window_pixel(col);
        const uint image = pixel.x, oy = pixel.y, ox = pixel.z;
        base[j] = (int)(image * (IH * IW));
        y0[j] = col < n ? (int)(oy * SH) - PT : -(1 << 28);   /* a padding column reads nothing */
        x0[j] = (int)(ox * SW) - PL;
    }
#if GROUPS > 1
    uint first[MWI];   /* each row's first input channel */
    #pragma unroll
    for (uint i = 0; i < MWI; ++i)
        first[i] = min((row0 + i * MDIM) / MG, (uint)(GROUPS - 1)) * CG;
#endif

#if STAGED == 1
    __local float alm[KC * MWG];
    __local float blm[KC * NWG];
    const uint tx = get_local_id(0);
    const uint ty = get_local_id(1);
    const uint tid = ty * NDIM + tx;
    const uint m0 = row0 - ty;   /* the work-group's first row */
#elif STAGED == 2
    __local float alm[KC * ALD];
    __local float blm[KC * BLD];
    __local int lbase[NWG], ly0[NWG], lx0[NWG];   /* each of the work-group's columns' source pixel */
    const uint tx = get_local_id(0);
    const uint ty = get_local_id(1);
    const uint tid = ty * NDIM + tx;
    const uint m0 = row0 - ty;
    const uint n0 = col0 - tx;   /* the work-group's first column */
    for (uint e = tid; e < NWG; e += MDIM * NDIM) {
        const uint3 pixel = window_pixel(n0 + e);
        lbase[e] = (int)(pixel.x * (IH * IW));
        ly0[e] = n0 + e < n ? (int)(pixel.y * SH) - PT : -(1 << 28);
        lx0[e] = (int)(pixel.z * SW) - PL;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
#endif

    float acc[MWI][NWI];
    #pragma unroll
    for (uint i = 0; i < MWI; ++i)
        #pragma unroll
        for (uint j = 0; j < NWI; ++j)
            acc[i][j] = 0.0f;

    for (uint ky = 0; ky < KH; ++ky) {
        for (uint kx = 0; kx < KW; ++kx) {
            int src[NWI];   /* the shifted input column of each result column, or -1 (masked) */
            #pragma unroll
            for (uint j = 0; j < NWI; ++j) {
                const int iy = y0[j] + (int)(ky * DH);
                const int ix = x0[j] + (int)(kx * DW);
                src[j] = (iy >= 0 && iy < IH && ix >= 0 && ix < IW) ? base[j] + iy * IW + ix : -1;
            }
            const uint k0 = (ky * KW + kx) * CG;
#if STAGED == 2
            for (uint c0 = 0; c0 < CG; c0 += KC) {
                /* the weights' MWG x KC block: each row's KC channels of this tap are contiguous */
                for (uint e = tid; e < MWG * KV; e += MDIM * NDIM) {
                    const uint r = e / KV;
                    const uint kk = (e - r * KV) * CVW;
                    cvec v = (cvec)(0.0f);
                    if (c0 + kk < CG)
                        v = CVLOAD_A(a + MALINN_INDEX_A(m0 + r, k0 + c0 + kk, H, W));
#if CVW == 1
                    alm[kk * ALD + r] = v;
#else
                    float t[CVW];
                    vstore_cvec(v, t);
                    #pragma unroll
                    for (uint q = 0; q < CVW; ++q)
                        alm[(kk + q) * ALD + r] = t[q];
#endif
                }
                /* the shifted input's KC x NWG block: a pixel's channels are contiguous */
                for (uint e = tid; e < NWG * KV; e += MDIM * NDIM) {
                    const uint col = e / KV;
                    const uint kk = (e - col * KV) * CVW;
                    const int iy = ly0[col] + (int)(ky * DH);
                    const int ix = lx0[col] + (int)(kx * DW);
                    cvec v = (cvec)(0.0f);
                    if (c0 + kk < CG && iy >= 0 && iy < IH && ix >= 0 && ix < IW)
                        v = CVLOAD(b + MALINN_INDEX_B(c0 + kk, (uint)(lbase[col] + iy * IW + ix), l, c));
#if CVW == 1
                    blm[kk * BLD + col] = v;
#else
                    float t[CVW];
                    vstore_cvec(v, t);
                    #pragma unroll
                    for (uint q = 0; q < CVW; ++q)
                        blm[(kk + q) * BLD + col] = t[q];
#endif
                }
                barrier(CLK_LOCAL_MEM_FENCE);
                #pragma unroll 8
                for (uint kk = 0; kk < KC; ++kk) {
                    float av[MWI], bv[NWI];
                    #pragma unroll
                    for (uint i = 0; i < MWI; ++i)
                        av[i] = alm[kk * ALD + ty + i * MDIM];
                    #pragma unroll
                    for (uint j = 0; j < NWI; ++j)
                        bv[j] = blm[kk * BLD + tx + j * NDIM];
                    #pragma unroll
                    for (uint i = 0; i < MWI; ++i)
                        #pragma unroll
                        for (uint j = 0; j < NWI; ++j)
                            acc[i][j] += av[i] * bv[j];
                }
                barrier(CLK_LOCAL_MEM_FENCE);
            }
#elif STAGED
            for (uint c0 = 0; c0 < CG; c0 += KC) {
                /* the weights' KC x MWG block and the shifted input's KC x NWG block, zero past CG */
                for (uint e = tid; e < KC * MWG; e += MDIM * NDIM) {
                    const uint kk = e / MWG;
                    const uint r = e - kk * MWG;
                    alm[kk * MWG + r] = c0 + kk < CG ? LOAD_W(MALINN_INDEX_A(m0 + r, k0 + c0 + kk, H, W), a) : 0.0f;
                }
                for (uint kk = ty; kk < KC; kk += MDIM)
                    #pragma unroll
                    for (uint j = 0; j < NWI; ++j)
                        blm[kk * NWG + tx + j * NDIM] = c0 + kk < CG && src[j] >= 0
                            ? b[MALINN_INDEX_B(c0 + kk, (uint)src[j], l, c)] : 0.0f;
                barrier(CLK_LOCAL_MEM_FENCE);
                #pragma unroll 4
                for (uint kk = 0; kk < KC; ++kk) {
                    float av[MWI], bv[NWI];
                    #pragma unroll
                    for (uint i = 0; i < MWI; ++i)
                        av[i] = alm[kk * MWG + ty + i * MDIM];
                    #pragma unroll
                    for (uint j = 0; j < NWI; ++j)
                        bv[j] = blm[kk * NWG + tx + j * NDIM];
                    #pragma unroll
                    for (uint i = 0; i < MWI; ++i)
                        #pragma unroll
                        for (uint j = 0; j < NWI; ++j)
                            acc[i][j] += av[i] * bv[j];
                }
                barrier(CLK_LOCAL_MEM_FENCE);
            }
#else
            for (uint cc = 0; cc < CG; ++cc) {
                float av[MWI];
                #pragma unroll
                for (uint i = 0; i < MWI; ++i)
                    av[i] = LOAD_W(MALINN_INDEX_A(row0 + i * MDIM, k0 + cc, H, W), a);
#if GROUPS == 1
                float bv[NWI];
                #pragma unroll
                for (uint j = 0; j < NWI; ++j)
                    bv[j] = src[j] >= 0 ? b[MALINN_INDEX_B(cc, (uint)src[j], l, c)] : 0.0f;
                #pragma unroll
                for (uint i = 0; i < MWI; ++i)
                    #pragma unroll
                    for (uint j = 0; j < NWI; ++j)
                        acc[i][j] += av[i] * bv[j];
#else
                #pragma unroll
                for (uint i = 0; i < MWI; ++i)
                    #pragma unroll
                    for (uint j = 0; j < NWI; ++j)
                        acc[i][j] += src[j] >= 0 ? av[i] * b[MALINN_INDEX_B(first[i] + cc, (uint)src[j], l, c)] : 0.0f;
#endif
            }
#endif
        }
    }

    #pragma unroll
    for (uint i = 0; i < MWI; ++i) {
        const uint row = row0 + i * MDIM;
        #pragma unroll
        for (uint j = 0; j < NWI; ++j) {
            const uint col = col0 + j * NDIM;
            r[MALINN_INDEX_R(row, col, h, w)] = EPILOGUE(acc[i][j], row, col);
        }
    }
}
