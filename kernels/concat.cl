/* Concatenate (any axis) on tensors held as matrix views, in any layouts.
 *
 * Element (row, col) of a matrix view is flat index col * rows + row in Keras's row-major order.
 * One launch per input: R's elements at axis positions [OFFSET, OFFSET + ALEN) come from A
 * (INNER: elements after the axis, RLEN / ALEN: the axis' length in R / A). FIRST=1 (one launch
 * per result) also writes R's padding (row >= m or col >= n) as 0; every other element is in
 * some input's slice, written by that input's launch, or by the matmul that produced the input
 * straight into its slice (a view: epilogue.clh R_VIEW), which nothing here may overwrite.
 * The runtime prepends MALINN_INDEX_A / _R. OpenCL C 1.2.
 *
 * Defines: FIRST (0 or 1), INNER. Arguments after the buffers (the library's "argdefines": one
 * program serves every input of every concatenation along an axis): ALEN, RLEN, OFFSET, and the
 * magic numbers RLEN_M, RLEN_L that divide by RLEN with a multiplication (a hardware divide per
 * item, which a CPU does not vectorise, cost the kernel 1.8x on PoCL, measured with the cold-start
 * benchmark's --kernel-times; window.clh window_divide), for an R of fewer than 2^32 elements (the
 * runtime refuses a larger one when it binds the kernel).
 */

#ifndef FIRST
#define FIRST 0
#endif
#ifndef INNER
#define INNER 1
#endif

inline uint concat_divide(uint n, uint m, uint l)
{
    const uint t = mul_hi(m, n);
    return (t + ((n - t) >> min(l, 1u))) >> (max(l, 1u) - 1u);
}

__kernel void concat(uint m, uint n, uint h, uint w, uint M, uint H, uint W,
                     __global float *r,
                     __global const float *a,
                     uint ALEN, uint RLEN, uint OFFSET, uint RLEN_M, uint RLEN_L)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    const size_t ix = MALINN_INDEX_R(row, col, h, w);
    if (row < m && col < n) {
        const ulong f = (ulong)col * m + row;
        const ulong rest = f / INNER;             /* remainders spelt out: no LLVM freeze (Oclgrind) */
        const ulong inner = f - rest * INNER;
        const ulong outer = concat_divide((uint)rest, RLEN_M, RLEN_L);   /* rest < 2^32: the runtime's check */
        const ulong j = rest - outer * RLEN;
        if (j >= OFFSET && j < OFFSET + ALEN) {
            const ulong g = (outer * ALEN + (j - OFFSET)) * INNER + inner;
            const ulong acol = g / M;
            r[ix] = a[MALINN_INDEX_A((uint)(g - acol * M), (uint)acol, H, W)];
        }
        return;
    }
#if FIRST
    r[ix] = 0.0f;
#endif
}
