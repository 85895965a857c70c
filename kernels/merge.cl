/* Element-wise merge layers of a Functional graph (Add, Subtract, Multiply, Average, Maximum,
 * Minimum) on tensors held as matrix views, in any layouts.
 *
 * A tensor of Keras shape (batch, d1, ..., dk) is the matrix view dk x (batch * d1 * ...): element
 * (row, col) is flat index col * dk + row in Keras's row-major order. The runtime prepends
 * MALINN_INDEX_A / _R for the layouts of the matrices passed. Shapes are compile-time parameters
 * (-D defines with the defaults below). OpenCL C 1.2.
 *
 *   merge   R = ACTIVATION(OP(R, A) / DIVISOR), in place on R (the merge's first operand, or its
 *           running result): OP is op_add, op_sub (R - A), op_rsub (A - R), op_mul, op_div (R / A),
 *           op_rdiv (A / R), op_max, op_min (a
 *           NaN operand gives NaN, as tf.maximum and tf.minimum; OpenCL's fmax and fmin would give
 *           the other) or op_copy (A); DIVISOR is the input count for Average on its last step (else 1.0f);
 *           ACTIVATION an act_<name> macro of activations.clh (prepended by the runtime), reading
 *           p0..p3: an Activation layer right after the merge, fused. BROADCAST=1 reads A
 *           with NumPy broadcasting: D1..D8 are R's sample axes (1 past its rank), S0..S8 A's
 *           strides in its own flat order (0 along an axis A has once). Only R's logical elements
 *           are touched, so its padding stays zero.
 */

#ifndef OP
#define OP op_add
#endif
#ifndef DIVISOR
#define DIVISOR 1.0f
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

#define op_add(x, y)  ((x) + (y))
#define op_sub(x, y)  ((x) - (y))
#define op_rsub(x, y) ((y) - (x))
#define op_mul(x, y)  ((x) * (y))
#define op_div(x, y)  ((x) / (y))
#define op_rdiv(x, y) ((y) / (x))
float merge_max(float x, float y) { return isnan(x) || isnan(y) ? x + y : fmax(x, y); }
float merge_min(float x, float y) { return isnan(x) || isnan(y) ? x + y : fmin(x, y); }
#define op_max(x, y)  merge_max((x), (y))
#define op_min(x, y)  merge_min((x), (y))
#define op_copy(x, y) (y)

/* one axis of R's flat index f (last axis first): its position times A's stride along it (the
 * remainder spelt out: no LLVM freeze, which Oclgrind cannot run) */
#define MALINN_AXIS(D, S) { const ulong q_ = f / (D); src += (f - q_ * (D)) * (ulong)(S); f = q_; }

__kernel void merge(uint m, uint n, uint h, uint w, uint M, uint H, uint W,
                    float p0, float p1, float p2, float p3,
                    __global float *r,
                    __global const float *a)
{
    const uint row = get_global_id(0);
    const uint col = get_global_id(1);
#if BROADCAST
    ulong f = (ulong)col * m + row;
    ulong src = 0;
    MALINN_AXIS(D8, S8) MALINN_AXIS(D7, S7) MALINN_AXIS(D6, S6) MALINN_AXIS(D5, S5)
    MALINN_AXIS(D4, S4) MALINN_AXIS(D3, S3) MALINN_AXIS(D2, S2) MALINN_AXIS(D1, S1)
    src += f * (ulong)S0;
    const ulong acol_ = src / M;
    const uint arow = (uint)(src - acol_ * M);
    const uint acol = (uint)acol_;
#else
    const uint arow = row;
    const uint acol = col;
#endif
    const size_t ix = MALINN_INDEX_R(row, col, h, w);
    const float v = OP(r[ix], a[MALINN_INDEX_A(arow, acol, H, W)]) / DIVISOR;
    r[ix] = ACTIVATION(v);
}
