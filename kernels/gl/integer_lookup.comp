/* Keras's IntegerLookup (invert=False): each integer token replaced by its index in the
 * vocabulary, A and R of one shape in any layouts: the GLSL ES 3.10 twin of integer_lookup.cl
 * (read it for the design).
 *   A token is the float32 value truncated toward zero. The vocabulary is VOCAB (default 1)
 *   tokens sorted ascending in the buffer `scale`, each token's index at the same place in
 *   `shift`, found by a binary search. Then, as Keras:
 *   MASKING 1 (default 0): the token MASK_TOKEN (default 0) gives MASK_INDEX (default 0)
 *   a token of the vocabulary gives its index
 *   any other token: OOV (default 1) 0: NaN, 1: OOV_START (default 0), OOV > 1: OOV_START +
 *   floormod(token, OOV), the token clamped to +-9e18 as the OpenCL kernel's 64-bit conversion
 * A NaN token gives NaN. GLSL ES has no 64-bit integers: the floormod of a token of 2^24 or more
 * (a float mantissa times 2^e) is the mantissa's remainder doubled e times modulo OOV, exact in
 * 32 bits for any OOV below 2^31. The range is R's padded h x w: the padding is written as 0. */

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

MALINN_ARGS(uint m; uint n; uint H; uint W; uint h; uint w;)
layout(std430, binding = 0) readonly buffer BufA { float a[]; };
layout(std430, binding = 1) writeonly buffer BufR { float r[]; };
layout(std430, binding = 2) readonly buffer BufScale { float scale[]; };
layout(std430, binding = 3) readonly buffer BufShift { float shift[]; };

#if OOV > 1
/* floormod(t, OOV) of an integer-valued float t, |t| <= 9e18 */
uint malinn_floormod(float t) {
    float size = abs(t);
    uint rest;
    if (size < 16777216.0) {
        rest = uint(size) % uint(OOV);
    } else {   /* size = mantissa * 2^shift, the mantissa 24 bits */
        uint bits = floatBitsToUint(size);
        uint shift = (bits >> 23) - 150u;
        rest = ((bits & 0x7FFFFFu) | 0x800000u) % uint(OOV);
        for (uint i = 0u; i < shift; ++i)
            rest = (rest * 2u) % uint(OOV);
    }
    return (t < 0.0 && rest != 0u) ? uint(OOV) - rest : rest;
}
#endif

void main() {
    MALINN_GUARD
    uint row = MALINN_GLOBAL_X;
    uint col = MALINN_GLOBAL_Y;
    float v = 0.0;
    if (row < m && col < n) {
        float x = a[MALINN_INDEX_A(row, col, H, W)];
        float t = trunc(x);
        uint lo = 0u, hi = uint(VOCAB);
        while (lo < hi) {
            uint mid = (lo + hi) >> 1;
            if (scale[mid] < t)
                lo = mid + 1u;
            else
                hi = mid;
        }
        if (isnan(x))
            v = uintBitsToFloat(0x7FC00000u);
#if MASKING
        else if (t == float(MASK_TOKEN))
            v = float(MASK_INDEX);
#endif
        else if (lo < uint(VOCAB) && scale[lo] == t)
            v = shift[lo];
        else {
#if OOV == 0
            v = uintBitsToFloat(0x7FC00000u);   /* NaN: out of vocabulary, which Keras refuses */
#elif OOV == 1
            v = float(OOV_START);
#else
            v = float(uint(OOV_START) + malinn_floormod(clamp(t, -9.0e18, 9.0e18)));
#endif
        }
    }
    r[MALINN_INDEX_R(row, col, h, w)] = v;
}
