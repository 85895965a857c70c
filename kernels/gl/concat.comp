/* One input of a Concatenate written into its slice of R along any axis, any layouts: the GLSL ES
 * 3.10 twin of concat.cl. R's elements at axis positions [OFFSET, OFFSET + ALEN) come from A
 * (INNER: elements after the axis; RLEN / ALEN: the axis' length in R / A). FIRST=1 (the first
 * input) also writes every other element of R, its padding included, as 0. */

#ifndef FIRST
#define FIRST 0
#endif
#ifndef INNER
#define INNER 1
#endif
#ifndef ALEN
#define ALEN 1
#endif
#ifndef RLEN
#define RLEN 1
#endif
#ifndef OFFSET
#define OFFSET 0
#endif

MALINN_ARGS(uint m; uint n; uint h; uint w; uint M; uint H; uint W;)
layout(std430, binding = 0) buffer BufR { float r[]; };
layout(std430, binding = 1) readonly buffer BufA { float a[]; };

void main() {
    MALINN_GUARD
    uint row = MALINN_GLOBAL_X;
    uint col = MALINN_GLOBAL_Y;
    uint ix = MALINN_INDEX_R(row, col, h, w);
    if (row < m && col < n) {
        uint f = col * m + row;
        uint rest = f / uint(INNER);
        uint inner = f % uint(INNER);
        uint outer = rest / uint(RLEN);
        uint j = rest % uint(RLEN);
        if (j >= uint(OFFSET) && j < uint(OFFSET) + uint(ALEN)) {
            uint g = (outer * uint(ALEN) + (j - uint(OFFSET))) * uint(INNER) + inner;
            r[ix] = a[MALINN_INDEX_A(g % M, g / M, H, W)];
            return;
        }
    }
#if FIRST
    r[ix] = 0.0;
#endif
}
