/* Fused attention: scores, mask, softmax over the keys and the value product in one kernel, the
 * score matrix never written (Keras's MultiHeadAttention after its projections, Attention and
 * AdditiveAttention), on tensors held as matrix views in any layouts.
 *
 * A holds the queries, one column per (sample s, query t) = s * TQ + t: rows [0, NH * KD) the
 * projected query of each head (head h at rows h * KD ...), then, with AMASK=1, TS rows of the
 * attention mask (row NH * KD + j: whether query t may attend to key j), then, with QMASK=1, one
 * row of the query mask (row QMROW). B holds the keys, one column per (sample s, key j) =
 * s * TS + j: rows [0, NH * KD) the keys, rows [VROW, VROW + NH * VD) the values (VROW 0: the keys
 * are the values), with VMASK=1 the value mask at row VMROW. R: rows [0, NH * VD) the attention
 * output of each head, one column per query.
 *
 * Scores (SCORE): 0  dot: SCALE * (q . k)
 *                 1  concat (Keras's Attention): CW * sum_d tanh(SCALE * (q_d + k_d))
 *                 2  additive (AdditiveAttention): sum_d scale[d] * tanh(q_d + k_d) (USE_VECTOR=1:
 *                    the buffer "scale", else 1)
 * A key is kept where every mask given holds (non-zero) and, with CAUSAL=1, j <= t. MODE says what
 * a masked key's score becomes, as each Keras computes it:
 *   0  the lowest score LARGE_NEG (Keras 3's dot_product_attention): a query whose every key is
 *      masked averages the values
 *   1  -1e9, and the masked keys' weights then zeroed (Keras 3's Softmax with a mask): such a
 *      query's output is 0
 *   2  score + (1 - m) * -1e9 (tf_keras's Softmax, the Attention layers' score - 1e9), m the
 *      attention mask's own value where it is the only mask, else 1 or 0
 * The softmax runs online (one pass: a running maximum rescales the sum and the accumulated
 * values). With QMASK=1 a masked query's output is 0 (Attention's query mask); with QMASK=2 the
 * query mask is part of the attention mask (MultiHeadAttention's: a masked query's every key is
 * masked).
 *
 * One work item per (query column, head): the range is (h / VD) x w; an item whose head or column
 * is beyond the tensor writes R's padding as 0 (and the last head item the rows past
 * (h / VD) * VD). The defines' defaults, the score and the online softmax step are attention.clh's
 * (shared with attention_tiled.cl). The runtime prepends MALINN_INDEX_A / _B / _R. OpenCL C 1.2.
 */


__kernel void attention(uint m, uint n, uint h, uint w, uint H, uint W, uint l, uint c,
                        __global const float *a,
                        __global const float *b,
                        __global float *r,
                        __global const float *scale)
{
    const uint head = get_global_id(0);
    const uint col = get_global_id(1);
    const uint heads = get_global_size(0);
    const uint last = head + 1 == heads ? h : head * VD + VD;
    if (head >= NH || col >= n) {   /* R's padding */
        for (uint row = head * VD; row < last; ++row) {
            r[MALINN_INDEX_R(row, col, h, w)] = 0.0f;
        }
        return;
    }
    const uint s = col / TQ;
    const uint t = col - s * TQ;
    float acc[VD];
    for (uint d = 0; d < VD; ++d) {
        acc[d] = 0.0f;
    }
    float top = -FLT_MAX, total = 0.0f;   /* below every score (Keras 3's lowest is -0.7 FLT_MAX) */
    for (uint j = 0; j < TS; ++j) {
        const uint kcol = s * TS + j;
        float score = 0.0f;
        for (uint d = 0; d < KD; ++d) {
            const float q = a[MALINN_INDEX_A(head * KD + d, col, H, W)];
            const float k = b[MALINN_INDEX_B(head * KD + d, kcol, l, c)];
            score += SCORE_TERM(q, k, d);
        }
        score = SCORED(score);
        float keep = 1.0f, given = 1.0f;
#if AMASK
        given = a[MALINN_INDEX_A(NH * KD + j, col, H, W)];
        keep = given != 0.0f ? 1.0f : 0.0f;
#endif
#if VMASK
        keep = b[MALINN_INDEX_B(VMROW, kcol, l, c)] != 0.0f ? keep : 0.0f;
#endif
#if QMASK == 2
        keep = a[MALINN_INDEX_A(QMROW, col, H, W)] != 0.0f ? keep : 0.0f;
#endif
#if CAUSAL
        keep = j <= t ? keep : 0.0f;
#endif
        const float weight = online_step(masked_score(score, keep, given), keep, &top, &total, acc);
        for (uint d = 0; d < VD; ++d) {
            acc[d] += weight * b[MALINN_INDEX_B(VROW + head * VD + d, kcol, l, c)];
        }
    }
    float factor = 1.0f / total;
#if QMASK == 1
    factor = a[MALINN_INDEX_A(QMROW, col, H, W)] != 0.0f ? factor : 0.0f;
#endif
    for (uint d = 0; d < VD; ++d) {
        r[MALINN_INDEX_R(head * VD + d, col, h, w)] = acc[d] * factor;
    }
    for (uint row = head * VD + VD; row < last; ++row) {
        r[MALINN_INDEX_R(row, col, h, w)] = 0.0f;
    }
}
