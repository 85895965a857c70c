/* Keras's SimpleRNN, LSTM and GRU recurrences: every time step of one layer in one launch.
 *
 * B holds the input projection of every step, x_t W + bias (one matmul before this kernel):
 * the matrix view of (batch, STEPS, GATES * UNITS), GATES * UNITS rows, column s * STEPS + t for
 * sample s and step t. One work-group per sample, one work item per unit j: the state h (and an
 * LSTM's c) stays in the group's local memory and each step computes, in Keras's gate order,
 *   CELL 0 SimpleRNN:  h = ACT(x + h U)
 *   CELL 1 LSTM:       i, f, o = RACT(x_i + h U_i, ...), c = f c + i ACT(x_c + h U_c), h = o ACT(c)
 *   CELL 2 GRU (reset_after):  z, r = RACT(x_z + h U_z + b_z, ...), h~ = ACT(x_h + r (h U_h + b_h)),
 *                              h = z h + (1 - z) h~ (b: the recurrent bias, buffer `shift`, RBIAS=1)
 *   CELL 3 GRU (reset before): as 2 without the recurrent bias, h~ = ACT(x_h + (r h) U_h)
 * reading the recurrent kernel U (UNITS x GATES * UNITS floats, Keras's row-major order) from
 * the buffer `scale`, with barriers between the steps. BACKWARDS=1 runs the steps from the last
 * (Keras's go_backwards). MASKED=1 reads A, the (batch, STEPS) mask (matrix view STEPS rows, a
 * column per sample, 0 = masked): a masked step keeps the state and outputs the previous output
 * (Keras's default), or zero with ZERO_MASKED=1 (the layers of a Bidirectional). R holds, with
 * SEQUENCES=1, every step's output h in the order the steps run (the matrix view of (batch,
 * STEPS, UNITS): column s * STEPS + step); else the last h, or the last c with STATE=1 (one column
 * per sample). FLIP=1 writes the sequence in the other order, step k at column s * STEPS + STEPS
 * - 1 - k (a Bidirectional's backward layer: its output reversed back into the input's order).
 * OUT_STEPS is STEPS with SEQUENCES, else 1 (the columns per work-group). R's padding
 * is written as zero. ACT and RACT are act_<name> macros of activations.clh without parameters.
 * KS > 1 splits each unit's recurrent sums over KS work items (a work-group of UNITS x KS items,
 * one per sample): item (j, q) keeps its slice of U, rows q * KCH to q * KCH + KCH - 1, in
 * registers for the whole sequence and adds its products into local memory, where item (j, 0)
 * sums them (the sums of a step no longer wait on UNITS loads from global memory each). CELL 3
 * (a second product with r h) runs with KS 1.
 * The runtime prepends MALINN_INDEX_A / _B / _R; l, c and h, w (and H, W) are B's and R's (and
 * A's) padded shapes. OpenCL C 1.2.
 */

#ifndef UNITS
#define UNITS 1
#endif
#ifndef STEPS
#define STEPS 1
#endif
#ifndef OUT_STEPS
#define OUT_STEPS 1
#endif
#ifndef CELL
#define CELL 1
#endif
#ifndef ACT
#define ACT act_tanh
#endif
#ifndef RACT
#define RACT act_sigmoid
#endif
#ifndef BACKWARDS
#define BACKWARDS 0
#endif
#ifndef SEQUENCES
#define SEQUENCES 0
#endif
#ifndef STATE
#define STATE 0
#endif
#ifndef MASKED
#define MASKED 0
#endif
#ifndef ZERO_MASKED
#define ZERO_MASKED 0
#endif
#ifndef RBIAS
#define RBIAS 0
#endif
#ifndef FLIP
#define FLIP 0
#endif

#if CELL == 0
#define GATES 1
#elif CELL == 1
#define GATES 4
#else
#define GATES 3
#endif
/* the gates whose recurrent sums read h itself (GRU before reset: not the candidate's) */
#if CELL == 3
#define HGATES 2
#else
#define HGATES GATES
#endif
#define GU (GATES * UNITS)
#ifndef KS
#define KS 1
#endif
#if CELL == 3 && KS != 1
#error "a GRU with reset_after=False runs with KS 1"
#endif
/* the rows of U each of a unit's KS items holds */
#define KCH ((UNITS + KS - 1) / KS)

__kernel __attribute__((reqd_work_group_size(UNITS, KS, 1)))
void recurrent(uint m, uint n, uint h, uint w, uint l, uint c,
#if MASKED
               uint M, uint H, uint W,
               __global const float *a,
#endif
               __global const float *b,
               __global float *r,
               __global const float *scale,
               __global const float *shift)
{
    const uint j = get_local_id(0);
    const uint q = get_local_id(1);
    const uint s = get_group_id(1);
    __local float hs[UNITS];
#if CELL == 3
    __local float rh[UNITS];
#endif
#if KS > 1
    __local float part[KS * HGATES * UNITS];
    float u[KCH * HGATES];                           /* this item's rows of U, read once */
    for (uint kk = 0; kk < KCH; ++kk) {
        const uint k = q * KCH + kk;
        for (uint g = 0; g < HGATES; ++g)
            u[kk * HGATES + g] = k < UNITS ? scale[k * GU + g * UNITS + j] : 0.0f;
    }
#endif
    if (q == 0) {
        for (uint t = 0; t < OUT_STEPS; ++t)         /* R's padding rows of this sample's columns */
            for (uint row = m + j; row < h; row += UNITS)
                r[MALINN_INDEX_R(row, s * OUT_STEPS + t, h, w)] = 0.0f;
        if (s == 0)                                  /* R's padding columns */
            for (uint col = n; col < w; ++col)
                for (uint row = j; row < h; row += UNITS)
                    r[MALINN_INDEX_R(row, col, h, w)] = 0.0f;
        hs[j] = 0.0f;
    }
    float hj = 0.0f, cj = 0.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint step = 0; step < STEPS; ++step) {
        const uint t = BACKWARDS ? STEPS - 1 - step : step;
        const uint col = s * STEPS + t;
#if KS > 1
        {
            float p[HGATES];
            for (uint g = 0; g < HGATES; ++g)
                p[g] = 0.0f;
            for (uint kk = 0; kk < KCH; ++kk) {
                const uint k = q * KCH + kk;
                const float hk = k < UNITS ? hs[k] : 0.0f;
                for (uint g = 0; g < HGATES; ++g)
                    p[g] += u[kk * HGATES + g] * hk;
            }
            for (uint g = 0; g < HGATES; ++g)
                part[(q * HGATES + g) * UNITS + j] = p[g];
        }
        barrier(CLK_LOCAL_MEM_FENCE);                /* every item's partial sums are in */
#endif
        float nh = hj, nc = cj;
#if MASKED
        int keep = 1;
#endif
        if (q == 0) {
            float acc[GATES], x[GATES];
            for (uint g = 0; g < GATES; ++g) {
                x[g] = b[MALINN_INDEX_B(g * UNITS + j, col, l, c)];
                acc[g] = RBIAS ? shift[g * UNITS + j] : 0.0f;
            }
#if KS > 1
            for (uint qq = 0; qq < KS; ++qq)
                for (uint g = 0; g < HGATES; ++g)
                    acc[g] += part[(qq * HGATES + g) * UNITS + j];
#else
            for (uint k = 0; k < UNITS; ++k) {
                const float hk = hs[k];
                __global const float *uk = scale + k * GU + j;
                for (uint g = 0; g < HGATES; ++g)
                    acc[g] += uk[g * UNITS] * hk;
            }
#endif
#if CELL == 0
            nh = ACT(x[0] + acc[0]);
#elif CELL == 1
            const float gi = RACT(x[0] + acc[0]);
            const float gf = RACT(x[1] + acc[1]);
            const float gc = ACT(x[2] + acc[2]);
            const float go = RACT(x[3] + acc[3]);
            nc = gf * cj + gi * gc;
            nh = go * ACT(nc);
#elif CELL == 2
            const float gz = RACT(x[0] + acc[0]);
            const float gr = RACT(x[1] + acc[1]);
            const float gh = ACT(x[2] + gr * acc[2]);
            nh = gz * hj + (1.0f - gz) * gh;
#else   /* KS is 1: every item of the group is here, so the barrier is met by all */
            const float gz = RACT(x[0] + acc[0]);
            const float gr = RACT(x[1] + acc[1]);
            rh[j] = gr * hj;
            barrier(CLK_LOCAL_MEM_FENCE);
            float ah = 0.0f;
            for (uint k = 0; k < UNITS; ++k)
                ah += scale[k * GU + 2 * UNITS + j] * rh[k];
            const float gh = ACT(x[2] + ah);
            nh = gz * hj + (1.0f - gz) * gh;
#endif
#if MASKED
            keep = a[MALINN_INDEX_A(t, s, H, W)] != 0.0f;
            if (!keep) {
                nh = hj;
                nc = cj;
            }
#endif
        }
        hj = nh;
        cj = nc;
        barrier(CLK_LOCAL_MEM_FENCE);                /* every item has read h */
        if (q == 0)
            hs[j] = hj;
        barrier(CLK_LOCAL_MEM_FENCE);
#if SEQUENCES
        if (q == 0) {
            const uint at = s * STEPS + (FLIP ? STEPS - 1 - step : step);
#if MASKED && ZERO_MASKED
            r[MALINN_INDEX_R(j, at, h, w)] = keep ? hj : 0.0f;
#else
            r[MALINN_INDEX_R(j, at, h, w)] = hj;
#endif
        }
#endif
    }
#if !SEQUENCES
    if (q == 0)
        r[MALINN_INDEX_R(j, s, h, w)] = STATE ? cj : hj;
#endif
}
