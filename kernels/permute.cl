/* Permute: a tensor with its sample axes reordered (Keras's Permute), from A into R, any layouts.
 *
 * Both tensors are held as matrix views (last axis = rows, one column per position of the other
 * axes), so element (row, col) of R is flat index f = col * m + row of the output, in sample
 * b = f / SAMPLE at offset s = f % SAMPLE. Output axis k (k < NAX, the sample's rank) has ODIMk
 * positions and stride OSTRk in the output; ISTRk is the stride, in the input, of the input axis
 * that becomes output axis k. The source is flat index b * SAMPLE + sum_k ((s / OSTRk) % ODIMk)
 * * ISTRk of the input, element (src % M, src / M) of A (M = A's logical rows). The padding of R
 * is written as zero. The runtime prepends MALINN_INDEX_A and MALINN_INDEX_R; H, W and h, w are
 * A's and R's padded shapes. OpenCL C 1.2.
 */

#ifndef NAX
#define NAX 1
#endif
#ifndef SAMPLE
#define SAMPLE 1
#endif
/* ((s / OSTRk) % ODIMk) * ISTRk, the remainder spelt out (no LLVM freeze: Oclgrind) */
#define MALINN_PERMUTE_AXIS(k) ((s / OSTR##k - (s / OSTR##k / ODIM##k) * ODIM##k) * ISTR##k)
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

__kernel void permute(uint m, uint n, uint M, uint H, uint W, uint h, uint w,
                      __global const float *a,
                      __global float *r)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    float v = 0.0f;
    if (row < m && col < n) {
        const ulong f = (ulong)col * m + row;
        const ulong b = f / SAMPLE;
        const ulong s = f - b * SAMPLE;
        ulong src = b * SAMPLE + MALINN_PERMUTE_AXIS(0);
#if NAX > 1
        src += MALINN_PERMUTE_AXIS(1);
#endif
#if NAX > 2
        src += MALINN_PERMUTE_AXIS(2);
#endif
#if NAX > 3
        src += MALINN_PERMUTE_AXIS(3);
#endif
#if NAX > 4
        src += MALINN_PERMUTE_AXIS(4);
#endif
#if NAX > 5
        src += MALINN_PERMUTE_AXIS(5);
#endif
#if NAX > 6
        src += MALINN_PERMUTE_AXIS(6);
#endif
#if NAX > 7
        src += MALINN_PERMUTE_AXIS(7);
#endif
        const ulong src_col = src / M;
        const uint src_row = (uint)(src - src_col * M);
        v = a[MALINN_INDEX_A(src_row, (uint)src_col, H, W)];
    }
    r[MALINN_INDEX_R(row, col, h, w)] = v;
}
