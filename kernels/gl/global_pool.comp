/* Global pooling (GlobalAverage/GlobalMaxPooling1D/2D/3D), any layouts: the GLSL ES 3.10 twin of
 * global_pool.cl, from the same library entries (global_pool, global_pool_sliced) and defines; read
 * global_pool.cl for the design. R[ch, image] = mean or max of A[ch, image * IH * IW + p].
 *
 *   work-group  LC x LP invocations: LC consecutive channels (x) of one image by LP lanes (y)
 *   lane l of slice s reads pixels l, l + LP, ... of [s * chunk, (s + 1) * chunk), chunk =
 *               ceil(IH * IW / SLICES), UNROLL loads before the first is used, UNROLL partial
 *               results added in a fixed order, then the lanes in a fixed tree in shared memory
 *   SLICES == 1: lane 0 writes R (its padding as 0);
 *   SLICES > 1: the work-group stores its LC partial results in the scratch buffer (binding 2, uint:
 *               the tiles' counters, then the partial results as float bits) with atomicExchange,
 *               counts itself in its tile's counter (atomicAdd) after memoryBarrierBuffer; the one
 *               that counts last reads them back with atomicExchange (leaving 0), combines them in
 *               slice order (bit-identical whichever finishes last), writes R and sets the counter
 *               back to 0.
 * MAXPOOL 1 the maximum, 0 the mean; NAN_PROPAGATES as pool.comp (0: NaN skipped, from -FLT_MAX;
 * 1: a NaN gives NaN, from -inf). IH, IW are defines here (the OpenCL source's arguments), as are
 * OH, OW, KH, KW, SH, SW, PT, PL, which the entries' constraints hold to a global window.
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
#ifndef IH
#define IH 1
#endif
#ifndef IW
#define IW 1
#endif

#if MAXPOOL && NAN_PROPAGATES
#define START (-MALINN_INFINITY)
#define TAKE(acc, x) ((isnan(acc) || isnan(x)) ? (acc) + (x) : max((acc), (x)))
#elif MAXPOOL
#define START (-3.40282347e38)   /* -FLT_MAX */
#define TAKE(acc, x) (isnan(x) ? (acc) : max((acc), (x)))
#else
#define START 0.0
#define TAKE(acc, x) ((acc) + (x))
#endif

MALINN_ARGS(uint m; uint n; uint H; uint W; uint h; uint w;)
layout(std430, binding = 0) readonly buffer BufA { float a[]; };
layout(std430, binding = 1) writeonly buffer BufR { float r[]; };
shared float part[LP * LC];
#if SLICES > 1
layout(std430, binding = 2) coherent buffer BufScratch { uint scratch[]; };
shared uint last;
#endif

void main() {
    MALINN_GROUP_GUARD   /* a folded dispatch's extra work-groups (GLDevice.bind) */
    uint c = gl_LocalInvocationID.x;
    uint lane = gl_LocalInvocationID.y;
    uint row = MALINN_GROUP_X * uint(LC) + c;
    uint image = MALINN_GROUP_Y / uint(SLICES);
    uint pixels = uint(IH) * uint(IW);
    bool live = row < m && image < n;
#if SLICES > 1
    uint slice = MALINN_GROUP_Y - image * uint(SLICES);
    uint chunk = (pixels + uint(SLICES) - 1u) / uint(SLICES);
    uint p0 = min(slice * chunk, pixels), p1 = min(p0 + chunk, pixels);
#else
    uint p0 = 0u, p1 = pixels;
#endif
    uint base = image * pixels;

    float acc[UNROLL];
    for (int u = 0; u < UNROLL; ++u)
        acc[u] = START;
    uint p = live ? p0 + lane : p1;
    for (; p + uint((UNROLL - 1) * LP) < p1; p += uint(UNROLL * LP)) {
        float x[UNROLL];
        for (int u = 0; u < UNROLL; ++u)
            x[u] = a[MALINN_INDEX_A(row, base + p + uint(u * LP), H, W)];
        for (int u = 0; u < UNROLL; ++u)
            acc[u] = TAKE(acc[u], x[u]);
    }
    for (int u = 0; u + 1 < UNROLL; ++u)   /* the last pixels, fewer than UNROLL a lane */
        if (p + uint(u * LP) < p1) {
            float x = a[MALINN_INDEX_A(row, base + p + uint(u * LP), H, W)];
            acc[u] = TAKE(acc[u], x);
        }
    float v = acc[0];
    for (int u = 1; u < UNROLL; ++u)
        v = TAKE(v, acc[u]);

    /* the lanes in a fixed tree: lane l += lane l + s, for s = LP / 2, ..., 1 */
    part[lane * uint(LC) + c] = v;
    for (uint s = uint(LP) / 2u; s > 0u; s >>= 1) {
        memoryBarrierShared();
        barrier();
        if (lane < s) {
            float other = part[(lane + s) * uint(LC) + c];
            part[lane * uint(LC) + c] = TAKE(part[lane * uint(LC) + c], other);
        }
    }
    memoryBarrierShared();
    barrier();
    v = part[c];

#if SLICES == 1
    if (lane == 0u)
#if MAXPOOL
        r[MALINN_INDEX_R(row, image, h, w)] = live ? v : 0.0;
#else
        r[MALINN_INDEX_R(row, image, h, w)] = live ? v / float(pixels) : 0.0;
#endif
#else
    uint tiles = (h / uint(LC)) * w;
    uint g = image * (h / uint(LC)) + MALINN_GROUP_X;
    uint partial = tiles + g * uint(SLICES * LC);
    if (lane == 0u)
        atomicExchange(scratch[partial + slice * uint(LC) + c], floatBitsToUint(v));
    memoryBarrierBuffer();
    barrier();
    if (c == 0u && lane == 0u)
        last = atomicAdd(scratch[g], 1u) == uint(SLICES - 1) ? 1u : 0u;
    memoryBarrierShared();
    barrier();
    if (last != 0u) {
        memoryBarrierBuffer();
        if (lane == 0u) {
            float total = START;
            for (uint s = 0u; s < uint(SLICES); ++s) {
                float x = uintBitsToFloat(atomicExchange(scratch[partial + s * uint(LC) + c], 0u));
                total = TAKE(total, x);
            }
#if MAXPOOL
            r[MALINN_INDEX_R(row, image, h, w)] = live ? total : 0.0;
#else
            r[MALINN_INDEX_R(row, image, h, w)] = live ? total / float(pixels) : 0.0;
#endif
        }
        if (c == 0u && lane == 0u)
            atomicExchange(scratch[g], 0u);
    }
#endif
}
