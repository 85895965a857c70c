/* Normalizes groups of elements along a run of axes, in place, R in any layout: the GLSL ES 3.10
 * twin of normalize_axes.cl (read it for the design). The tensor is (outer, GROUP, INNER) in flat
 * order (f = col * m + row); invocation (x, y) of the (m / SR) x (n / SC) range takes group
 * q = y * (m / SR) + x, the elements f = (o * GROUP + g) * INNER + i of one (o, i).
 *   MODE 0 softmax; 1 softmax as exp(x - logsumexp(x)); 2 layer normalization (CENTER / SCALE:
 *   beta / gamma in shift / scale); 3 RMS scaling; 4 L2 normalization (p0 the floor of the sum
 *   of squares, else the epsilon). The maximum skips NaN as OpenCL's fmax does.
 * The padding is never touched. */

/* NVIDIA's GLSL compiler unrolls every constant-bound loop under the preamble's #pragma
 * optionNV(unroll all): the loops over GROUP (a whole sample's elements, up to thousands) unrolled with a layout's
 * index arithmetic did not finish building in 50 s on an H200 (driver 580), so they stay loops
 * (other compilers ignore the pragma). */
#pragma optionNV(unroll none)

#ifndef GROUP
#define GROUP 1
#endif
#ifndef INNER
#define INNER 1
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

MALINN_ARGS(uint m; uint n; uint h; uint w; float p0;)
layout(std430, binding = 0) buffer BufR { float r[]; };
layout(std430, binding = 1) readonly buffer BufScale { float scale[]; };
layout(std430, binding = 2) readonly buffer BufShift { float shift[]; };

#define AT(g) r[MALINN_INDEX_R((base + uint(g) * uint(INNER)) % m, (base + uint(g) * uint(INNER)) / m, h, w)]

/* BLOCKED_SUM(total, g, n, term): total = the sum of term over g = 0 .. n - 1, in blocks of 64
 * terms, each block's sum added to the total: its rounding grows with 64 + n / 64 terms, not n
 * (summed one by one, a softmax over 8192 features was 1.9e-5 off); as normalize_axes.cl's */
#define BLOCKED_SUM(total, g, n, term) do {                  \
        float malinn_part = 0.0;                            \
        total = 0.0;                                        \
        for (uint g = 0u; g < (n); ++g) {                     \
            malinn_part += (term);                           \
            if ((g & 63u) == 63u) {                          \
                total += malinn_part;                        \
                malinn_part = 0.0;                          \
            }                                                \
        }                                                    \
        total += malinn_part;                                \
    } while (false)

void main() {
    MALINN_GUARD
    uint q = MALINN_GLOBAL_Y * malinn_range0 + MALINN_GLOBAL_X;
    uint o = q / uint(INNER);
    uint base = o * uint(GROUP) * uint(INNER) + q % uint(INNER);
#if MODE == 0 || MODE == 1
    float top = -MALINN_INFINITY;
    for (uint g = 0u; g < uint(GROUP); ++g) {
        float x = AT(g);
        top = isnan(x) ? top : max(top, x);
    }
    float total;
    BLOCKED_SUM(total, g, uint(GROUP), exp(AT(g) - top));
#if MODE == 0
    for (uint g = 0u; g < uint(GROUP); ++g)
        AT(g) = exp(AT(g) - top) / total;
#else
    float lse = top + log(total);
    for (uint g = 0u; g < uint(GROUP); ++g)
        AT(g) = exp(AT(g) - lse);
#endif
#elif MODE == 2 || MODE == 3
    /* x - mean as (x - first) - (mean - first), as normalize_axes.cl: 0 exactly for a constant
     * group, an offset group's noise to float32's precision, no overflow near the largest float */
    float first = AT(0u);
    float sum, squares;
    BLOCKED_SUM(sum, g, uint(GROUP), AT(g) - first);
    float offset = sum / float(GROUP);   /* mean - first */
    BLOCKED_SUM(squares, g, uint(GROUP), ((AT(g) - first) - offset) * ((AT(g) - first) - offset));
    float inv0 = inversesqrt(squares / float(GROUP) + p0);
    for (uint g = 0u; g < uint(GROUP); ++g) {
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
    float squares;
    BLOCKED_SUM(squares, g, uint(GROUP), AT(g) * AT(g));
    float inv = inversesqrt(isnan(squares) ? squares : max(squares, p0));   /* a NaN sum stays NaN */
    for (uint g = 0u; g < uint(GROUP); ++g)
        AT(g) = AT(g) * inv;
#endif
}
