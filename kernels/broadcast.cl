/* Per-element parameters broadcast over each sample, in place, for R in any layout.
 *
 * A layer's parameters vary over the sample's trailing axes k..last (a BatchNormalization on axis
 * k, a PReLU's alpha, a Normalization's mean and variance, a Rescaling's scale): the host expands
 * them to those axes, a vector of P = PCOLS x m values (m = the last axis = R's rows). R is the
 * matrix view of the tensor (m rows, one column per position of the other axes), so element
 * (row, col) reads parameter p = (col % PCOLS) * m + row. FORM picks the formula:
 *   0  r = r * scale[p] + shift[p]          (BatchNormalization on any axis, Rescaling)
 *   1  r = (r + shift[p]) * scale[p]        (Normalization: (x - mean) / sqrt(variance), with
 *                                            shift = -mean, subtracted first as Keras does)
 *   2  r = r < 0 ? scale[p] * r : r         (PReLU, alpha in scale; shift is not read)
 * The runtime prepends MALINN_INDEX_R(row, col, prows, pcols) for R's layout; m, n are R's
 * logical rows and columns, h, w its padded ones. Only logical elements are touched, so the
 * padding stays zero. OpenCL C 1.2.
 */

#ifndef PCOLS
#define PCOLS 1
#endif
#ifndef FORM
#define FORM 0
#endif

__kernel void broadcast(uint m, uint n, uint h, uint w,
                        __global float *r,
                        __global const float *scale,
                        __global const float *shift)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    const size_t ix = MALINN_INDEX_R(row, col, h, w);
    const size_t p = (size_t)(col % PCOLS) * m + row;
    const float x = r[ix];
#if FORM == 0
    r[ix] = x * scale[p] + shift[p];
#elif FORM == 1
    r[ix] = (x + shift[p]) * scale[p];
#else
    r[ix] = x < 0.0f ? scale[p] * x : x;
#endif
}
