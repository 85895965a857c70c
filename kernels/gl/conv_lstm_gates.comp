/* One time step of ConvLSTM1D / ConvLSTM2D after its convolutions, one element per invocation,
 * any layouts for A, B and R: the GLSL ES 3.10 twin of conv_lstm_gates.cl (read it for the design).
 *   z_g = B[g * FILTERS + j, (s * STEPS + STEP) * PIXELS + p] + A[g * FILTERS + j, q]
 *         (A, this step's recurrent convolution, not read with FIRST=1; gates i, f, c, o)
 *   STATE 0: R = c = RACT(z_f) * c_prev + RACT(z_i) * ACT(z_c), c_prev the state in `scale`
 *            (zero with FIRST=1)
 *   STATE 1: R = h = RACT(z_o) * ACT(c), c this step's new state in `scale`
 * for R's element (row j, column q = s * PIXELS + p); the state in `scale` is column-major with LDS
 * padded rows; R's padding (row >= m or column >= n) is written as 0.
 * Defines: FILTERS (default 1), PIXELS (OH * OW, 1), STEPS (1), STATE (0), FIRST (0), ACT
 * (act_tanh), RACT (act_sigmoid): act_<name> macros of activations.glsl without parameters; STEP
 * (0) and LDS (1), which the OpenCL source takes as arguments, are defines here (each step of a
 * layer a program of its own). Arguments: m, n logical rows and columns of R; h, w padded rows and
 * columns of R, H, W of A, l, c of B. Buffers a, b, r, scale at bindings 0..3.
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
#ifndef STEP
#define STEP 0
#endif
#ifndef LDS
#define LDS 1
#endif

MALINN_ARGS(uint m; uint n; uint h; uint w; uint H; uint W; uint l; uint c;)
layout(std430, binding = 0) readonly buffer BufA { float a[]; };
layout(std430, binding = 1) readonly buffer BufB { float b[]; };
layout(std430, binding = 2) writeonly buffer BufR { float r[]; };
layout(std430, binding = 3) readonly buffer BufScale { float scale[]; };

/* gate g's sum of this element: the step's input convolution plus the recurrent one */
#if FIRST
#define GATE(g) b[MALINN_INDEX_B(uint((g) * (FILTERS)) + row, xcol, l, c)]
#else
#define GATE(g) (b[MALINN_INDEX_B(uint((g) * (FILTERS)) + row, xcol, l, c)] \
                 + a[MALINN_INDEX_A(uint((g) * (FILTERS)) + row, col, H, W)])
#endif

void main() {
    MALINN_GUARD
    uint row = MALINN_GLOBAL_X;
    uint col = MALINN_GLOBAL_Y;
    uint ix = MALINN_INDEX_R(row, col, h, w);
    if (row >= m || col >= n) {
        r[ix] = 0.0;
        return;
    }
    uint s = col / uint(PIXELS);
    uint xcol = (s * uint(STEPS) + uint(STEP)) * uint(PIXELS) + (col - s * uint(PIXELS));
#if STATE == 0
#if FIRST
    float prev = 0.0;
#else
    float prev = scale[col * uint(LDS) + row];
#endif
    float gi = RACT(GATE(0));
    float gf = RACT(GATE(1));
    float gc = ACT(GATE(2));
    r[ix] = gf * prev + gi * gc;
#else
    float go = RACT(GATE(3));
    float cell = scale[col * uint(LDS) + row];
    r[ix] = go * ACT(cell);
#endif
}
