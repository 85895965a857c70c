/* Normalizes groups of elements along a run of axes, in place, R in any layout: the gles3 (vertex
 * shader, transform feedback) twin of normalize_axes.cl (read it for the design). The tensor is
 * (outer, GROUP, INNER) in flat order (f = col * m + row). One vertex per float of R's buffer:
 * a logical element f = (o * GROUP + g) * INNER + i takes its group's statistics from R's texture
 * copy (every vertex of a group computes them alike, in the compute twin's order) and writes its
 * own value; the padding is written back as it was.
 *   MODE 0 softmax; 1 softmax as exp(x - logsumexp(x)); 2 layer normalization (CENTER / SCALE:
 *   beta / gamma in shift / scale); 3 RMS scaling; 4 L2 normalization (p0 the floor of the sum
 *   of squares, else the epsilon). The maximum skips NaN as OpenCL's fmax does. GLSL ES 3.00. */

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

#pragma malinn_feedback(0, h * w, 1, 1)

MALINN_ARGS(uint m; uint n; uint h; uint w; float p0;)
uniform highp sampler2D malinn_tex0;   /* r, as it was before the draw */
#if SCALE
uniform highp sampler2D malinn_tex1;   /* scale (gamma) */
#endif
#if CENTER
uniform highp sampler2D malinn_tex2;   /* shift (beta) */
#endif
out float malinn_out0;

uint base;
#define AT(g) MALINN_LOAD(malinn_tex0, MALINN_INDEX_R((base + uint(g) * uint(INNER)) % m, \
                                                      (base + uint(g) * uint(INNER)) / m, h, w))

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
    uint ix = MALINN_VERTEX;
    uint row = MALINN_ROW_R(ix, h, w);
    uint col = MALINN_COL_R(ix, h, w);
    float x = MALINN_LOAD(malinn_tex0, ix);
    if (row >= m || col >= n) {
        malinn_out0 = x;
        return;
    }
    uint f = col * m + row;
    uint inner = f % uint(INNER);
    uint g = (f / uint(INNER)) % uint(GROUP);
    base = (f / (uint(GROUP) * uint(INNER))) * uint(GROUP) * uint(INNER) + inner;
#if MODE == 0 || MODE == 1
    float top = -MALINN_INFINITY;
    for (uint k = 0u; k < uint(GROUP); ++k) {
        float y = AT(k);
        top = isnan(y) ? top : max(top, y);
    }
    float total;
    BLOCKED_SUM(total, k, uint(GROUP), exp(AT(k) - top));
#if MODE == 0
    malinn_out0 = exp(x - top) / total;
#else
    malinn_out0 = exp(x - (top + log(total)));
#endif
#elif MODE == 2 || MODE == 3
    /* x - mean as (x - first) - (mean - first), as normalize_axes.cl: 0 exactly for a constant
     * group, an offset group's noise to float32's precision, no overflow near the largest float */
    float first = AT(0u);
    float sum, squares;
    BLOCKED_SUM(sum, k, uint(GROUP), AT(k) - first);
    float offset = sum / float(GROUP);   /* mean - first */
    BLOCKED_SUM(squares, k, uint(GROUP), ((AT(k) - first) - offset) * ((AT(k) - first) - offset));
    float inv = inversesqrt(squares / float(GROUP) + p0);
#if SCALE
    inv = inv * MALINN_LOAD(malinn_tex1, g);
#endif
#if MODE == 2
#if CENTER
    malinn_out0 = ((x - first) - offset) * inv + MALINN_LOAD(malinn_tex2, g);
#else
    malinn_out0 = ((x - first) - offset) * inv;
#endif
#else
    malinn_out0 = x * inv;
#endif
#else
    float squares;
    BLOCKED_SUM(squares, k, uint(GROUP), AT(k) * AT(k));
    malinn_out0 = x * inversesqrt(isnan(squares) ? squares : max(squares, p0));   /* a NaN sum stays NaN */
#endif
}
