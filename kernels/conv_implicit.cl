/* Implicit-GEMM convolution, register-blocked after gemm_keras.cl: the im2row GEMM
 * R = W x patches(B) with the patch tiles gathered from the unreplicated input per K step, and the
 * fused epilogue of epilogue.clh (R = AFFINE(ACTIVATION(W x patches + bias)), R's padding written 0).
 *
 * Matrix views, all in Keras's memory order: the input B is CIN x (batch*IH*IW)
 * column-major (NHWC: a pixel's channels contiguous); the result R is COUT x (batch*OH*OW)
 * column-major (column = (image*OH + y)*OW + x); the weights A are COUT x (KH*KW*CG) column-major,
 * i.e. Keras's kernel[ky, kx, c, m] as it is stored (column (ky*KW + kx)*CG + c, a tap's channel's
 * COUT units contiguous). No patch matrix exists: a K step is KT channels of one kernel tap.
 *
 * A work-group computes TM output channels (units) x TN output pixels (samples). Per K step it
 * stages KT x TM weights (float4 loads along the units, coalesced) and the KT x TN patch tile: each
 * of the TN pixels' KT channels at the tap's shifted source pixel (float4 loads along the channels;
 * a pixel outside the image, a padding column or a channel past CIN reads 0, boundary masking),
 * each item's source pixels computed once before the loop. Each item then accumulates RN pixels x
 * RM units in registers, its units read as float4s from local memory. With PREFETCH the next K
 * step's loads are issued into registers before the current step is computed. With SLICES > 1 the
 * K steps are split over SLICES work-groups per tile, for layers whose output grid alone gives too
 * few work-groups (batch-1 layers of a few hundred pixels): each stores its partial sums in the
 * scratch buffer and counts itself in the tile's counter; the last adds the partial sums in slice
 * order (bit-identical whichever finishes last), applies the epilogue and resets the counter,
 * exactly as gemm_keras.cl does.
 *
 * Groups: with GROUPS > 1 a tile's K steps run over the input channels of the groups its TM output
 * channels belong to, and a weight whose channel lies outside its unit's group reads 0 (a
 * block-diagonal GEMM: the work of one group where a tile lies within one, MG a multiple of TM).
 *
 * Compile-time parameters (-D defines; the plan sets the geometry per layer, see window.clh):
 *   IH, IW, OH, OW, KH, KW, SH, SW, DH, DW, PT, PL  the window    CG, MG, GROUPS  channels per group
 *   TM, TN    units and pixels of R per work-group (the library aligns R's rows to TM, columns to TN)
 *   RM        units per item (a multiple of 4)      RN  pixels per item
 *   KT        channels per K step (a multiple of 4)
 *   PREFETCH  1: the next K step's tiles loaded into registers while the current one is computed
 *   DOUBLE    1 (with PREFETCH): two local buffers, a step's tiles stored into one while the other
 *             was read the step before, so one barrier per K step instead of two
 *   SLICES    work-groups along K per tile of R (1: none); scratch (uint): (h / TM) * (w / TN)
 *             counters, 0 before a launch and after it, then SLICES * h * w floats
 *   WEIGHT_BITS  the precision of A (weights.clh: 32 float, 16 half, 8 int8 with a scale per row,
 *             which the epilogue applies); the sums are float in every precision
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
#ifndef TM
#define TM 64
#endif
#ifndef TN
#define TN 64
#endif
#ifndef RM
#define RM 8
#endif
#ifndef RN
#define RN 4
#endif
#ifndef KT
#define KT 16
#endif
#ifndef PREFETCH
#define PREFETCH 1
#endif
#ifndef SLICES
#define SLICES 1
#endif
#ifndef DOUBLE
#define DOUBLE 0
#endif
#if DOUBLE && PREFETCH
#define BUFFERS 2
#else
#define BUFFERS 1
#endif

#define CIN (CG * GROUPS)                          /* channels a K step runs over */
#define TPU (TM / RM)                              /* unit slots of a work-group */
#define TPB (TN / RN)                              /* pixel slots */
#define THREADS (TPU * TPB)
#define VM (RM / 4)                                /* float4s of units per item */
#define WLOADS ((KT * TM / 4 + THREADS - 1) / THREADS)   /* float4s of weights per item and K step */
#define XLOADS ((TN * KT / 4 + THREADS - 1) / THREADS)   /* float4s of patches per item and K step */
#define PART_AT(j, i) ((tb * RN + (j)) * TM + 4 * (tu + ((i) / 4) * TPU) + (i) % 4)

/* float4 e of a K step's weight tile (KT channels of TM units): its channel and unit */
#define W_CH(e) ((e) / (TM / 4))
#define W_UNIT(e) (4 * ((e) - W_CH(e) * (TM / 4)))
/* float4 e of the patch tile (TN pixels of KT channels, KT / 4 vectors a pixel): pixel, channel */
#define X_PIX(e) ((e) / (KT / 4))
#define X_CH(e) (4 * ((e) - X_PIX(e) * (KT / 4)))

/* The weights' 4 units u..u+3 of channel ch (0 <= ch < CIN) of tap, 0 past CIN and, with groups,
 * for a unit outside the channel's group. */
inline float4 load_w(__global const WEIGHT *a, uint H, uint W, uint tap, uint ch, uint u)
{
#if GROUPS == 1
    if (ch >= CG)
        return (float4)(0.0f);
    return LOAD_W4(0, a + MALINN_INDEX_A(u, tap * CG + ch, H, W));
#else
    float t[4];
    const uint g = ch / CG;
    #pragma unroll
    for (uint q = 0; q < 4; ++q)
        t[q] = ch < CIN && (u + q) / MG == g ? LOAD_W(MALINN_INDEX_A(u + q, tap * CG + ch - g * CG, H, W), a) : 0.0f;
    return vload4(0, t);
#endif
}

/* channels ch..ch+3 of input pixel pix (or -1: 0), 0 past CIN */
inline float4 load_x(__global const float *b, uint l, uint c, int pix, uint ch)
{
    if (pix < 0)
        return (float4)(0.0f);
#if CG % 4 == 0   /* then a tile's first channel and CIN are multiples of 4 too */
    if (ch >= CIN)
        return (float4)(0.0f);
    return vload4(0, b + MALINN_INDEX_B(ch, (uint)pix, l, c));
#else
    float t[4];
    #pragma unroll
    for (uint q = 0; q < 4; ++q)
        t[q] = ch + q < CIN ? b[MALINN_INDEX_B(ch + q, (uint)pix, l, c)] : 0.0f;
    return vload4(0, t);
#endif
}

/* the source pixel of a pixel slot for a tap (ky, kx), or -1 where the tap falls outside the image */
inline int source_pixel(int base, int y0, int x0, uint ky, uint kx)
{
    const int iy = y0 + (int)(ky * DH);
    const int ix = x0 + (int)(kx * DW);
    return iy >= 0 && iy < IH && ix >= 0 && ix < IW ? base + iy * IW + ix : -1;
}

__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void conv_implicit(uint l, uint c, uint h, uint w, uint m, uint n, uint H, uint W,
                   float p0, float p1, float p2, float p3,
                   __global const WEIGHT *a,
                   __global const float *b,
                   __global float *r,
                   EPILOGUE_BUFFERS,
                   __global uint *scratch)
{
    const uint t = get_local_id(0);
    const uint tu = t - (t / TPU) * TPU;
    const uint tb = t / TPU;
    const uint n0 = get_group_id(0) * TN;
    const uint tile_m = get_group_id(1) / SLICES;
    const uint slice = get_group_id(1) - tile_m * SLICES;
    const uint m0 = tile_m * TM;
    /* this work-group's K steps: a contiguous share, the last slices shorter (or empty) */
#if GROUPS > 1
    /* the input channels of the groups this tile's output channels belong to */
    const uint g0 = m0 / MG;
    const uint ch0 = g0 * CG;
    const uint csteps = ((min((m0 + TM - 1) / MG, (uint)(GROUPS - 1)) - g0 + 1) * CG + KT - 1) / KT;
#else
    const uint ch0 = 0;
    const uint csteps = (CG + KT - 1) / KT;   /* K steps per kernel tap */
#endif
    const uint steps = KH * KW * csteps;
    const uint chunk = (steps + SLICES - 1) / SLICES;
    const uint sbegin = min(steps, slice * chunk);
    const uint send = min(steps, sbegin + chunk);

    /* the first pixel of the image, top-left tap of each pixel this item loads (once) */
    int base[XLOADS], y0[XLOADS], x0[XLOADS];
    #pragma unroll
    for (uint q = 0; q < XLOADS; ++q) {
        const uint col = n0 + X_PIX(t + q * THREADS);
        const uint3 pixel = window_pixel(col);
        base[q] = (int)(pixel.x * (IH * IW));
        y0[q] = col < n && t + q * THREADS < TN * KT / 4 ? (int)(pixel.y * SH) - PT : -(1 << 28);
        x0[q] = (int)(pixel.z * SW) - PL;
    }

    __local float wlm[BUFFERS * KT * TM];   /* wl[ch * TM + unit] */
    __local float xlm[BUFFERS * KT * TN];   /* xl[ch * TN + pixel] */

    float acc[RN][RM];
    #pragma unroll
    for (uint j = 0; j < RN; ++j)
        #pragma unroll
        for (uint i = 0; i < RM; ++i)
            acc[j][i] = 0.0f;

    float4 wr[WLOADS], xr[XLOADS];
#if PREFETCH
    if (sbegin < send) {
        const uint tap = sbegin / csteps;
        const uint c0 = ch0 + (sbegin - tap * csteps) * KT;
        const uint ky = tap / KW, kx = tap - (tap / KW) * KW;
        #pragma unroll
        for (uint q = 0; q < WLOADS; ++q)
            if (t + q * THREADS < KT * TM / 4)
                wr[q] = load_w(a, H, W, tap, c0 + W_CH(t + q * THREADS), m0 + W_UNIT(t + q * THREADS));
        #pragma unroll
        for (uint q = 0; q < XLOADS; ++q)
            xr[q] = load_x(b, l, c, source_pixel(base[q], y0[q], x0[q], ky, kx), c0 + X_CH(t + q * THREADS));
    }
#endif
    for (uint s = sbegin; s < send; ++s) {
#if BUFFERS == 2
        /* the buffer the step before last read: every item has passed the last step's barrier */
        __local float *wl = wlm + (s & 1) * (KT * TM);
        __local float *xl = xlm + (s & 1) * (KT * TN);
#else
        __local float *wl = wlm;
        __local float *xl = xlm;
#endif
#if !PREFETCH
        {
            const uint tap = s / csteps;
            const uint c0 = ch0 + (s - tap * csteps) * KT;
            const uint ky = tap / KW, kx = tap - (tap / KW) * KW;
            #pragma unroll
            for (uint q = 0; q < WLOADS; ++q)
                if (t + q * THREADS < KT * TM / 4)
                    wr[q] = load_w(a, H, W, tap, c0 + W_CH(t + q * THREADS), m0 + W_UNIT(t + q * THREADS));
            #pragma unroll
            for (uint q = 0; q < XLOADS; ++q)
                xr[q] = load_x(b, l, c, source_pixel(base[q], y0[q], x0[q], ky, kx), c0 + X_CH(t + q * THREADS));
        }
#endif
        #pragma unroll
        for (uint q = 0; q < WLOADS; ++q) {
            const uint e = t + q * THREADS;
            if (e < KT * TM / 4)
                vstore4(wr[q], 0, wl + W_CH(e) * TM + W_UNIT(e));
        }
        #pragma unroll
        for (uint q = 0; q < XLOADS; ++q) {
            const uint e = t + q * THREADS;
            if (e < TN * KT / 4) {
                const uint p = X_PIX(e), k = X_CH(e);
                xl[(k + 0) * TN + p] = xr[q].s0;
                xl[(k + 1) * TN + p] = xr[q].s1;
                xl[(k + 2) * TN + p] = xr[q].s2;
                xl[(k + 3) * TN + p] = xr[q].s3;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#if PREFETCH
        if (s + 1 < send) {
            const uint tap = (s + 1) / csteps;
            const uint c0 = ch0 + (s + 1 - tap * csteps) * KT;
            const uint ky = tap / KW, kx = tap - (tap / KW) * KW;
            #pragma unroll
            for (uint q = 0; q < WLOADS; ++q)
                if (t + q * THREADS < KT * TM / 4)
                    wr[q] = load_w(a, H, W, tap, c0 + W_CH(t + q * THREADS), m0 + W_UNIT(t + q * THREADS));
            #pragma unroll
            for (uint q = 0; q < XLOADS; ++q)
                xr[q] = load_x(b, l, c, source_pixel(base[q], y0[q], x0[q], ky, kx), c0 + X_CH(t + q * THREADS));
        }
#endif
        #pragma unroll
        for (uint kk = 0; kk < KT; ++kk) {
            float wv[RM], xv[RN];
            #pragma unroll
            for (uint v = 0; v < VM; ++v) {
                const float4 u = vload4(0, wl + kk * TM + 4 * (tu + v * TPU));
                wv[4 * v + 0] = u.s0;
                wv[4 * v + 1] = u.s1;
                wv[4 * v + 2] = u.s2;
                wv[4 * v + 3] = u.s3;
            }
#if RN % 4 == 0
            #pragma unroll
            for (uint v = 0; v < RN / 4; ++v) {   /* an item's pixels are contiguous: float4 reads */
                const float4 u = vload4(0, xl + kk * TN + tb * RN + 4 * v);
                xv[4 * v + 0] = u.s0;
                xv[4 * v + 1] = u.s1;
                xv[4 * v + 2] = u.s2;
                xv[4 * v + 3] = u.s3;
            }
#else
            #pragma unroll
            for (uint j = 0; j < RN; ++j)
                xv[j] = xl[kk * TN + tb * RN + j];
#endif
            #pragma unroll
            for (uint j = 0; j < RN; ++j)
                #pragma unroll
                for (uint i = 0; i < RM; ++i)
                    acc[j][i] += xv[j] * wv[i];
        }
#if BUFFERS == 1
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
    }

#if SLICES > 1
    /* this slice's partial sums into the scratch buffer; the tile's last work-group adds them */
    __local uint last;
    const uint g = tile_m * (w / TN) + get_group_id(0);
    volatile __global uint *counter = scratch + g;
    volatile __global float *partial = (volatile __global float *)(scratch + (h / TM) * (w / TN))
                                       + (size_t)g * SLICES * TM * TN;
    #pragma unroll
    for (uint j = 0; j < RN; ++j)
        #pragma unroll
        for (uint i = 0; i < RM; ++i)
            atomic_xchg(partial + slice * TM * TN + PART_AT(j, i), acc[j][i]);
    DEVICE_FENCE();
    barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
    if (t == 0)
        last = atomic_inc(counter) == SLICES - 1;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (!last)
        return;
    DEVICE_FENCE();
    float sum[RN][RM];
    #pragma unroll
    for (uint j = 0; j < RN; ++j)
        #pragma unroll
        for (uint i = 0; i < RM; ++i)
            sum[j][i] = atomic_xchg(partial + PART_AT(j, i), 0.0f);
    for (uint q = 1; q < SLICES; ++q)          /* in slice order: the same sums whoever is last */
        #pragma unroll
        for (uint j = 0; j < RN; ++j)
            #pragma unroll
            for (uint i = 0; i < RM; ++i)
                sum[j][i] += atomic_xchg(partial + q * TM * TN + PART_AT(j, i), 0.0f);
    if (t == 0)
        atomic_xchg(counter, 0u);
#else
#define sum acc
#endif

    #pragma unroll
    for (uint j = 0; j < RN; ++j) {
        const uint col = n0 + tb * RN + j;
        #pragma unroll
        for (uint v = 0; v < VM; ++v) {
            const uint row = m0 + 4 * (tu + v * TPU);
            float4 o;
            o.s0 = EPILOGUE(sum[j][4 * v + 0], row + 0, col);
            o.s1 = EPILOGUE(sum[j][4 * v + 1], row + 1, col);
            o.s2 = EPILOGUE(sum[j][4 * v + 2], row + 2, col);
            o.s3 = EPILOGUE(sum[j][4 * v + 3], row + 3, col);
            vstore4(o, 0, r + MALINN_INDEX_R(row, col, h, w));
        }
    }
}
