/* Keras's Embedding: each index of A replaced by its row of the table (a gather), R in any
 * layouts: the GLSL ES 3.10 twin of embedding.cl (read it for the design).
 *   A: the matrix view of the index tensor (batch, d1, ..., dk), M = dk rows; its element at flat
 *   index f is (f % M, f / M). R: m = OUTPUT_DIM rows, column f the embedding of index f.
 *   An index is the float32 value truncated toward zero; a negative index i >= -INPUT_DIM reads
 *   row i + INPUT_DIM (Keras 3's take); any other index outside [0, INPUT_DIM), or NaN, gives NaN
 *   in every feature. The table is the buffer `scale`, INPUT_DIM x OUTPUT_DIM floats, row-major.
 *   INPUT_DIM (default 1) the table's rows, OUTPUT_DIM (default 1) its columns.
 * The range is R's padded h x w: the padding is written as 0. */

#ifndef INPUT_DIM
#define INPUT_DIM 1
#endif
#ifndef OUTPUT_DIM
#define OUTPUT_DIM 1
#endif

MALINN_ARGS(uint m; uint n; uint M; uint H; uint W; uint h; uint w;)
layout(std430, binding = 0) readonly buffer BufA { float a[]; };
layout(std430, binding = 1) writeonly buffer BufR { float r[]; };
layout(std430, binding = 2) readonly buffer BufScale { float scale[]; };

void main() {
    MALINN_GUARD
    uint row = MALINN_GLOBAL_X;
    uint col = MALINN_GLOBAL_Y;
    float v = 0.0;
    if (row < m && col < n) {
        uint src_col = col / M;
        uint src_row = col - src_col * M;
        float x = a[MALINN_INDEX_A(src_row, src_col, H, W)];
        /* the conversion to uint of a value known to be in range truncates it toward zero */
        if (isnan(x))
            v = uintBitsToFloat(0x7FC00000u);
        else if (x > -1.0 && x < float(INPUT_DIM))
            v = scale[(x < 0.0 ? 0u : uint(x)) * uint(OUTPUT_DIM) + row];
        else if (x <= -1.0 && x > -float(INPUT_DIM) - 1.0)
            v = scale[(uint(INPUT_DIM) - uint(-x)) * uint(OUTPUT_DIM) + row];
        else
            v = uintBitsToFloat(0x7FC00000u);   /* NaN: outside the table */
    }
    r[MALINN_INDEX_R(row, col, h, w)] = v;
}
