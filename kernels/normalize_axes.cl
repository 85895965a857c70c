/* Normalizes groups of elements of a tensor along some of its axes, in place, for R in any layout.
 *
 * The tensor (batch, d1, ..., dk) is held as its matrix view: m = dk rows, one column per
 * position of the other axes, so its row-major flat index is f = col * m + row. The axes being
 * normalized are one contiguous run (the plan permutes others into one): the tensor is then
 * (outer, GROUP, INNER) in flat order, and each group is the GROUP elements
 * f = (o * GROUP + g) * INNER + i of one (o, i). One work item per group; the plan sizes the
 * range (m / SR) x (n / SC) to the number of groups (SR, SC: defines), and item (x, y) takes
 * group q = y * (m / SR) + x.
 *
 * MODE picks what each group becomes:
 *   0  softmax: exp(x - max) / sum exp(x - max)                 (Keras's Softmax on one axis)
 *   1  softmax as Keras computes it over several axes: exp(x - logsumexp(x))
 *   2  layer normalization: inv = rsqrt(var + p0) [* scale[g]], y = (x - mean) * inv [+ shift[g]]
 *      (gamma in scale, beta in shift; CENTER / SCALE: 1 where they exist); var is the mean
 *      squared deviation, x - mean is (x - first) - (mean - first) (first: the group's first
 *      element). x - mean first, as tf_keras's fused kernel: Keras 3 writes x * inv + (beta -
 *      mean * inv), whose two products cancel for a group far from zero (a constant 1e10 gave 0
 *      for beta, and an fma contracting them -0.054 for 65504 x 16)
 *   3  RMS scaling (LayerNormalization(rms_scaling=True)): x * rsqrt(var + p0) [* scale[g]]
 *   4  unit (L2) normalization: x * rsqrt(max(sum x^2, p0))
 * p0 is the epsilon (MODE 2, 3) or the floor of the sum of squares (MODE 4). The padding is
 * never touched. The runtime prepends MALINN_INDEX_R(row, col, prows, pcols); h, w are R's padded
 * rows and columns. OpenCL C 1.2.
 */

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

/* The index in R of flat element f (row f % m, column f / m; the remainder spelt out: Oclgrind
 * cannot run the LLVM freeze that a / and % pair becomes). */
size_t malinn_flat_index(size_t f, uint m, uint h, uint w)
{
    const size_t col = f / m;
    const uint row = (uint)(f - col * m);
    return MALINN_INDEX_R(row, (uint)col, h, w);
}

#define AT(g) r[malinn_flat_index(base + (size_t)(g) * INNER, m, h, w)]

/* BLOCKED_SUM(total, g, n, term): total = the sum of term over g = 0 .. n - 1, in blocks of 64
 * terms, each block's sum added to the total: its rounding grows with 64 + n / 64 terms, not n
 * (summed one by one, a softmax over 8192 features was 1.9e-5 off, a LayerNormalization over 4096
 * 4.4e-5) */
#define BLOCKED_SUM(total, g, n, term) do {                  \
        float malinn_part = 0.0f;                            \
        total = 0.0f;                                        \
        for (uint g = 0; g < (n); ++g) {                     \
            malinn_part += (term);                           \
            if ((g & 63u) == 63u) {                          \
                total += malinn_part;                        \
                malinn_part = 0.0f;                          \
            }                                                \
        }                                                    \
        total += malinn_part;                                \
    } while (0)

__kernel void normalize_axes(uint m, uint n, uint h, uint w, float p0,
                             __global float *r,
                             __global const float *scale,
                             __global const float *shift)
{
    const size_t q = (size_t)get_global_id(1) * get_global_size(0) + get_global_id(0);
    const size_t o = q / INNER;
    const size_t base = o * GROUP * INNER + (q - o * INNER);
#if MODE == 0 || MODE == 1
    float top = -INFINITY;
    for (uint g = 0; g < GROUP; ++g)
        top = fmax(top, AT(g));
    float total;
    BLOCKED_SUM(total, g, GROUP, exp(AT(g) - top));
#if MODE == 0
    for (uint g = 0; g < GROUP; ++g)
        AT(g) = exp(AT(g) - top) / total;
#else
    const float lse = top + log(total);
    for (uint g = 0; g < GROUP; ++g)
        AT(g) = exp(AT(g) - lse);
#endif
#elif MODE == 2 || MODE == 3
    /* x - mean as (x - first) - (mean - first), first the group's first element: a constant
     * group's deviations are 0 exactly (its values summed as they were, 16 x 1e10 came out one
     * rounding step off the mean, and that step squared, 1024^2, was the variance: every output
     * -1), an offset group's (1e4 + noise) are its noise to float32's precision where a float32
     * mean would round by 5e-4, and values near the largest float do not overflow the sum
     * (13 x 3e38). The variance is the mean squared deviation (two passes). */
    const float first = AT(0);
    float sum, squares;
    BLOCKED_SUM(sum, g, GROUP, AT(g) - first);
    const float offset = sum / GROUP;   /* mean - first */
    BLOCKED_SUM(squares, g, GROUP, ((AT(g) - first) - offset) * ((AT(g) - first) - offset));
    const float inv0 = rsqrt(squares / GROUP + p0);
    for (uint g = 0; g < GROUP; ++g) {
#if SCALE
        const float inv = inv0 * scale[g];
#else
        const float inv = inv0;
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
    BLOCKED_SUM(squares, g, GROUP, AT(g) * AT(g));
    const float inv = rsqrt(squares < p0 ? p0 : squares);   /* a NaN sum stays NaN (fmax would drop it) */
    for (uint g = 0; g < GROUP; ++g)
        AT(g) = AT(g) * inv;
#endif
}
