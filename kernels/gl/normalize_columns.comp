/* Normalizes each column of R's matrix view in place, one work-group per column, R in any layout:
 * the GLSL ES 3.10 twin of normalize_columns.cl (read it for the design), what
 * normalize_axes.comp computes for groups that are a whole column (the last axis), with the
 * group's WG invocations sharing its elements and summing them as a tree in shared memory.
 *   MODE (default 0): 0 softmax, 1 softmax as exp(x - logsumexp x), 2 layer normalization
 *   ((x - first) - (mean - first), first the column's first element), 3 RMS scaling, 4 unit (L2)
 *   normalization (p0 the floor of the sum of squares, else the epsilon). CENTER / SCALE
 *   (default 0): beta / gamma in shift / scale. GROUP (default 1) is m (the range is m / GROUP *
 *   WG by n). WG (default 64, a power of two) invocations per column, WG floats of shared memory.
 *   The maximum skips NaN as OpenCL's fmax does.
 * The padding is never touched. */

/* NVIDIA's GLSL compiler unrolls every constant-bound loop under the preamble's #pragma
 * optionNV(unroll all); these loops run over a column of up to thousands of elements */
#pragma optionNV(unroll none)

#ifndef GROUP
#define GROUP 1
#endif
#ifndef MODE
#define MODE 0
#endif
#ifndef CENTER
#define CENTER 0
#endif
#ifndef SCALE
#define SCALE 0
#endif
#ifndef WG
#define WG 64
#endif

MALINN_ARGS(uint m; uint n; uint h; uint w; float p0;)
layout(std430, binding = 0) buffer BufR { float r[]; };
layout(std430, binding = 1) readonly buffer BufScale { float scale[]; };
layout(std430, binding = 2) readonly buffer BufShift { float shift[]; };

shared float red[WG];

#define AT(g) r[MALINN_INDEX_R((g), col, h, w)]

/* OpenCL's fmax: a NaN operand is skipped */
float malinn_fmax(float x, float y) { return isnan(y) ? x : (isnan(x) ? y : max(x, y)); }

/* MALINN_REDUCE(result, v, maximum): the sum (maximum false) or the largest (true) of every
 * invocation's v, as a tree in red; a macro, so that its barriers stand in main() */
#define MALINN_REDUCE(result, v, maximum)                                                    \
    red[lid] = (v);                                                                          \
    barrier();                                                                               \
    for (uint span = uint(WG) / 2u; span > 0u; span >>= 1) {                                 \
        if (lid < span)                                                                      \
            red[lid] = (maximum) ? malinn_fmax(red[lid], red[lid + span]) : red[lid] + red[lid + span]; \
        barrier();                                                                           \
    }                                                                                        \
    result = red[0];                                                                         \
    barrier();   /* every invocation has read it before red is written again */

void main() {
    MALINN_GROUP_GUARD   /* a folded dispatch's extra work-groups (GLDevice.bind) */
    uint lid = gl_LocalInvocationID.x;
    uint col = MALINN_GROUP_Y;
#if MODE == 0 || MODE == 1
    float top = -MALINN_INFINITY;
    for (uint g = lid; g < m; g += uint(WG))
        top = malinn_fmax(top, AT(g));
    MALINN_REDUCE(top, top, true)
    float part = 0.0;
    for (uint g = lid; g < m; g += uint(WG))
        part += exp(AT(g) - top);
    float total;
    MALINN_REDUCE(total, part, false)
#if MODE == 0
    for (uint g = lid; g < m; g += uint(WG))
        AT(g) = exp(AT(g) - top) / total;
#else
    float lse = top + log(total);
    for (uint g = lid; g < m; g += uint(WG))
        AT(g) = exp(AT(g) - lse);
#endif
#elif MODE == 2 || MODE == 3
    float first = AT(0u);
    float part = 0.0;
    for (uint g = lid; g < m; g += uint(WG))
        part += AT(g) - first;
    float offset;
    MALINN_REDUCE(offset, part, false)
    offset = offset / float(m);   /* mean - first */
    part = 0.0;
    for (uint g = lid; g < m; g += uint(WG)) {
        float d = (AT(g) - first) - offset;
        part += d * d;
    }
    float squares;
    MALINN_REDUCE(squares, part, false)
    float inv0 = inversesqrt(squares / float(m) + p0);
    memoryBarrierBuffer();
    barrier();   /* every invocation has read the first element before invocation 0 rewrites it */
    for (uint g = lid; g < m; g += uint(WG)) {
#if SCALE
        float inv = inv0 * scale[g];
#else
        float inv = inv0;
#endif
#if MODE == 2
#if CENTER
        AT(g) = ((AT(g) - first) - offset) * inv + shift[g];
#else
        AT(g) = ((AT(g) - first) - offset) * inv;
#endif
#else
        AT(g) = AT(g) * inv;
#endif
    }
#else
    float part = 0.0;
    for (uint g = lid; g < m; g += uint(WG))
        part += AT(g) * AT(g);
    float squares;
    MALINN_REDUCE(squares, part, false)
    float inv = inversesqrt(isnan(squares) ? squares : max(squares, p0));   /* a NaN sum stays NaN */
    for (uint g = lid; g < m; g += uint(WG))
        AT(g) = AT(g) * inv;
#endif
}
