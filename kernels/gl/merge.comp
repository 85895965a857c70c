/* An element-wise merge step in place on R (Add, Subtract, Multiply, Average, Maximum, Minimum of
 * a Functional graph), any layouts: the GLSL ES 3.10 twin of merge.cl (read it for the design).
 *   R = ACTIVATION(OP(R, A) / DIVISOR); OP is op_add, op_sub (R - A), op_rsub (A - R), op_mul,
 *   op_div (R / A), op_rdiv (A / R),
 *   op_max, op_min (a NaN operand gives NaN, as tf.maximum and tf.minimum) or op_copy (A);
 *   ACTIVATION an act_<name> of activations.glsl reading p0..p3. BROADCAST=1 reads A with NumPy
 *   broadcasting: D1..D8 are R's sample axes (1 past its rank), S0..S8 A's strides in its own
 *   flat order (0 along an axis A has once).
 * Only R's logical elements are touched (range m x n), so its padding stays zero. */

#ifndef OP
#define OP op_add
#endif
#ifndef DIVISOR
#define DIVISOR 1.0
#endif
#ifndef ACTIVATION
#define ACTIVATION act_linear
#endif
#ifndef BROADCAST
#define BROADCAST 0
#endif
#ifndef D1
#define D1 1
#endif
#ifndef D2
#define D2 1
#endif
#ifndef D3
#define D3 1
#endif
#ifndef D4
#define D4 1
#endif
#ifndef D5
#define D5 1
#endif
#ifndef D6
#define D6 1
#endif
#ifndef D7
#define D7 1
#endif
#ifndef D8
#define D8 1
#endif
#ifndef S0
#define S0 0
#endif
#ifndef S1
#define S1 0
#endif
#ifndef S2
#define S2 0
#endif
#ifndef S3
#define S3 0
#endif
#ifndef S4
#define S4 0
#endif
#ifndef S5
#define S5 0
#endif
#ifndef S6
#define S6 0
#endif
#ifndef S7
#define S7 0
#endif
#ifndef S8
#define S8 0
#endif

float malinn_fmax(float x, float y) { return (isnan(x) || isnan(y)) ? x + y : max(x, y); }
float malinn_fmin(float x, float y) { return (isnan(x) || isnan(y)) ? x + y : min(x, y); }
#define op_add(x, y)  ((x) + (y))
#define op_sub(x, y)  ((x) - (y))
#define op_rsub(x, y) ((y) - (x))
#define op_mul(x, y)  ((x) * (y))
#define op_div(x, y)  ((x) / (y))
#define op_rdiv(x, y) ((y) / (x))
#define op_max(x, y)  malinn_fmax((x), (y))
#define op_min(x, y)  malinn_fmin((x), (y))
#define op_copy(x, y) (y)

/* one axis of R's flat index f (last axis first): its position times A's stride along it */
#define MALINN_AXIS(D, S) { src += (f % uint(D)) * uint(S); f /= uint(D); }

MALINN_ARGS(uint m; uint n; uint h; uint w; uint M; uint H; uint W; float p0; float p1; float p2; float p3;)
layout(std430, binding = 0) buffer BufR { float r[]; };
layout(std430, binding = 1) readonly buffer BufA { float a[]; };

void main() {
    MALINN_GUARD
    uint row = MALINN_GLOBAL_X;
    uint col = MALINN_GLOBAL_Y;
#if BROADCAST
    uint f = col * m + row;
    uint src = 0u;
    MALINN_AXIS(D8, S8) MALINN_AXIS(D7, S7) MALINN_AXIS(D6, S6) MALINN_AXIS(D5, S5)
    MALINN_AXIS(D4, S4) MALINN_AXIS(D3, S3) MALINN_AXIS(D2, S2) MALINN_AXIS(D1, S1)
    src += f * uint(S0);
    uint arow = src % M;
    uint acol = src / M;
#else
    uint arow = row;
    uint acol = col;
#endif
    uint ix = MALINN_INDEX_R(row, col, h, w);
    float v = OP(r[ix], a[MALINN_INDEX_A(arow, acol, H, W)]) / DIVISOR;
    r[ix] = isnan(v) ? v : ACTIVATION(v);   /* NaN stays NaN, whatever the compiler folds */
}
