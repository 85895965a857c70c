/* One time step of Keras's ConvLSTM1D / ConvLSTM2D after its convolutions: the gates of every
 * pixel, then the new cell state c or the new output h (two launches a step, one each).
 *
 * B holds the input convolution of every step, conv(x_t, kernel) + bias (one convolution over
 * batch * STEPS images before the steps): the matrix view of (batch, STEPS, OH, OW, 4 * FILTERS),
 * 4 * FILTERS rows in Keras's gate order i, f, c, o, column (s * STEPS + t) * PIXELS + p for
 * sample s, step t and output pixel p. A holds this step's recurrent convolution conv(h, U) (the
 * matrix view of (batch, OH, OW, 4 * FILTERS): column s * PIXELS + p), read unless FIRST=1 (the
 * first step: h is zero, so is A; A is then not bound). STEP is the step of B this launch reads
 * (an argument: every step of a layer runs one program). The buffer `scale` holds a cell state
 * (batch, OH, OW, FILTERS) in column-major order with LDS padded rows (bound by the plan to that
 * state's buffer; LDS an argument). Each work item computes one element (row j, column q) of R:
 *   z_g = B[g * FILTERS + j, (s * STEPS + STEP) * PIXELS + p] + A[g * FILTERS + j, q]
 *   STATE 0: R = c = RACT(z_f) * c_prev + RACT(z_i) * ACT(z_c), c_prev the state in `scale`
 *            (zero with FIRST=1)
 *   STATE 1: R = h = RACT(z_o) * ACT(c), c this step's new state in `scale`
 * as Keras's ConvLSTMCell computes them. R's padding (row >= m or column >= n) is written as 0.
 * ACT and RACT are act_<name> macros of activations.clh without parameters.
 * The runtime prepends MALINN_INDEX_A / _B / _R; H, W, l, c and h, w are A's, B's and R's padded
 * shapes, m and n R's logical ones. OpenCL C 1.2.
 *
 * Defines: FILTERS, PIXELS (OH * OW), STEPS, STATE (0 or 1), FIRST (0 or 1), ACT, RACT.
 * Arguments after the buffers (the library's "argdefines"): STEP, LDS.
 */

#ifndef FILTERS
#define FILTERS 1
#endif
#ifndef PIXELS
#define PIXELS 1
#endif
#ifndef STEPS
#define STEPS 1
#endif
#ifndef STATE
#define STATE 0
#endif
#ifndef FIRST
#define FIRST 0
#endif
#ifndef ACT
#define ACT act_tanh
#endif
#ifndef RACT
#define RACT act_sigmoid
#endif

/* gate g's sum of this element: the step's input convolution plus the recurrent one */
#if FIRST
#define GATE(g) b[MALINN_INDEX_B((g) * FILTERS + row, xcol, l, c)]
#else
#define GATE(g) (b[MALINN_INDEX_B((g) * FILTERS + row, xcol, l, c)] + a[MALINN_INDEX_A((g) * FILTERS + row, col, H, W)])
#endif

__kernel void conv_lstm_gates(uint m, uint n, uint h, uint w, uint H, uint W, uint l, uint c,
                              __global const float *a,
                              __global const float *b,
                              __global float *r,
                              __global const float *scale,
                              uint STEP, uint LDS)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
    const size_t ix = MALINN_INDEX_R(row, col, h, w);
    if (row >= m || col >= n) {
        r[ix] = 0.0f;
        return;
    }
    const uint s = col / PIXELS;
    const uint xcol = (s * STEPS + STEP) * PIXELS + (col - s * PIXELS);
#if STATE == 0
#if FIRST
    const float prev = 0.0f;
#else
    const float prev = scale[(size_t)col * LDS + row];
#endif
    const float gi = RACT(GATE(0));
    const float gf = RACT(GATE(1));
    const float gc = ACT(GATE(2));
    r[ix] = gf * prev + gi * gc;
#else
    const float go = RACT(GATE(3));
    const float cell = scale[(size_t)col * LDS + row];
    r[ix] = go * ACT(cell);
#endif
}
