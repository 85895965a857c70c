/* Keras's Embedding: each index of A replaced by its row of the table (a gather).
 *
 * A is the matrix view of the index tensor (batch, d1, ..., dk): M = dk rows, one column per
 * position of the other axes; its element at flat index f (Keras's order) is (f % M, f / M). R is
 * (batch, d1, ..., dk, OUTPUT_DIM): m = OUTPUT_DIM rows, n = the indices' count columns, column f
 * holding the embedding of index f. The indices arrive as float32 (malinn's inputs): an index is
 * the value truncated toward zero, as Keras's cast to int32; a negative index i >= -INPUT_DIM
 * reads row i + INPUT_DIM (Keras 3's take); any other index outside [0, INPUT_DIM) (TensorFlow
 * on a CPU raises there, a device cannot) gives NaN in every feature, so that it shows downstream.
 * The table is the buffer `scale`, INPUT_DIM x OUTPUT_DIM floats in Keras's row-major order. The
 * padding of R is written as zero. The runtime prepends MALINN_INDEX_A and MALINN_INDEX_R; H, W
 * and h, w are A's and R's padded shapes. OpenCL C 1.2.
 */

#ifndef INPUT_DIM
#define INPUT_DIM 1
#endif
#ifndef OUTPUT_DIM
#define OUTPUT_DIM 1
#endif

__kernel void embedding_gather(uint m, uint n, uint M, uint H, uint W, uint h, uint w,
                               __global const float *a,
                               __global float *r,
                               __global const float *scale)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    float v = 0.0f;
    if (row < m && col < n) {
        const uint src_col = col / M;
        const uint src_row = col - src_col * M;
        const float x = a[MALINN_INDEX_A(src_row, src_col, H, W)];
        /* the conversion to uint of a value known to be in range truncates it toward zero */
        if (x > -1.0f && x < (float)INPUT_DIM)
            v = scale[(x < 0.0f ? 0u : (uint)x) * OUTPUT_DIM + row];
        else if (x <= -1.0f && x > -(float)INPUT_DIM - 1.0f)
            v = scale[(INPUT_DIM - (uint)(-x)) * OUTPUT_DIM + row];
        else
            v = as_float(0x7fc00000u);   /* NaN: outside the table, or NaN itself */
    }
    r[MALINN_INDEX_R(row, col, h, w)] = v;
}
