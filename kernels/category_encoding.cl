/* Keras's CategoryEncoding, and IntegerLookup's one-hot, multi-hot and count outputs: integer
 * indices turned into vectors of m tokens.
 *
 * A is the matrix view of the index tensor (batch, ..., k): M = k rows, one column per position of
 * the other axes; its element at flat index f (Keras's order) is (f % M, f / M). R has m rows, one
 * per token:
 *   MODE 0 (one_hot)    one column per element of A (column f encodes element f):
 *                       R[t, f] = 1 where the index is t, else 0
 *   MODE 1 (multi_hot)  one column per column of A: R[t, c] = 1 where t is among its M indices
 *   MODE 2 (count)      likewise, R[t, c] = how many of its M indices are t
 * The indices arrive as float32: an index is the value truncated toward zero, as Keras's cast to
 * an integer. Outside [0, m), as Keras 3 computes it: a one-hot of such an index is zeros
 * (tf.one_hot), multi-hot and count leave out an index >= m (tf.math.bincount with maxlength m);
 * a negative index there (TensorFlow raises; a device cannot) and a NaN anywhere give NaN in every
 * row of the column, so that it shows downstream. The padding of R is written as zero. The
 * runtime prepends MALINN_INDEX_A and MALINN_INDEX_R; H, W and h, w are A's and R's padded
 * shapes. OpenCL C 1.2.
 */

#ifndef MODE
#define MODE 1
#endif

__kernel void category_encoding(uint m, uint n, uint M, uint H, uint W, uint h, uint w,
                                __global const float *a,
                                __global float *r)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    float v = 0.0f;
    if (row < m && col < n) {
#if MODE == 0
        const uint per = 1u;
        const float lowest = -INFINITY;   /* a one-hot of a negative index is zeros */
#else
        const uint per = M;
        const float lowest = 0.0f;        /* a negative index to multi-hot or count: NaN */
#endif
        const float token = (float)row;
        for (uint j = 0; j < per; ++j) {
            const uint f = col * per + j;
            const uint src_col = f / M;
            const float x = a[MALINN_INDEX_A(f - src_col * M, src_col, H, W)];
            const float t = trunc(x);
            if (isnan(x) || t < lowest) {
                v = as_float(0x7fc00000u);   /* NaN */
                break;
            }
#if MODE == 2
            if (t == token)
                v += 1.0f;
#else
            if (t == token)
                v = 1.0f;
#endif
        }
    }
    r[MALINN_INDEX_R(row, col, h, w)] = v;
}
