/* Fused attention: scores, mask, softmax over the keys and the value product in one kernel, the
 * score matrix never written, on tensors held as matrix views in any layouts: the GLSL ES 3.10
 * twin of attention.cl with attention.clh (read them for the design), from the same entry and
 * defines.
 *   A: the queries, one column per (sample s, query t) = s * TQ + t: rows [0, NH * KD) each head's
 *   projected query, then with AMASK=1 TS rows of the attention mask, then with QMASK the query
 *   mask's row QMROW. B: the keys, one column per (sample s, key j) = s * TS + j: rows
 *   [0, NH * KD) the keys, [VROW, VROW + NH * VD) the values, with VMASK=1 the value mask at row
 *   VMROW. R: rows [0, NH * VD) each head's output, one column per query.
 *   SCORE 0 dot: SCALE * (q . k); 1 concat: CW * sum_d tanh(SCALE * (q_d + k_d)); 2 additive:
 *   sum_d scale[d] * tanh(q_d + k_d) (USE_VECTOR=1: the buffer `scale`, else 1).
 *   A key is kept where every mask holds and, with CAUSAL=1, j <= t. MODE: a masked key's score
 *   is 0 LARGE_NEG, 1 -1e9 and its weight zeroed, 2 score + (1 - m) * -1e9 (m the attention
 *   mask's own value where it is the only mask). QMASK 1: a masked query's output is 0; 2: the
 *   query mask masks every key of the query.
 * Defines (defaults): NH, KD, VD, TQ, TS (1), VROW, AMASK, QMASK, QMROW, VMASK, VMROW, CAUSAL,
 * MODE, SCORE, USE_VECTOR (0), SCALE, CW (1.0f), LARGE_NEG (-2.3726710e38f).
 * One invocation per (query column, head): the range is (h / VD) x w, an online softmax (a
 * running maximum rescales the sum and the values summed so far); an invocation whose head or
 * column is beyond the tensor writes R's padding as 0 (the last head's the rows past
 * (h / VD) * VD). tanh is activations.glsl's malinn_tanh (no overflow for large |x|). */

/* NVIDIA's GLSL compiler unrolls every constant-bound loop under the preamble's #pragma
 * optionNV(unroll all): the loops over the keys stay loops */
#pragma optionNV(unroll none)

#ifndef NH
#define NH 1
#endif
#ifndef KD
#define KD 1
#endif
#ifndef VD
#define VD 1
#endif
#ifndef TQ
#define TQ 1
#endif
#ifndef TS
#define TS 1
#endif
#ifndef VROW
#define VROW 0
#endif
#ifndef AMASK
#define AMASK 0
#endif
#ifndef QMASK
#define QMASK 0
#endif
#ifndef QMROW
#define QMROW 0
#endif
#ifndef VMASK
#define VMASK 0
#endif
#ifndef VMROW
#define VMROW 0
#endif
#ifndef CAUSAL
#define CAUSAL 0
#endif
#ifndef MODE
#define MODE 0
#endif
#ifndef SCORE
#define SCORE 0
#endif
#ifndef USE_VECTOR
#define USE_VECTOR 0
#endif
#ifndef SCALE
#define SCALE 1.0f
#endif
#ifndef CW
#define CW 1.0f
#endif
#ifndef LARGE_NEG
#define LARGE_NEG -2.3726710e38f
#endif

MALINN_ARGS(uint m; uint n; uint h; uint w; uint H; uint W; uint l; uint c;)
layout(std430, binding = 0) readonly buffer BufA { float a[]; };
layout(std430, binding = 1) readonly buffer BufB { float b[]; };
layout(std430, binding = 2) writeonly buffer BufR { float r[]; };
layout(std430, binding = 3) readonly buffer BufScale { float scale[]; };

/* dimension d's term of a query's score for a key (attention.clh's SCORE_TERM) */
#if SCORE == 0
#define SCORE_TERM(q, k, d) ((q) * (k))
#elif SCORE == 1
#define SCORE_TERM(q, k, d) malinn_tanh(SCALE * ((q) + (k)))
#elif USE_VECTOR
#define SCORE_TERM(q, k, d) (scale[d] * malinn_tanh((q) + (k)))
#else
#define SCORE_TERM(q, k, d) malinn_tanh((q) + (k))
#endif

/* the summed terms as the score */
#if SCORE == 0
#define SCORED(sum) ((sum) * SCALE)
#elif SCORE == 1
#define SCORED(sum) ((sum) * CW)
#else
#define SCORED(sum) (sum)
#endif

/* the score a key enters the softmax with (attention.clh's masked_score) */
float masked_score(float score, float keep, float given) {
#if MODE == 0
    return keep != 0.0 ? score : LARGE_NEG;
#elif MODE == 1
    return keep != 0.0 ? score : -1e9;
#elif AMASK && !VMASK && !CAUSAL && QMASK != 2
    return score + (1.0 - given) * -1e9;
#else
    return score + (1.0 - keep) * -1e9;
#endif
}

void main() {
    MALINN_GUARD
    uint head = MALINN_GLOBAL_X;
    uint col = MALINN_GLOBAL_Y;
    uint heads = malinn_range0;
    uint last = head + 1u == heads ? h : head * uint(VD) + uint(VD);
    if (head >= uint(NH) || col >= n) {   /* R's padding */
        for (uint row = head * uint(VD); row < last; ++row)
            r[MALINN_INDEX_R(row, col, h, w)] = 0.0;
        return;
    }
    uint s = col / uint(TQ);
    uint t = col - s * uint(TQ);
    float acc[VD];
    for (uint d = 0u; d < uint(VD); ++d)
        acc[d] = 0.0;
    float top = -3.40282347e38, total = 0.0;   /* below every score (Keras 3's lowest is -0.7 FLT_MAX) */
    for (uint j = 0u; j < uint(TS); ++j) {
        uint kcol = s * uint(TS) + j;
        float score = 0.0;
        for (uint d = 0u; d < uint(KD); ++d) {
            float q = a[MALINN_INDEX_A(head * uint(KD) + d, col, H, W)];
            float k = b[MALINN_INDEX_B(head * uint(KD) + d, kcol, l, c)];
            score += SCORE_TERM(q, k, d);
        }
        score = SCORED(score);
        float keep = 1.0, given = 1.0;
#if AMASK
        given = a[MALINN_INDEX_A(uint(NH * KD) + j, col, H, W)];
        keep = given != 0.0 ? 1.0 : 0.0;
#endif
#if VMASK
        keep = b[MALINN_INDEX_B(uint(VMROW), kcol, l, c)] != 0.0 ? keep : 0.0;
#endif
#if QMASK == 2
        keep = a[MALINN_INDEX_A(uint(QMROW), col, H, W)] != 0.0 ? keep : 0.0;
#endif
#if CAUSAL
        keep = j <= t ? keep : 0.0;
#endif
        /* one key into the online softmax (attention.clh's online_step) */
        float x = masked_score(score, keep, given);
        if (x > top) {   /* a new maximum: rescale what was summed so far */
            float shrink = exp(top - x);
            total *= shrink;
            for (uint d = 0u; d < uint(VD); ++d)
                acc[d] *= shrink;
            top = x;
        }
        float p = exp(x - top);
        total += p;
#if MODE == 1
        float weight = p * keep;
#else
        float weight = p;
#endif
        for (uint d = 0u; d < uint(VD); ++d)
            acc[d] += weight * b[MALINN_INDEX_B(uint(VROW) + head * uint(VD) + d, kcol, l, c)];
    }
    float factor = 1.0 / total;
#if QMASK == 1
    factor = a[MALINN_INDEX_A(uint(QMROW), col, H, W)] != 0.0 ? factor : 0.0;
#endif
    for (uint d = 0u; d < uint(VD); ++d)
        r[MALINN_INDEX_R(head * uint(VD) + d, col, h, w)] = acc[d] * factor;
    for (uint row = head * uint(VD) + uint(VD); row < last; ++row)
        r[MALINN_INDEX_R(row, col, h, w)] = 0.0;
}
