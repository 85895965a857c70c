/* Keras Permute: a tensor with its sample axes reordered, from A into R in any layouts: the GLSL
 * ES 3.10 twin of permute.cl (read it for the design). Element (row, col) of R is output flat
 * index f = col * m + row, in sample b = f / SAMPLE at offset s = f % SAMPLE; its source is
 * b * SAMPLE + sum_k ((s / OSTRk) % ODIMk) * ISTRk of the input, element (src % M, src / M) of A.
 * R's padding is written as zero. The axes' terms are spelt out (no token pasting in GLSL ES);
 * flat indices are 32-bit (a storage buffer holds fewer than 2^32 floats). */

#ifndef NAX
#define NAX 1
#endif
#ifndef SAMPLE
#define SAMPLE 1
#endif
#ifndef ODIM0
#define ODIM0 1
#endif
#ifndef OSTR0
#define OSTR0 1
#endif
#ifndef ISTR0
#define ISTR0 1
#endif
#ifndef ODIM1
#define ODIM1 1
#endif
#ifndef OSTR1
#define OSTR1 1
#endif
#ifndef ISTR1
#define ISTR1 1
#endif
#ifndef ODIM2
#define ODIM2 1
#endif
#ifndef OSTR2
#define OSTR2 1
#endif
#ifndef ISTR2
#define ISTR2 1
#endif
#ifndef ODIM3
#define ODIM3 1
#endif
#ifndef OSTR3
#define OSTR3 1
#endif
#ifndef ISTR3
#define ISTR3 1
#endif
#ifndef ODIM4
#define ODIM4 1
#endif
#ifndef OSTR4
#define OSTR4 1
#endif
#ifndef ISTR4
#define ISTR4 1
#endif
#ifndef ODIM5
#define ODIM5 1
#endif
#ifndef OSTR5
#define OSTR5 1
#endif
#ifndef ISTR5
#define ISTR5 1
#endif
#ifndef ODIM6
#define ODIM6 1
#endif
#ifndef OSTR6
#define OSTR6 1
#endif
#ifndef ISTR6
#define ISTR6 1
#endif
#ifndef ODIM7
#define ODIM7 1
#endif
#ifndef OSTR7
#define OSTR7 1
#endif
#ifndef ISTR7
#define ISTR7 1
#endif

MALINN_ARGS(uint m; uint n; uint M; uint H; uint W; uint h; uint w;)
layout(std430, binding = 0) readonly buffer BufA { float a[]; };
layout(std430, binding = 1) writeonly buffer BufR { float r[]; };

void main() {
    MALINN_GUARD
    uint row = MALINN_GLOBAL_X;
    uint col = MALINN_GLOBAL_Y;
    float v = 0.0;
    if (row < m && col < n) {
        uint f = col * m + row;
        uint b = f / uint(SAMPLE);
        uint s = f % uint(SAMPLE);
        uint src = b * uint(SAMPLE) + ((s / uint(OSTR0)) % uint(ODIM0)) * uint(ISTR0);
#if NAX > 1
        src += ((s / uint(OSTR1)) % uint(ODIM1)) * uint(ISTR1);
#endif
#if NAX > 2
        src += ((s / uint(OSTR2)) % uint(ODIM2)) * uint(ISTR2);
#endif
#if NAX > 3
        src += ((s / uint(OSTR3)) % uint(ODIM3)) * uint(ISTR3);
#endif
#if NAX > 4
        src += ((s / uint(OSTR4)) % uint(ODIM4)) * uint(ISTR4);
#endif
#if NAX > 5
        src += ((s / uint(OSTR5)) % uint(ODIM5)) * uint(ISTR5);
#endif
#if NAX > 6
        src += ((s / uint(OSTR6)) % uint(ODIM6)) * uint(ISTR6);
#endif
#if NAX > 7
        src += ((s / uint(OSTR7)) % uint(ODIM7)) * uint(ISTR7);
#endif
        v = a[MALINN_INDEX_A(src % M, src / M, H, W)];
    }
    r[MALINN_INDEX_R(row, col, h, w)] = v;
}
