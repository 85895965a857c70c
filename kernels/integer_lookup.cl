/* Keras's IntegerLookup (invert=False): each integer token replaced by its index in the vocabulary.
 *
 * A and R have one shape (m rows, n columns of the same matrix view), in any layouts. The tokens
 * arrive as float32: a token is the value truncated toward zero, as Keras's cast to int64. The
 * vocabulary is VOCAB tokens sorted ascending in the buffer `scale`, each token's index (its place
 * in Keras's vocabulary plus the mask and OOV indices before it) at the same place in `shift`; a
 * binary search finds a token in ceil(log2(VOCAB + 1)) reads of `scale`. Then, as Keras:
 *   MASKING 1: the token MASK_TOKEN gives MASK_INDEX (0 where Keras outputs indices; a number past
 *              the last index where the indices are encoded next, which the encoding leaves out)
 *   a token of the vocabulary gives its index
 *   any other token (out of vocabulary): OOV 0: NaN (Keras raises; a device cannot), OOV 1:
 *              OOV_START, OOV > 1: OOV_START + floormod(token, OOV) (Keras's "floormod" method)
 * A NaN token gives NaN. The padding of R is written as zero. The runtime prepends MALINN_INDEX_A
 * and MALINN_INDEX_R; H, W and h, w are A's and R's padded shapes. OpenCL C 1.2.
 */

#ifndef VOCAB
#define VOCAB 1
#endif
#ifndef OOV
#define OOV 1
#endif
#ifndef OOV_START
#define OOV_START 0
#endif
#ifndef MASKING
#define MASKING 0
#endif
#ifndef MASK_TOKEN
#define MASK_TOKEN 0
#endif
#ifndef MASK_INDEX
#define MASK_INDEX 0
#endif

__kernel void integer_lookup(uint m, uint n, uint H, uint W, uint h, uint w,
                             __global const float *a,
                             __global float *r,
                             __global const float *scale,
                             __global const float *shift)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    float v = 0.0f;
    if (row < m && col < n) {
        const float x = a[MALINN_INDEX_A(row, col, H, W)];
        const float t = trunc(x);
        uint lo = 0u, hi = VOCAB;
        while (lo < hi) {
            const uint mid = (lo + hi) >> 1;
            if (scale[mid] < t)
                lo = mid + 1u;
            else
                hi = mid;
        }
        if (isnan(x))
            v = as_float(0x7fc00000u);
#if MASKING
        else if (t == (float)MASK_TOKEN)
            v = (float)MASK_INDEX;
#endif
        else if (lo < VOCAB && scale[lo] == t)
            v = shift[lo];
        else {
#if OOV == 0
            v = as_float(0x7fc00000u);   /* NaN: out of vocabulary, which Keras refuses */
#elif OOV == 1
            v = (float)OOV_START;
#else
            const long token = (long)clamp(t, -9.0e18f, 9.0e18f);
            long bucket = token % (long)OOV;
            if (bucket < 0)
                bucket += OOV;
            v = (float)(OOV_START + bucket);
#endif
        }
    }
    r[MALINN_INDEX_R(row, col, h, w)] = v;
}
