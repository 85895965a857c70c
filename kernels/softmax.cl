/* Softmax over the feature axis, in place, for R in any layout.
 *
 * R is units x batch (the thesis's orientation), so each column is one sample: one work item per
 * column computes max, then sum of exp(x - max), then writes exp(x - max) / sum. Subtracting the
 * maximum keeps exp from overflowing; a NaN in a column makes that column NaN, as in TensorFlow.
 * The sum runs in blocks of 64 terms, each block's sum added to the total: its rounding grows with
 * 64 + m / 64 terms, not m (summed one by one, a softmax over 8192 features was 1.9e-5 off).
 * The runtime prepends MALINN_INDEX_R(row, col, prows, pcols) for R's layout; m, n are the logical
 * rows and columns, h, w the padded ones. OpenCL C 1.2.
 */

__kernel void softmax(uint m, uint n, uint h, uint w, __global float *r)
{
    const uint col = get_global_id(0);
    float top = -INFINITY;
    for (uint row = 0; row < m; ++row)
        top = fmax(top, r[MALINN_INDEX_R(row, col, h, w)]);
    float total = 0.0f, part = 0.0f;
    for (uint row = 0; row < m; ++row) {
        part += exp(r[MALINN_INDEX_R(row, col, h, w)] - top);
        if ((row & 63u) == 63u) {
            total += part;
            part = 0.0f;
        }
    }
    total += part;
    for (uint row = 0; row < m; ++row) {
        const size_t ix = MALINN_INDEX_R(row, col, h, w);
        r[ix] = exp(r[ix] - top) / total;
    }
}
