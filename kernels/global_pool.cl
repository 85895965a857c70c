/* Global pooling (Keras GlobalAveragePooling1D/2D/3D, GlobalMaxPooling1D/2D/3D, the squeeze of a
 * squeeze-and-excitation block): R[ch, image] = mean or max of A[ch, image * IH * IW + p] over the
 * image's pixels p, each (block of LC channels, image) reduced by a work-group (or SLICES of them).
 *
 * Matrix views: A is C x (batch*IH*IW), column = image * IH * IW + pixel; R is C x batch. A and R
 * in any layout (the runtime prepends MALINN_INDEX_A and MALINN_INDEX_R); the padding of R is
 * written as 0. R's rows are padded to LC (library.json: "rowAlign": "LC").
 *
 * Work: a work-group of LC x LP items (reqd_work_group_size) holds LC consecutive channels (local
 * id 0, the fastest) of one image and LP lanes; lane l of slice s reads the pixels l, l + LP, ...
 * of the slice's run [s * chunk, (s + 1) * chunk), chunk = ceil(IH * IW / SLICES). In Keras's
 * memory order (column-major: a pixel's channels adjacent) the LC items of a lane read LC
 * consecutive floats (one 128-byte line for LC 32): every load is coalesced, where kernels/pool.cl
 * runs one item per (channel, image) over the whole image (32 items for a 112 x 112 x 32 image at
 * batch 1). Each item keeps UNROLL independent partial results (UNROLL loads in flight), added in
 * a fixed order, then the LP lanes are added in a fixed tree in local memory (LP a power of 2).
 * SLICES 1: lane 0 writes R. SLICES > 1 (large images at small batches: more work-groups than
 * images): the work-group stores its LC partial results in the scratch buffer and counts itself in
 * its tile's counter (atomic_inc); the work-group that counts last adds the SLICES partial results
 * in slice order 0, 1, ... (the same order whichever finishes last: bit-identical results on every
 * run), writes R and sets the counter back to 0 (gemv_split.cl's pattern; partial results written
 * and read with atomic_xchg, so no data race for the memory model or Oclgrind, and left as 0).
 *
 * On a GPU small images (7 x 7 at a network's end) are never worse than under pool.cl by design:
 * the same coalesced reads along the channels, LP times the items (each reading IH * IW / LP
 * pixels instead of all of them: 1 / LP of the dependent steps at batch 1), and one fixed tree of
 * log2(LP) local steps where pool.cl has none; items of channels that a layer lacks (R's padding
 * up to LC) load nothing. A CPU runs the lanes one after another and pays for the barriers (on
 * PoCL pool.cl was faster at 7 x 7), so the library keeps pool.cl there.
 *
 * The mean is the sum divided by IH * IW (as pool.cl: a summation order other than numpy's, within
 * float32 rounding of a sum). The maximum: NAN_PROPAGATES 0 as TensorFlow's max_pool (NaN skipped,
 * started from -FLT_MAX), 1 as its reduce_max (GlobalMaxPooling: a NaN gives NaN, started from
 * -inf); both are exact in any order.
 *
 * scratch (uint, SLICES > 1): tiles = (h / LC) * w counters, all 0 before a launch (the runtime
 * clears the buffer once; every launch leaves it 0), then SLICES * h * w floats of partial results,
 * tile g's slice s at tiles + (g * SLICES + s) * LC ("scratch_bytes" in library.json).
 *
 * The global range is h x (w * LP * SLICES) (library.json: "ndrange": "hw", "split").
 *
 * Compile-time parameters (-D defines):
 *   MAXPOOL 1 the maximum, 0 the mean; NAN_PROPAGATES as above
 *   LC      channels per work-group (R's rows are padded to it)
 *   LP      lanes per work-group along the pixels, a power of 2
 *   SLICES  work-groups per (block of channels, image) along the pixels (1: no scratch)
 *   UNROLL  independent partial results per item
 * Arguments after the buffers (the pool entry's window, "argdefines"): IH, IW (an image's height
 * and width), then OH, OW, KH, KW, SH, SW, PT, PL, which the library's constraints hold to a global
 * window (KH = IH, KW = IW, OH = OW = 1, no padding) and the kernel does not read: as arguments,
 * one program serves every image size. Scalars: m, n logical rows and columns of R, H, W padded
 * rows and columns of A, h, w of R. OpenCL C 1.2.
 */

#ifndef MAXPOOL
#define MAXPOOL 0
#endif
#ifndef NAN_PROPAGATES
#define NAN_PROPAGATES 0
#endif
#ifndef LC
#define LC 32
#endif
#ifndef LP
#define LP 8
#endif
#ifndef SLICES
#define SLICES 1
#endif
#ifndef UNROLL
#define UNROLL 4
#endif

#if MAXPOOL
#if NAN_PROPAGATES
#define START (-INFINITY)
#define TAKE(acc, x) (isnan(acc) || isnan(x) ? (acc) + (x) : fmax((acc), (x)))
#else
#define START (-FLT_MAX)
#define TAKE(acc, x) fmax((acc), (x))
#endif
#else
#define START 0.0f
#define TAKE(acc, x) ((acc) + (x))
#endif

#if SLICES > 1                  /* DEVICE_FENCE: device_fence.clh, which the entry includes */
#define SCRATCH_PARAM , __global uint *scratch
#else
#define SCRATCH_PARAM
#endif

__kernel __attribute__((reqd_work_group_size(LC, LP, 1)))
void global_pool(uint m, uint n, uint H, uint W, uint h, uint w,
                 __global const float *a,
                 __global float *r
                 SCRATCH_PARAM,
                 const int IH, const int IW, const int OH, const int OW, const int KH, const int KW,
                 const int SH, const int SW, const int PT, const int PL)
{
    __local float part[LP * LC];
    const uint c = get_local_id(0), lane = get_local_id(1);
    const uint row = get_global_id(0);
    const uint image = get_group_id(1) / SLICES;
    const uint pixels = (uint)IH * (uint)IW;
    const uint live = row < m && image < n;
#if SLICES > 1
    const uint slice = get_group_id(1) - image * SLICES;
    const uint chunk = (pixels + SLICES - 1) / SLICES;
    const uint p0 = min(slice * chunk, pixels), p1 = min(p0 + chunk, pixels);
#else
    const uint p0 = 0, p1 = pixels;
#endif
    const uint base = image * pixels;

    float acc[UNROLL];
    #pragma unroll
    for (uint u = 0; u < UNROLL; ++u)
        acc[u] = START;
    if (live) {
        uint p = p0 + lane;
        for (; p + (UNROLL - 1) * LP < p1; p += UNROLL * LP) {
            float x[UNROLL];
            #pragma unroll
            for (uint u = 0; u < UNROLL; ++u)
                x[u] = a[MALINN_INDEX_A(row, base + p + u * LP, H, W)];
            #pragma unroll
            for (uint u = 0; u < UNROLL; ++u)
                acc[u] = TAKE(acc[u], x[u]);
        }
        #pragma unroll
        for (uint u = 0; u + 1 < UNROLL; ++u)   /* the last pixels, fewer than UNROLL a lane */
            if (p + u * LP < p1)
                acc[u] = TAKE(acc[u], a[MALINN_INDEX_A(row, base + p + u * LP, H, W)]);
    }
    float v = acc[0];
    #pragma unroll
    for (uint u = 1; u < UNROLL; ++u)
        v = TAKE(v, acc[u]);

    /* the lanes in a fixed tree: lane l += lane l + s, for s = LP / 2, ..., 1 */
    part[lane * LC + c] = v;
    for (uint s = LP / 2; s > 0; s >>= 1) {
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lane < s)
            part[lane * LC + c] = TAKE(part[lane * LC + c], part[(lane + s) * LC + c]);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    v = part[c];

#if SLICES == 1
    if (lane == 0) {
#if MAXPOOL
        r[MALINN_INDEX_R(row, image, h, w)] = live ? v : 0.0f;
#else
        r[MALINN_INDEX_R(row, image, h, w)] = live ? v / (float)pixels : 0.0f;
#endif
    }
#else
    __local uint last;
    const uint tiles = (h / LC) * w;
    const uint g = image * (h / LC) + get_group_id(0);
    volatile __global uint *counter = scratch + g;
    volatile __global float *partial = (volatile __global float *)(scratch + tiles) + (size_t)g * SLICES * LC;
    if (lane == 0)
        atomic_xchg(partial + slice * LC + c, v);
    DEVICE_FENCE();
    barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
    if (c == 0 && lane == 0)
        last = atomic_inc(counter) == SLICES - 1;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (last) {
        DEVICE_FENCE();
        if (lane == 0) {
            float total = START;
            for (uint s = 0; s < SLICES; ++s) {
                const float x = atomic_xchg(partial + s * LC + c, 0.0f);   /* once: TAKE reads x twice */
                total = TAKE(total, x);
            }
#if MAXPOOL
            r[MALINN_INDEX_R(row, image, h, w)] = live ? total : 0.0f;
#else
            r[MALINN_INDEX_R(row, image, h, w)] = live ? total / (float)pixels : 0.0f;
#endif
        }
        if (c == 0 && lane == 0)
            atomic_xchg(counter, 0u);
    }
#endif
}
