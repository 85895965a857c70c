/* Keras's SimpleRNN, LSTM and GRU recurrences, every time step of one layer in one launch: the
 * GLSL ES 3.10 twin of recurrent.cl (read it for the design), from the same library entries
 * (recurrent, recurrent_masked) and defines.
 *   B: the input projection of every step, GATES * UNITS rows, column s * STEPS + t for sample s
 *   and step t. One work-group of UNITS x KS invocations per sample: the state h stays in shared
 *   memory; each step computes, in Keras's gate order,
 *   CELL 0 SimpleRNN:  h = ACT(x + h U)
 *   CELL 1 LSTM (default):  i, f, o = RACT(x_i + h U_i, ...), c = f c + i ACT(x_c + h U_c),
 *                      h = o ACT(c)
 *   CELL 2 GRU (reset_after):  z, r = RACT(x_z + h U_z + b_z, ...), h~ = ACT(x_h + r (h U_h + b_h)),
 *                      h = z h + (1 - z) h~ (b: the recurrent bias, buffer `shift`, RBIAS=1)
 *   CELL 3 GRU (reset before): as 2 without the recurrent bias, h~ = ACT(x_h + (r h) U_h)
 *   U, the recurrent kernel (UNITS x GATES * UNITS floats, row-major), is the buffer `scale`.
 * Defines (defaults): UNITS (1), STEPS (1), OUT_STEPS (1: STEPS with SEQUENCES, else 1), CELL (1),
 * ACT (act_tanh), RACT (act_sigmoid: act_<name> macros of activations.glsl without parameters),
 * BACKWARDS (0: 1 runs the steps from the last), SEQUENCES (0: R holds every step's h in the order
 * the steps run, else the last h, or the last c with STATE (0) = 1), MASKED (0: 1 reads A, the
 * (batch, STEPS) mask, STEPS rows and a column per sample, 0 = masked: a masked step keeps the
 * state and outputs the previous output, or zero with ZERO_MASKED (0) = 1), RBIAS (0), FLIP (0:
 * 1 writes step k of the sequence at column s * STEPS + STEPS - 1 - k), KS (1: each unit's
 * recurrent sums split over KS invocations, each keeping its rows of U in registers, adding
 * into shared memory; CELL 3 runs with KS 1). Shared memory: 4 * UNITS * (1 + (CELL == 3) +
 * (KS > 1) * KS * GATES) bytes. R's padding is written as 0. Every barrier stands in main()
 * outside any branch (GLSL ES 3.10 allows no other). */

/* NVIDIA's GLSL compiler unrolls every constant-bound loop under the preamble's #pragma
 * optionNV(unroll all): the loops over the steps and the units stay loops */
#pragma optionNV(unroll none)

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
/* the rows of U each of a unit's KS invocations holds */
#define KCH ((UNITS + KS - 1) / KS)

#if MASKED
MALINN_ARGS(uint m; uint n; uint h; uint w; uint l; uint c; uint M; uint H; uint W;)
layout(std430, binding = 0) readonly buffer BufA { float a[]; };
layout(std430, binding = 1) readonly buffer BufB { float b[]; };
layout(std430, binding = 2) buffer BufR { float r[]; };
layout(std430, binding = 3) readonly buffer BufScale { float scale[]; };
layout(std430, binding = 4) readonly buffer BufShift { float shift[]; };
#else
MALINN_ARGS(uint m; uint n; uint h; uint w; uint l; uint c;)
layout(std430, binding = 0) readonly buffer BufB { float b[]; };
layout(std430, binding = 1) buffer BufR { float r[]; };
layout(std430, binding = 2) readonly buffer BufScale { float scale[]; };
layout(std430, binding = 3) readonly buffer BufShift { float shift[]; };
#endif

shared float hs[UNITS];
#if CELL == 3
shared float rh[UNITS];
#endif
#if KS > 1
shared float part[KS * HGATES * UNITS];
#endif

void main() {
    MALINN_GROUP_GUARD   /* a folded dispatch's extra work-groups (GLDevice.bind) */
    uint j = gl_LocalInvocationID.x;
    uint q = gl_LocalInvocationID.y;
    uint s = MALINN_GROUP_Y;
#if KS > 1
    float u[KCH * HGATES];                           /* this invocation's rows of U, read once */
    for (uint kk = 0u; kk < uint(KCH); ++kk) {
        uint k = q * uint(KCH) + kk;
        for (uint g = 0u; g < uint(HGATES); ++g)
            u[kk * uint(HGATES) + g] = k < uint(UNITS) ? scale[k * uint(GU) + g * uint(UNITS) + j] : 0.0;
    }
#endif
    if (q == 0u) {
        for (uint t = 0u; t < uint(OUT_STEPS); ++t)  /* R's padding rows of this sample's columns */
            for (uint row = m + j; row < h; row += uint(UNITS))
                r[MALINN_INDEX_R(row, s * uint(OUT_STEPS) + t, h, w)] = 0.0;
        if (s == 0u)                                 /* R's padding columns */
            for (uint col = n; col < w; ++col)
                for (uint row = j; row < h; row += uint(UNITS))
                    r[MALINN_INDEX_R(row, col, h, w)] = 0.0;
        hs[j] = 0.0;
    }
    float hj = 0.0, cj = 0.0;
    barrier();
    for (uint step = 0u; step < uint(STEPS); ++step) {
        uint t = BACKWARDS != 0 ? uint(STEPS) - 1u - step : step;
        uint col = s * uint(STEPS) + t;
#if KS > 1
        {
            float p[HGATES];
            for (uint g = 0u; g < uint(HGATES); ++g)
                p[g] = 0.0;
            for (uint kk = 0u; kk < uint(KCH); ++kk) {
                uint k = q * uint(KCH) + kk;
                float hk = k < uint(UNITS) ? hs[k] : 0.0;
                for (uint g = 0u; g < uint(HGATES); ++g)
                    p[g] += u[kk * uint(HGATES) + g] * hk;
            }
            for (uint g = 0u; g < uint(HGATES); ++g)
                part[(q * uint(HGATES) + g) * uint(UNITS) + j] = p[g];
        }
        barrier();                                   /* every invocation's partial sums are in */
#endif
        float nh = hj, nc = cj;
        float acc[GATES], x[GATES];
        bool keep = true;
        if (q == 0u) {
            for (uint g = 0u; g < uint(GATES); ++g) {
                x[g] = b[MALINN_INDEX_B(g * uint(UNITS) + j, col, l, c)];
                acc[g] = RBIAS != 0 ? shift[g * uint(UNITS) + j] : 0.0;
            }
#if KS > 1
            for (uint qq = 0u; qq < uint(KS); ++qq)
                for (uint g = 0u; g < uint(HGATES); ++g)
                    acc[g] += part[(qq * uint(HGATES) + g) * uint(UNITS) + j];
#else
            for (uint k = 0u; k < uint(UNITS); ++k) {
                float hk = hs[k];
                uint uk = k * uint(GU) + j;
                for (uint g = 0u; g < uint(HGATES); ++g)
                    acc[g] += scale[uk + g * uint(UNITS)] * hk;
            }
#endif
#if CELL == 0
            nh = ACT(x[0] + acc[0]);
#elif CELL == 1
            float gi = RACT(x[0] + acc[0]);
            float gf = RACT(x[1] + acc[1]);
            float gc = ACT(x[2] + acc[2]);
            float go = RACT(x[3] + acc[3]);
            nc = gf * cj + gi * gc;
            nh = go * ACT(nc);
#elif CELL == 2
            float gz = RACT(x[0] + acc[0]);
            float gr = RACT(x[1] + acc[1]);
            float gh = ACT(x[2] + gr * acc[2]);
            nh = gz * hj + (1.0 - gz) * gh;
#else
            rh[j] = RACT(x[1] + acc[1]) * hj;
#endif
        }
#if CELL == 3   /* KS is 1: q is 0 in every invocation, and r h is complete after the barrier */
        barrier();
        {
            float gz = RACT(x[0] + acc[0]);
            float ah = 0.0;
            for (uint k = 0u; k < uint(UNITS); ++k)
                ah += scale[k * uint(GU) + 2u * uint(UNITS) + j] * rh[k];
            float gh = ACT(x[2] + ah);
            nh = gz * hj + (1.0 - gz) * gh;
        }
#endif
#if MASKED
        if (q == 0u) {
            keep = a[MALINN_INDEX_A(t, s, H, W)] != 0.0;
            if (!keep) {
                nh = hj;
                nc = cj;
            }
        }
#endif
        hj = nh;
        cj = nc;
        barrier();                                   /* every invocation has read h */
        if (q == 0u)
            hs[j] = hj;
        barrier();
#if SEQUENCES
        if (q == 0u) {
            uint at = s * uint(STEPS) + (FLIP != 0 ? uint(STEPS) - 1u - step : step);
#if MASKED && ZERO_MASKED
            r[MALINN_INDEX_R(j, at, h, w)] = keep ? hj : 0.0;
#else
            r[MALINN_INDEX_R(j, at, h, w)] = hj;
#endif
        }
#endif
    }
#if !SEQUENCES
    if (q == 0u)
        r[MALINN_INDEX_R(j, s, h, w)] = STATE != 0 ? cj : hj;
#endif
}
